//! The op library: PyTorch layers as graph ops, with PyTorch's memory behaviour.
//!
//! Each helper records what the real kernel allocates (outputs, side outputs such as
//! BatchNorm's saved statistics or dropout masks, cuDNN workspaces), what autograd saves
//! for the backward, and its FLOPs. Autocast (`Net::autocast = Some(BF16)`) follows
//! `torch.autocast("cuda", torch.bfloat16)`: matmuls and convolutions cast their inputs to
//! bf16 (weight casts of parameters are cached for the forward, as PyTorch does),
//! layer norm, `pow`, softmax and losses run in fp32, elementwise ops promote.

use std::collections::HashMap;

use super::graph::{DType, GraphBuilder, OpSpec, Role, Unit, ValueId};

/// A graph under construction plus the execution settings that change its ops.
#[derive(Debug)]
pub struct Net {
    pub b: GraphBuilder,
    /// `Some(BF16)` under bf16 autocast; parameters stay fp32 (master weights).
    pub autocast: Option<DType>,
    /// Training mode: dropout active, BatchNorm uses batch statistics, ops save for backward.
    pub train: bool,
    /// Autocast's weight-cast cache: parameter -> its low-precision copy.
    cast_cache: HashMap<ValueId, ValueId>,
}

/// Type promotion for a binary elementwise op (PyTorch's rules for the dtypes used here).
fn promote(a: DType, b: DType) -> DType {
    if a == DType::F32 || b == DType::F32 {
        DType::F32
    } else {
        a
    }
}

impl Net {
    pub fn new(autocast: Option<DType>, train: bool) -> Self {
        Net {
            b: GraphBuilder::new(),
            autocast,
            train,
            cast_cache: HashMap::new(),
        }
    }

    pub(super) fn shape(&self, v: ValueId) -> Vec<u64> {
        self.b.value(v).shape.clone()
    }
    pub(super) fn dtype(&self, v: ValueId) -> DType {
        self.b.value(v).dtype
    }
    pub(super) fn numel(&self, v: ValueId) -> f64 {
        self.b.value(v).numel() as f64
    }

    /// Keeps `vals` referenced until the most recent op has run (Python variables that
    /// outlive their last use, e.g. until a module's `forward` returns).
    pub fn keep_until_last(&mut self, vals: &[ValueId]) {
        if let Some(op) = self.b.g.ops.last_mut() {
            op.keeps.extend_from_slice(vals);
        }
    }

