//! Expansion of a forward [`Graph`] into program steps: one training iteration
//! (data, forward, backward, optimizer, zero_grad) or one inference forward.
//!
//! Memory semantics follow PyTorch eager autograd (see `graph.rs`): an op's outputs are
//! allocated when it runs; values saved for the backward are read again by the backward
//! step, which keeps them live until then; gradients are allocated by the backward step
//! that makes them and accumulated in place (or, when the existing gradient is a buffer
//! shared through a pass-through, out of place); parameter gradients live until the
//! closing `zero_grad(set_to_none=True)`. Parameters, module buffers, optimizer state and
//! library workspaces are static buffers keyed by name, so iterations with different
//! shapes share them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::cost::CostModel;
use super::graph::{Graph, Role, Unit, ValueId};
use super::program::{BufId, Program, Step};
use crate::error::TraceError;

/// The optimizer of a training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Optimizer {
    /// `torch.optim.SGD(momentum=0.9)`, foreach: one momentum buffer per parameter.
    SgdMomentum,
    /// `torch.optim.AdamW`, foreach: `exp_avg` and `exp_avg_sq` per parameter, plus a
    /// transient `sqrt(exp_avg_sq)` per parameter during the step.
    AdamW,
}

/// Builds a [`Program`] iteration by iteration.
#[derive(Debug)]
pub struct Expander {
    pub p: Program,
    pub cost: CostModel,
    pub optimizer: Option<Optimizer>,
    /// Static buffers by name (parameters, module buffers, optimizer state).
    statics: HashMap<String, BufId>,
    /// Parameter static buffers in creation order, with their optimizer state.
    params: Vec<(String, BufId, Vec<BufId>)>,
    /// Host-to-device bandwidth for input batches (pinned, PCIe Gen5: ~55 GB/s measured).
    pub h2d_bytes_per_s: f64,
}

/// Where each value of one expanded graph lives.
pub type Mem = Vec<Option<BufId>>;

impl Expander {
    /// `workspaces`: library scratch blocks live before the trace (the real traces show
    /// two 32 MiB cuBLAS workspaces).
    pub fn new(cost: CostModel, optimizer: Option<Optimizer>, workspaces: &[u64]) -> Self {
        let mut p = Program::default();
        for (i, &w) in workspaces.iter().enumerate() {
            p.static_buf(&format!("workspace{i}"), w);
        }
        Expander {
            p,
            cost,
            optimizer,
            statics: HashMap::new(),
            params: Vec::new(),
            h2d_bytes_per_s: 50e9,
        }
    }

    fn static_for(&mut self, g: &Graph, v: ValueId) -> BufId {
        let val = &g.values[v];
        if let Some(&b) = self.statics.get(&val.name) {
            return b;
        }
        let b = self.p.static_buf(&val.name, val.bytes());
        self.statics.insert(val.name.clone(), b);
        if val.role == Role::Param {
            let names: &[&str] = match self.optimizer {
                None => &[],
                Some(Optimizer::SgdMomentum) => &["momentum_buffer"],
                Some(Optimizer::AdamW) => &["exp_avg", "exp_avg_sq"],
            };
            let state = names
                .iter()
                .map(|s| self.p.static_buf(&format!("{}.{s}", val.name), val.bytes()))
                .collect();
            self.params.push((val.name.clone(), b, state));
        }
        b
    }

    /// Creates the static buffers of `g` (parameters first seen here, their optimizer
    /// state, module buffers) without running anything.
    pub fn register_statics(&mut self, g: &Graph) {
        for v in 0..g.values.len() {
            if matches!(g.values[v].role, Role::Param | Role::Buffer) {
                self.static_for(g, v);
            }
        }
    }

