//! The computation-graph model: values (tensors with shapes and dtypes) and the ops that
//! make them, in forward (program) order, with what each op keeps for its backward.
//!
//! The model follows PyTorch eager autograd closely enough that memory behaves alike:
//! - every op output that is not an in-place alias owns fresh memory;
//! - an op lists the values its backward needs (`saved`): those stay live until then;
//! - an op lists its differentiable inputs; its backward makes one gradient per such
//!   input that requires grad, unless the gradient can pass through (`grad_passthrough`:
//!   `a + b` hands the output gradient itself to both inputs, no allocation).
//!
//! Invariants (checked by [`Graph::check_invariants`]):
//! - `values[v].storage <= v` and `values[values[v].storage].storage == values[v].storage`
//!   (storage roots own memory; in-place results alias an earlier root);
//! - every op only reads values defined before it (program order is a topological order);
//! - `op.saved ⊆ op.inputs ∪ op.outputs`, `op.diff_inputs ⊆ op.inputs`.

use serde::{Deserialize, Serialize};

use crate::error::TraceError;

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;
/// Index of an op in [`Graph::ops`].
pub type OpId = usize;

/// Element types. Sizes are PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    BF16,
    I64,
    /// `torch.bool` (dropout masks): one byte per element.
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }
}

/// What a value is, which decides where its memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A trainable parameter (fp32 master weight): a static block, requires grad.
    Param,
    /// A non-trainable module buffer (BatchNorm running stats): a static block.
    Buffer,
    /// Data fed in per iteration (images, token ids, labels): allocated at its start.
    Input,
    /// Made by an op.
    Activation,
    /// Bound from outside the graph by the expansion (a KV cache from an earlier call).
    External,
}

/// One tensor value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Value {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub role: Role,
    /// The value whose memory this one uses. Invariant: `storage <= own index`; equal
    /// for values that own memory, earlier for in-place results.
    pub storage: ValueId,
    /// Whether autograd tracks a gradient for it.
    pub requires_grad: bool,
    /// The op that made it (`None` for params, buffers, inputs, externals).
    pub producer: Option<OpId>,
}

impl Value {
    /// Number of elements: the product of the shape (1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Requested bytes: `numel * dtype.size()`.
    pub fn bytes(&self) -> u64 {
        self.numel() * self.dtype.size()
    }
}

/// The execution unit an op's FLOPs run on, for the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Unit {
    /// Memory-bound elementwise / reduction work (FLOPs ignored, bytes count).
    #[default]
    Vector,
    /// A matmul on tensor cores in this dtype (`tf32` for fp32 cuDNN convolutions).
    Matmul { dtype: DType, tf32: bool },
}

/// One op: what it reads, makes, keeps for backward and costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Dotted name, e.g. `layer3.0.conv2`.
    pub name: String,
    pub inputs: Vec<ValueId>,
    /// Values it defines (owning fresh memory, or aliasing an input when in place).
    pub outputs: Vec<ValueId>,
    /// Values the backward reads. Invariant: `saved ⊆ inputs ∪ outputs`.
    pub saved: Vec<ValueId>,
    /// Inputs the backward makes a gradient for (only those that require grad).
    pub diff_inputs: Vec<ValueId>,
    /// The gradient of each diff input is the gradient of `outputs[0]` itself when they
    /// have the same dtype and size (additions, in-place additions).
    pub grad_passthrough: bool,
    /// Values updated in place that are not outputs (BatchNorm running statistics).
    pub extra_writes: Vec<ValueId>,
    /// Values kept referenced (not accessed) until this op has run: a Python variable
    /// that outlives its last use, e.g. a function argument until the function returns.
    pub keeps: Vec<ValueId>,
    /// A dtype conversion: its backward makes the input's gradient directly in the
    /// input's dtype. Other ops whose input dtype differs from the output's compute the
    /// gradient in the output dtype first and autograd then casts it (two allocations).
    pub is_cast: bool,
    pub unit: Unit,
    pub fwd_flops: f64,
    pub bwd_flops: f64,
    /// Scratch bytes allocated and freed inside the forward kernel (cuDNN workspace).
    pub fwd_temps: Vec<u64>,
    /// Scratch bytes allocated before the backward's gradients and freed after them.
    pub bwd_temps: Vec<u64>,
}

/// A forward graph in program order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub values: Vec<Value>,
    pub ops: Vec<Op>,
    /// The scalar the backward starts from (training graphs).
    pub loss: Option<ValueId>,
    /// Values the caller keeps until the end of the iteration (model outputs that the
    /// training loop holds a Python reference to, e.g. logits and returned KV pairs).
    pub held: Vec<ValueId>,
}

impl Graph {
    /// Values with the given role, in definition order.
    pub fn with_role(&self, role: Role) -> impl Iterator<Item = ValueId> + '_ {
        self.values
            .iter()
            .enumerate()
            .filter(move |(_, v)| v.role == role)
            .map(|(i, _)| i)
    }

    /// Total bytes of the values with the given role.
    pub fn role_bytes(&self, role: Role) -> u64 {
        self.with_role(role).map(|v| self.values[v].bytes()).sum()
    }

    /// Checks the invariants in the module docs.
    pub fn check_invariants(&self) -> Result<(), TraceError> {
        let bad = |what: String| Err(TraceError::Param(format!("graph: {what}")));
        for (i, v) in self.values.iter().enumerate() {
            if v.storage > i || self.values[v.storage].storage != v.storage {
                return bad(format!("value {} has a bad storage link", v.name));
            }
        }
        let mut defined = vec![false; self.values.len()];
        for (i, v) in self.values.iter().enumerate() {
            defined[i] = v.producer.is_none();
        }
        for op in &self.ops {
            for &x in &op.inputs {
                if x >= self.values.len() || !defined[x] {
                    return bad(format!("op {} reads a value not yet defined", op.name));
                }
            }
            for &x in &op.outputs {
                defined[x] = true;
            }
            if op
                .saved
                .iter()
                .any(|s| !op.inputs.contains(s) && !op.outputs.contains(s))
            {
                return bad(format!("op {} saves a value it does not touch", op.name));
            }
            if op.diff_inputs.iter().any(|d| !op.inputs.contains(d)) {
                return bad(format!("op {} differentiates a non-input", op.name));
            }
        }
        if let Some(l) = self.loss {
            if l >= self.values.len() {
                return bad("loss out of range".into());
            }
        }
        Ok(())
    }
}