    /// `x.to(dtype)`: a copy whose backward casts the gradient back (an allocation).
    pub fn cast(&mut self, name: &str, x: ValueId, to: DType) -> ValueId {
        if self.dtype(x) == to {
            return x;
        }
        let shape = self.shape(x);
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, to)],
            OpSpec {
                diff_inputs: vec![x],
                is_cast: true,
                ..Default::default()
            },
        )[0]
    }

    /// The operand of a matmul/convolution under autocast: cast to the autocast dtype,
    /// once per forward for parameters (autocast's cache), every time for activations.
    pub fn mm_operand(&mut self, name: &str, x: ValueId) -> ValueId {
        let Some(to) = self.autocast else { return x };
        if self.dtype(x) == to {
            return x;
        }
        if self.b.value(x).role == Role::Param {
            if let Some(&c) = self.cast_cache.get(&x) {
                return c;
            }
            let pname = format!("{}.to_bf16", self.b.value(x).name);
            let c = self.cast(&pname, x, to);
            self.cast_cache.insert(x, c);
            return c;
        }
        self.cast(&format!("{name}.in_to_bf16"), x, to)
    }

    /// The input of an fp32-only op under autocast (layer norm, pow, softmax).
    pub(super) fn fp32_operand(&mut self, name: &str, x: ValueId) -> ValueId {
        if self.autocast.is_some() && self.dtype(x) != DType::F32 {
            self.cast(&format!("{name}.in_to_f32"), x, DType::F32)
        } else {
            x
        }
    }

    /// `nn.Linear(k, n)` (or HF `Conv1D`) on `x[..., k]`: `[..., n]`.
    pub fn linear(&mut self, name: &str, x: ValueId, n: u64, bias: bool) -> ValueId {
        let k = *self.shape(x).last().unwrap_or(&1);
        let w = self.b.param(&format!("{name}.weight"), &[n, k], DType::F32);
        let bv = bias.then(|| self.b.param(&format!("{name}.bias"), &[n], DType::F32));
        self.linear_with(name, x, w, bv)
    }

    /// A linear layer with given weight `[n, k]` (tied weights) and optional bias.
    pub fn linear_with(
        &mut self,
        name: &str,
        x: ValueId,
        w: ValueId,
        bias: Option<ValueId>,
    ) -> ValueId {
        let n = self.b.value(w).shape[0];
        let xc = self.mm_operand(name, x);
        let wc = self.mm_operand(name, w);
        let bc = bias.map(|b| self.mm_operand(name, b));
        let mut shape = self.shape(xc);
        let k = shape.pop().unwrap_or(1);
        let m: u64 = shape.iter().product();
        shape.push(n);
        let dt = self.dtype(xc);
        let mut inputs = vec![xc, wc];
        inputs.extend(bc);
        let flops = 2.0 * (m * n * k) as f64;
        // The bias gradient `grad.sum(0)` over many rows runs as a global-memory
        // reduction: a staging buffer and 4-byte semaphores per 128 columns. Sizes fitted
        // to the real BERT and GPT-2 traces (8*m*n bytes, capped at 132 MiB; they show
        // these for m = 4096 and 8192 rows and not for ResNet's 64-row classifier).
        let bwd_temps = if bias.is_some() && m >= 1024 {
            vec![(8 * m * n).min(132 << 20), 4 * n.div_ceil(128)]
        } else {
            Vec::new()
        };
        self.b.op(
            name,
            &inputs,
            None,
            &[("out", shape, dt)],
            OpSpec {
                saved_in: vec![0, 1],
                diff_inputs: inputs.clone(),
                unit: Unit::Matmul {
                    dtype: dt,
                    tf32: false,
                },
                fwd_flops: flops,
                bwd_flops: 2.0 * flops,
                bwd_temps,
                ..Default::default()
            },
        )[0]
    }

    /// `nn.Conv2d(cin, cout, k, stride, padding=k/2, bias=False)` on NCHW `x`, with the
    /// cuDNN workspaces seen in the real ResNet-50 trace.
    pub fn conv2d(&mut self, name: &str, x: ValueId, cout: u64, k: u64, stride: u64) -> ValueId {
        self.conv2d_ex(name, x, cout, k, stride, 1, false, true)
    }

    /// `nn.Conv2d` with `groups` (depthwise when `groups == cin`), an optional bias, and
    /// with or without cuDNN workspaces (the real MobileNetV3 trace shows none).
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_ex(
        &mut self,
        name: &str,
        x: ValueId,
        cout: u64,
        k: u64,
        stride: u64,
        groups: u64,
        bias: bool,
        workspace: bool,
    ) -> ValueId {
        let s = self.shape(x);
        let (n, cin, h, w) = (s[0], s[1], s[2], s[3]);
        let groups = groups.max(1);
        let wt = self.b.param(
            &format!("{name}.weight"),
            &[cout, cin / groups, k, k],
            DType::F32,
        );
        let bv = bias.then(|| self.b.param(&format!("{name}.bias"), &[cout], DType::F32));
        let xc = self.mm_operand(name, x);
        let wc = self.mm_operand(name, wt);
        let bc = bv.map(|b| self.mm_operand(name, b));
        let pad = k / 2;
        let ho = (h + 2 * pad - k) / stride + 1;
        let wo = (w + 2 * pad - k) / stride + 1;
        let dt = self.dtype(xc);
        let in_bytes = n * cin * h * w * dt.size();
        // cuDNN workspaces, as seen in the real ResNet-50 trace: 1x1 convolutions take a
        // 400-byte scratch buffer forward and 4 MiB backward; 3x3 ones about twice the
        // input plus the weight (there: 2 * in + w + 147 bytes, forward and data-grad).
        // The real sizes depend on the algorithm cuDNN picks; this is the common case.
        let w_bytes = cout * (cin / groups) * k * k * dt.size();
        let (fwd_temps, bwd_temps) = match (workspace, k) {
            (false, _) => (vec![], vec![]),
            (true, 1) => (vec![400], vec![4 << 20]),
            (true, _) => (vec![2 * in_bytes + w_bytes], vec![2 * in_bytes + w_bytes]),
        };
        let flops = 2.0 * (n * cout * ho * wo * (cin / groups) * k * k) as f64;
        let mut inputs = vec![xc, wc];
        inputs.extend(bc);
        self.b.op(
            name,
            &inputs,
            None,
            &[("out", vec![n, cout, ho, wo], dt)],
            OpSpec {
                saved_in: vec![0, 1],
                diff_inputs: inputs.clone(),
                unit: Unit::Matmul {
                    dtype: dt,
                    tf32: dt == DType::F32,
                },
                fwd_flops: flops,
                bwd_flops: 2.0 * flops,
                fwd_temps,
                bwd_temps,
                ..Default::default()
            },
        )[0]
    }

    /// `nn.BatchNorm2d(c)` on NCHW `x`; training mode uses batch statistics and updates
    /// the running ones in place.
    pub fn batchnorm(&mut self, name: &str, x: ValueId) -> ValueId {
        let s = self.shape(x);
        let c = s[1];
        let gamma = self.b.param(&format!("{name}.weight"), &[c], DType::F32);
        let beta = self.b.param(&format!("{name}.bias"), &[c], DType::F32);
        let rm = self
            .b
            .buffer(&format!("{name}.running_mean"), &[c], DType::F32);
        let rv = self
            .b
            .buffer(&format!("{name}.running_var"), &[c], DType::F32);
        let nbt = self
            .b
            .buffer(&format!("{name}.num_batches_tracked"), &[], DType::I64);
        let dt = self.dtype(x);
        let inputs = [x, gamma, beta, rm, rv];
        if !self.train {
            return self
                .b
                .op(name, &inputs, None, &[("out", s, dt)], OpSpec::default())[0];
        }
        self.b.op(
            name,
            &inputs,
            None,
            &[
                ("out", s, dt),
                ("save_mean", vec![c], DType::F32),
                ("save_invstd", vec![c], DType::F32),
            ],
            OpSpec {
                saved_in: vec![0, 1],
                saved_out: vec![1, 2],
                diff_inputs: vec![x, gamma, beta],
                extra_writes: vec![rm, rv, nbt],
                ..Default::default()
            },
        )[0]
    }

    /// `relu(x, inplace=True)`: writes `x`'s memory; backward reads the result.
    pub fn relu_(&mut self, name: &str, x: ValueId) -> ValueId {
        self.b.op(
            name,
            &[x],
            Some(x),
            &[],
            OpSpec {
                saved_out: vec![0],
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// `relu(x)` out of place (`nn.ReLU()`): backward reads the result.
    pub fn relu(&mut self, name: &str, x: ValueId) -> ValueId {
        let (shape, dt) = (self.shape(x), self.dtype(x));
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, dt)],
            OpSpec {
                saved_out: vec![0],
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// An elementwise activation out of place that saves its input (`hardswish`,
    /// `hardsigmoid`; torchvision's in-place hardswish saves a copy of its input, which
    /// costs the same memory).
    pub fn activation(&mut self, name: &str, x: ValueId) -> ValueId {
        let (shape, dt) = (self.shape(x), self.dtype(x));
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, dt)],
            OpSpec {
                saved_in: vec![0],
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// `a += b` in place: the output gradient passes to both.
    pub fn add_(&mut self, name: &str, a: ValueId, b: ValueId) -> ValueId {
        self.b.op(
            name,
            &[a, b],
            Some(a),
            &[],
            OpSpec {
                diff_inputs: vec![a, b],
                passthrough: true,
                ..Default::default()
            },
        )[0]
    }

    /// `a + b` (b may broadcast): promotes dtypes; gradients pass through where they can.
    pub fn add(&mut self, name: &str, a: ValueId, b: ValueId) -> ValueId {
        let dt = promote(self.dtype(a), self.dtype(b));
        let shape = self.shape(a);
        self.b.op(
            name,
            &[a, b],
            None,
            &[("out", shape, dt)],
            OpSpec {
                diff_inputs: vec![a, b],
                passthrough: true,
                ..Default::default()
            },
        )[0]
    }

    /// `a * b` of two tensors (`b` may broadcast): saves both for the backward, whose
    /// gradient for a broadcast `b` is `(grad * a)` at full size, then summed.
    pub fn mul(&mut self, name: &str, a: ValueId, b: ValueId) -> ValueId {
        let dt = promote(self.dtype(a), self.dtype(b));
        let shape = self.shape(a);
        let bwd_temps = if self.numel(b) < self.numel(a) {
            vec![self.b.value(a).numel() * dt.size()]
        } else {
            vec![]
        };
        self.b.op(
            name,
            &[a, b],
            None,
            &[("out", shape, dt)],
            OpSpec {
                saved_in: vec![0, 1],
                diff_inputs: vec![a, b],
                bwd_temps,
                ..Default::default()
            },
        )[0]
    }

    /// `c * x` for a Python scalar `c`: saves nothing, backward allocates `c * grad`.
    pub fn scale(&mut self, name: &str, x: ValueId) -> ValueId {
        let (shape, dt) = (self.shape(x), self.dtype(x));
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, dt)],
            OpSpec {
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// `c + x` for a Python scalar: the gradient passes through.
    pub fn add_scalar(&mut self, name: &str, x: ValueId) -> ValueId {
        let (shape, dt) = (self.shape(x), self.dtype(x));
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, dt)],
            OpSpec {
                diff_inputs: vec![x],
                passthrough: true,
                ..Default::default()
            },
        )[0]
    }

    /// `x.contiguous()` of a non-contiguous view: a copy; the gradient passes through.
    pub fn copy(&mut self, name: &str, x: ValueId, shape: Vec<u64>) -> ValueId {
        let dt = self.dtype(x);
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, dt)],
            OpSpec {
                diff_inputs: vec![x],
                passthrough: true,
                ..Default::default()
            },
        )[0]
    }

    /// `torch.cat([past, new], dim=seq)` for a KV cache (inference only).
    pub fn cat(&mut self, name: &str, past: ValueId, new: ValueId, shape: Vec<u64>) -> ValueId {
        let dt = self.dtype(new);
        self.b.op(
            name,
            &[past, new],
            None,
            &[("out", shape, dt)],
            OpSpec::default(),
        )[0]
    }

    /// `nn.MaxPool2d(3, 2, 1)`: output and int64 indices (saved).
    pub fn maxpool(&mut self, name: &str, x: ValueId) -> ValueId {
        let s = self.shape(x);
        let (ho, wo) = ((s[2] - 1) / 2 + 1, (s[3] - 1) / 2 + 1);
        let shape = vec![s[0], s[1], ho, wo];
        let dt = self.dtype(x);
        let mut outs = vec![("out", shape.clone(), dt)];
        if self.train {
            outs.push(("indices", shape, DType::I64));
        }
        let saved_out = if self.train { vec![1] } else { vec![] };
        self.b.op(
            name,
            &[x],
            None,
            &outs,
            OpSpec {
                saved_in: vec![0],
                saved_out,
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// Global average pooling NCHW -> `[n, c]` (flatten is a view).
    pub fn avgpool(&mut self, name: &str, x: ValueId) -> ValueId {
        self.avgpool_dims(name, x, false)
    }

    /// Global average pooling NCHW -> `[n, c]`, or `[n, c, 1, 1]` with `keep`.
    pub fn avgpool_dims(&mut self, name: &str, x: ValueId, keep: bool) -> ValueId {
        let s = self.shape(x);
        let dt = self.dtype(x);
        let shape = if keep {
            vec![s[0], s[1], 1, 1]
        } else {
            vec![s[0], s[1]]
        };
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape, dt)],
            OpSpec {
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// `cross_entropy(logits[rows, classes], target[rows])` with mean reduction:
    /// fp32 log-softmax (saved), then NLL to a scalar.
    pub fn cross_entropy(&mut self, name: &str, logits: ValueId, target: ValueId) -> ValueId {
        let lf = self.fp32_operand(name, logits);
        let shape = self.shape(lf);
        let logp = self.b.op(
            &format!("{name}.log_softmax"),
            &[lf],
            None,
            &[("out", shape, DType::F32)],
            OpSpec {
                saved_out: vec![0],
                diff_inputs: vec![lf],
                ..Default::default()
            },
        )[0];
        self.b.op(
            &format!("{name}.nll"),
            &[logp, target],
            None,
            &[
                ("loss", vec![], DType::F32),
                ("total_weight", vec![], DType::F32),
            ],
            OpSpec {
                saved_in: vec![1],
                saved_out: vec![1],
                diff_inputs: vec![logp],
                ..Default::default()
            },
        )[0]
    }
}