    /// Runs `g` forward. `bound` gives buffers for `External` values. Inputs are
    /// allocated by one host-to-device step first. Returns each value's buffer and
    /// each op's duration (for recompute costs). Errors if the graph breaks its
    /// invariants or an external value is left unbound.
    pub fn forward(
        &mut self,
        g: &Graph,
        bound: &[(ValueId, BufId)],
    ) -> Result<(Mem, Vec<f64>), TraceError> {
        g.check_invariants()?;
        self.register_statics(g);
        let unbound = |what: &str, v: ValueId| {
            TraceError::Param(format!("graph: {what} {} has no buffer", g.values[v].name))
        };
        let mut mem: Mem = vec![None; g.values.len()];
        let mut data = Step {
            name: "data.h2d".into(),
            ..Default::default()
        };
        let mut h2d = 0u64;
        for (v, val) in g.values.iter().enumerate() {
            match val.role {
                Role::Param | Role::Buffer => mem[v] = Some(self.statics[&val.name]),
                Role::Input => {
                    let b = self.p.buf(&val.name, val.bytes());
                    data.allocs.push(b);
                    h2d += val.bytes();
                    mem[v] = Some(b);
                }
                Role::External | Role::Activation => {}
            }
        }
        for &(v, b) in bound {
            mem[v] = Some(b);
        }
        if !data.allocs.is_empty() {
            data.dur_us = h2d as f64 / self.h2d_bytes_per_s * 1e6;
            data.kernels = 1;
            self.p.push(data);
        }
        let mut durs = Vec::with_capacity(g.ops.len());
        for op in &g.ops {
            let mut s = Step {
                name: op.name.clone(),
                ..Default::default()
            };
            let mut bytes = 0u64;
            for &x in &op.inputs {
                let b = mem[g.values[x].storage].ok_or_else(|| unbound("input", x))?;
                if !s.reads.contains(&b) {
                    s.reads.push(b);
                    bytes += self.p.bufs[b].bytes;
                }
            }
            for &o in &op.outputs {
                let root = g.values[o].storage;
                if root == o {
                    let b = self.p.buf(&g.values[o].name, g.values[o].bytes());
                    s.allocs.push(b);
                    mem[o] = Some(b);
                } else {
                    let b = mem[root].ok_or_else(|| unbound("in-place target", root))?;
                    mem[o] = Some(b);
                    s.writes.push(b);
                }
                bytes += g.values[o].bytes();
            }
            for &w in &op.extra_writes {
                s.writes.extend(mem[w]);
            }
            for &k in &op.keeps {
                s.holds.extend(mem[g.values[k].storage]);
            }
            for &t in &op.fwd_temps {
                let b = self.p.buf(&format!("{}.workspace", op.name), t);
                s.allocs.push(b);
            }
            s.dur_us = self.cost.time_us(op.unit, op.fwd_flops, bytes as f64, 1);
            s.kernels = 1;
            durs.push(s.dur_us);
            self.p.push(s);
        }
        Ok((mem, durs))
    }

    /// Marks saved activations with the time their producer took (what recomputing
    /// them instead of keeping them would cost).
    fn mark_recompute(&mut self, g: &Graph, mem: &Mem, durs: &[f64]) {
        for op in &g.ops {
            for &v in &op.saved {
                let val = &g.values[v];
                if let (Role::Activation, Some(pr), Some(b)) = (val.role, val.producer, mem[v]) {
                    if g.values[v].storage == v {
                        self.p.bufs[b].recompute_us = Some(durs[pr]);
                    }
                }
            }
        }
    }