/// Builds a [`Graph`] op by op. The op library in `ops.rs` is written on top of it.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    pub(crate) g: Graph,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn leaf(&mut self, name: &str, shape: &[u64], dtype: DType, role: Role, rg: bool) -> ValueId {
        let id = self.g.values.len();
        self.g.values.push(Value {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            role,
            storage: id,
            requires_grad: rg,
            producer: None,
        });
        id
    }

    /// A trainable parameter (requires grad).
    pub fn param(&mut self, name: &str, shape: &[u64], dtype: DType) -> ValueId {
        self.leaf(name, shape, dtype, Role::Param, true)
    }

    /// A module buffer (no grad), e.g. BatchNorm running mean.
    pub fn buffer(&mut self, name: &str, shape: &[u64], dtype: DType) -> ValueId {
        self.leaf(name, shape, dtype, Role::Buffer, false)
    }

    /// Per-iteration input data (no grad).
    pub fn input(&mut self, name: &str, shape: &[u64], dtype: DType) -> ValueId {
        self.leaf(name, shape, dtype, Role::Input, false)
    }

    /// A value bound from outside by the expansion (no grad).
    pub fn external(&mut self, name: &str, shape: &[u64], dtype: DType) -> ValueId {
        self.leaf(name, shape, dtype, Role::External, false)
    }

    pub fn value(&self, v: ValueId) -> &Value {
        &self.g.values[v]
    }

    /// Adds an op. `outs` are fresh outputs `(name suffix, shape, dtype)`; `inplace` makes
    /// one more output aliasing that input's storage (listed first). `saved_out` indexes
    /// into the op's outputs (in-place alias first). Returns the outputs.
    #[allow(clippy::too_many_arguments)]
    pub fn op(
        &mut self,
        name: &str,
        inputs: &[ValueId],
        inplace: Option<ValueId>,
        outs: &[(&str, Vec<u64>, DType)],
        spec: OpSpec,
    ) -> Vec<ValueId> {
        let op_id = self.g.ops.len();
        let rg = spec
            .diff_inputs
            .iter()
            .any(|&d| self.g.values[d].requires_grad);
        let mut outputs = Vec::new();
        if let Some(x) = inplace {
            let id = self.g.values.len();
            let base = self.g.values[x].clone();
            self.g.values.push(Value {
                name: format!("{name}.out"),
                storage: base.storage,
                requires_grad: rg || base.requires_grad,
                producer: Some(op_id),
                role: Role::Activation,
                ..base
            });
            outputs.push(id);
        }
        for (suffix, shape, dtype) in outs {
            let id = self.g.values.len();
            self.g.values.push(Value {
                name: format!("{name}.{suffix}"),
                shape: shape.clone(),
                dtype: *dtype,
                role: Role::Activation,
                storage: id,
                requires_grad: rg,
                producer: Some(op_id),
            });
            outputs.push(id);
        }
        let mut saved: Vec<ValueId> = spec.saved_in.iter().map(|&i| inputs[i]).collect();
        saved.extend(spec.saved_out.iter().map(|&i| outputs[i]));
        let diff_inputs = spec
            .diff_inputs
            .iter()
            .copied()
            .filter(|&d| self.g.values[d].requires_grad)
            .collect();
        self.g.ops.push(Op {
            name: name.to_string(),
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
            saved,
            diff_inputs,
            grad_passthrough: spec.passthrough,
            extra_writes: spec.extra_writes,
            keeps: spec.keeps,
            is_cast: spec.is_cast,
            unit: spec.unit,
            fwd_flops: spec.fwd_flops,
            bwd_flops: spec.bwd_flops,
            fwd_temps: spec.fwd_temps,
            bwd_temps: spec.bwd_temps,
        });
        outputs
    }

    /// Marks the loss and returns the finished graph.
    pub fn finish(mut self, loss: Option<ValueId>) -> Graph {
        self.g.loss = loss;
        self.g
    }

    /// Keeps `v` live until the end of the iteration.
    pub fn hold(&mut self, v: ValueId) {
        self.g.held.push(v);
    }
}

/// The parts of an op that are not its values (see [`GraphBuilder::op`]).
#[derive(Debug, Clone, Default)]
pub struct OpSpec {
    /// Indices into the op's inputs that its backward reads.
    pub saved_in: Vec<usize>,
    /// Indices into the op's outputs that its backward reads.
    pub saved_out: Vec<usize>,
    /// Inputs (value ids) the backward differentiates.
    pub diff_inputs: Vec<ValueId>,
    pub passthrough: bool,
    pub extra_writes: Vec<ValueId>,
    pub keeps: Vec<ValueId>,
    pub is_cast: bool,
    pub unit: Unit,
    pub fwd_flops: f64,
    pub bwd_flops: f64,
    pub fwd_temps: Vec<u64>,
    pub bwd_temps: Vec<u64>,
}