    /// Runs the backward of `g` from its loss. Returns the gradient buffer of each
    /// parameter (by name), i.e. its `.grad`.
    pub fn backward(&mut self, g: &Graph, mem: &Mem) -> Vec<(String, BufId)> {
        let Some(loss) = g.loss else {
            return Vec::new();
        };
        // grads[v] = (buffer, shared): shared buffers came through a pass-through and
        // may not be accumulated into in place.
        let mut grads: Vec<Option<(BufId, bool)>> = vec![None; g.values.len()];
        let seed = self.p.buf("loss.grad_seed", g.values[loss].bytes().max(4));
        self.p.push(Step {
            name: "loss.backward".into(),
            allocs: vec![seed],
            dur_us: self.cost.device_min_us,
            kernels: 1,
            ..Default::default()
        });
        grads[loss] = Some((seed, false));
        for op in g.ops.iter().rev() {
            let gouts: Vec<BufId> = op
                .outputs
                .iter()
                .filter_map(|&o| grads[o].map(|(b, _)| b))
                .collect();
            if gouts.is_empty() || op.diff_inputs.is_empty() {
                continue;
            }
            let name = format!("{}.bwd", op.name);
            let mut s = Step {
                name: name.clone(),
                reads: gouts.clone(),
                ..Default::default()
            };
            for &v in &op.saved {
                if let Some(b) = mem[g.values[v].storage] {
                    if !s.reads.contains(&b) {
                        s.reads.push(b);
                    }
                }
            }
            for &t in &op.bwd_temps {
                s.allocs.push(self.p.buf(&format!("{name}.temp"), t));
            }
            let out0 = &g.values[op.outputs[0]];
            let mut contribs = Vec::new();
            for &d in &op.diff_inputs {
                if contribs.iter().any(|&(v, _, _)| v == d) {
                    continue;
                }
                let dv = &g.values[d];
                let pass = match grads[op.outputs[0]] {
                    Some((b, shared))
                        if op.grad_passthrough
                            && dv.dtype == out0.dtype
                            && dv.bytes() == out0.bytes() =>
                    {
                        Some((b, shared))
                    }
                    _ => None,
                };
                if let Some((b, shared)) = pass {
                    contribs.push((d, b, shared));
                } else {
                    if !op.grad_passthrough && !op.is_cast && dv.dtype != out0.dtype {
                        // Computed in the output dtype, then cast by autograd.
                        let t = self
                            .p
                            .buf(&format!("{name}.temp"), dv.numel() * out0.dtype.size());
                        s.allocs.push(t);
                    }
                    let b = self.p.buf(&format!("{}.grad", dv.name), dv.bytes());
                    s.allocs.push(b);
                    contribs.push((d, b, false));
                }
            }
            // A passed-through gradient is shared when two inputs hold it: it may then
            // not be accumulated into in place.
            let passed: Vec<BufId> = grads[op.outputs[0]].map(|(b, _)| b).into_iter().collect();
            let n_pass = contribs.iter().filter(|c| passed.contains(&c.1)).count();
            for c in contribs.iter_mut() {
                if passed.contains(&c.1) && n_pass > 1 {
                    c.2 = true;
                }
            }
            let bytes: u64 = s
                .reads
                .iter()
                .chain(&s.allocs)
                .map(|&b| self.p.bufs[b].bytes)
                .sum();
            s.dur_us = self.cost.time_us(op.unit, op.bwd_flops, bytes as f64, 2);
            s.kernels = 2;
            self.p.push(s);
            for (d, b, shared) in contribs {
                self.accumulate(g, &mut grads, d, b, shared);
            }
        }
        let mut out = Vec::new();
        for v in g.with_role(Role::Param) {
            if let Some((b, _)) = grads[v] {
                out.push((g.values[v].name.clone(), b));
            }
        }
        out
    }

    /// Adds the gradient contribution `b` to value `v`'s gradient.
    fn accumulate(
        &mut self,
        g: &Graph,
        grads: &mut [Option<(BufId, bool)>],
        v: ValueId,
        b: BufId,
        shared: bool,
    ) {
        let Some((old, old_shared)) = grads[v] else {
            grads[v] = Some((b, shared));
            return;
        };
        let bytes = self.p.bufs[b].bytes as f64;
        let name = format!("{}.grad_acc", g.values[v].name);
        if !old_shared {
            // InputBuffer::accumulate: `old.add_(new)` when `old` is not shared.
            self.p.push(Step {
                name,
                reads: vec![b],
                writes: vec![old],
                dur_us: self.cost.time_us(Unit::Vector, 0.0, 3.0 * bytes, 1),
                kernels: 1,
                ..Default::default()
            });
        } else {
            let sum = self
                .p
                .buf(&format!("{}.grad", g.values[v].name), bytes as u64);
            self.p.push(Step {
                name,
                reads: vec![old, b],
                allocs: vec![sum],
                dur_us: self.cost.time_us(Unit::Vector, 0.0, 3.0 * bytes, 1),
                kernels: 1,
                ..Default::default()
            });
            grads[v] = Some((sum, false));
        }
    }

    /// The optimizer step over all parameters that got a gradient (foreach kernels:
    /// one step per foreach call over the whole list).
    pub fn optimizer_step(&mut self, grads: &[(String, BufId)]) {
        let Some(opt) = self.optimizer else { return };
        let by_name: HashMap<&str, (BufId, &Vec<BufId>)> = self
            .params
            .iter()
            .map(|(n, b, s)| (n.as_str(), (*b, s)))
            .collect();
        let mut ps = Vec::new();
        let mut gs = Vec::new();
        let mut st: Vec<Vec<BufId>> = Vec::new();
        for (name, g) in grads {
            if let Some(&(p, s)) = by_name.get(name.as_str()) {
                ps.push(p);
                gs.push(*g);
                st.push(s.clone());
            }
        }
        let launches = (ps.len() as u32).div_ceil(24).max(1);
        let col = |i: usize| -> Vec<BufId> { st.iter().map(|s| s[i]).collect() };
        let foreach = |me: &mut Self,
                       name: &str,
                       reads: Vec<BufId>,
                       writes: Vec<BufId>,
                       allocs: Vec<BufId>| {
            let bytes: u64 = reads
                .iter()
                .chain(&writes)
                .chain(&allocs)
                .map(|&b| me.p.bufs[b].bytes)
                .sum();
            let dur_us = me.cost.time_us(Unit::Vector, 0.0, bytes as f64, launches);
            me.p.push(Step {
                name: name.into(),
                reads,
                writes,
                allocs,
                dur_us,
                kernels: launches,
                ..Default::default()
            });
        };
        match opt {
            Optimizer::SgdMomentum => {
                let m = col(0);
                foreach(self, "sgd.momentum", gs.clone(), m.clone(), vec![]);
                foreach(self, "sgd.update", m, ps, vec![]);
            }
            Optimizer::AdamW => {
                let (m, v) = (col(0), col(1));
                foreach(self, "adamw.decay", vec![], ps.clone(), vec![]);
                foreach(self, "adamw.exp_avg", gs.clone(), m.clone(), vec![]);
                foreach(self, "adamw.exp_avg_sq", gs.clone(), v.clone(), vec![]);
                let tmp: Vec<BufId> = v
                    .iter()
                    .map(|&b| {
                        let bytes = self.p.bufs[b].bytes;
                        self.p.buf("adamw.sqrt_exp_avg_sq", bytes)
                    })
                    .collect();
                foreach(self, "adamw.sqrt", v, vec![], tmp.clone());
                foreach(self, "adamw.div_add_eps", vec![], tmp.clone(), vec![]);
                let mut reads = m;
                reads.extend(&tmp);
                foreach(self, "adamw.addcdiv", reads, ps, vec![]);
            }
        }
    }

    /// Ends an iteration: `optimizer.zero_grad(set_to_none=True)` and the loop dropping
    /// its references (inputs, held outputs).
    pub fn release(&mut self, name: &str, holds: Vec<BufId>) {
        self.p.push(Step {
            name: name.into(),
            holds,
            ..Default::default()
        });
    }

    /// One training iteration of `g`: boundary, data, forward, backward, optimizer,
    /// zero_grad. The caller adds the final boundary.
    pub fn train_iteration(&mut self, g: &Graph) -> Result<(), TraceError> {
        self.p.boundary();
        let (mem, durs) = self.forward(g, &[])?;
        self.mark_recompute(g, &mem, &durs);
        let grads = self.backward(g, &mem);
        self.optimizer_step(&grads);
        let mut holds: Vec<BufId> = grads.iter().map(|&(_, b)| b).collect();
        holds.extend(self.iteration_holds(g, &mem));
        self.release("zero_grad", holds);
        Ok(())
    }

    /// One inference forward of `g` under `torch.no_grad()`.
    pub fn infer_iteration(&mut self, g: &Graph) -> Result<(), TraceError> {
        self.p.boundary();
        let (mem, _) = self.forward(g, &[])?;
        let holds = self.iteration_holds(g, &mem);
        self.release("drop_outputs", holds);
        Ok(())
    }

    /// Inputs and held outputs: the loop keeps them until the iteration ends.
    pub fn iteration_holds(&self, g: &Graph, mem: &Mem) -> Vec<BufId> {
        g.with_role(Role::Input)
            .chain(g.held.iter().copied())
            .filter_map(|v| mem[g.values[v].storage])
            .collect()
    }
}
