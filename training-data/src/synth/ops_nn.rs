//! Sequence-model ops for the op library (see `ops.rs`): embeddings, layer norm,
//! dropout, GELU variants, and scaled-dot-product attention.

use super::graph::{DType, OpSpec, Unit, ValueId};
use super::ops::Net;

impl Net {
    /// `torch.pow(x, 3.0)`: fp32 under autocast; backward computes `x^2` and `3 x^2`
    /// (two temporaries) before the gradient.
    pub fn pow3(&mut self, name: &str, x: ValueId) -> ValueId {
        let xf = self.fp32_operand(name, x);
        let (shape, dt) = (self.shape(xf), self.dtype(xf));
        let bytes = self.b.value(xf).bytes();
        self.b.op(
            name,
            &[xf],
            None,
            &[("out", shape, dt)],
            OpSpec {
                saved_in: vec![0],
                diff_inputs: vec![xf],
                bwd_temps: vec![bytes, bytes],
                ..Default::default()
            },
        )[0]
    }

    /// `torch.tanh(x)`: backward reads the result.
    pub fn tanh(&mut self, name: &str, x: ValueId) -> ValueId {
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

    /// HF `NewGELUActivation` as the Python expression PyTorch runs:
    /// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))`.
    pub fn gelu_new(&mut self, name: &str, x: ValueId) -> ValueId {
        let half = self.scale(&format!("{name}.half_x"), x);
        let p = self.pow3(&format!("{name}.pow"), x);
        let c = self.scale(&format!("{name}.mul_c"), p);
        let inner = self.add(&format!("{name}.add"), x, c);
        let k = self.scale(&format!("{name}.mul_k"), inner);
        let t = self.tanh(&format!("{name}.tanh"), k);
        let one = self.add_scalar(&format!("{name}.one_plus"), t);
        let out = self.mul(&format!("{name}.mul"), half, one);
        // The Python function holds its argument until it returns.
        self.keep_until_last(&[x]);
        out
    }

    /// `nn.LayerNorm(d)` over the last dim (fp32 under autocast).
    pub fn layer_norm(&mut self, name: &str, x: ValueId) -> ValueId {
        let s = self.shape(x);
        let d = *s.last().unwrap_or(&1);
        let rows = self.numel(x) as u64 / d.max(1);
        let w = self.b.param(&format!("{name}.weight"), &[d], DType::F32);
        let bias = self.b.param(&format!("{name}.bias"), &[d], DType::F32);
        let xf = self.fp32_operand(name, x);
        let dt = self.dtype(xf);
        self.b.op(
            name,
            &[xf, w, bias],
            None,
            &[
                ("out", s, dt),
                ("mean", vec![rows], DType::F32),
                ("rstd", vec![rows], DType::F32),
            ],
            OpSpec {
                saved_in: vec![0, 1, 2],
                saved_out: vec![1, 2],
                diff_inputs: vec![xf, w, bias],
                ..Default::default()
            },
        )[0]
    }

    /// `nn.Dropout(p)`: in training, an output and a bool mask (saved); else identity.
    pub fn dropout(&mut self, name: &str, x: ValueId) -> ValueId {
        if !self.train {
            return x;
        }
        let (shape, dt) = (self.shape(x), self.dtype(x));
        self.b.op(
            name,
            &[x],
            None,
            &[("out", shape.clone(), dt), ("mask", shape, DType::Bool)],
            OpSpec {
                saved_out: vec![1],
                diff_inputs: vec![x],
                ..Default::default()
            },
        )[0]
    }

    /// `nn.Embedding(rows, d)` lookup of `ids`; backward makes a dense table gradient.
    pub fn embedding(&mut self, name: &str, ids: ValueId, table: ValueId) -> ValueId {
        let d = self.b.value(table).shape[1];
        let mut shape = self.shape(ids);
        shape.push(d);
        let dt = self.dtype(table);
        let ids_bytes = self.b.value(ids).bytes();
        self.b.op(
            name,
            &[ids, table],
            None,
            &[("out", shape, dt)],
            OpSpec {
                saved_in: vec![0],
                diff_inputs: vec![table],
                // embedding_dense_backward sorts the indices: keys, values and counts.
                bwd_temps: vec![ids_bytes, ids_bytes, ids_bytes],
                ..Default::default()
            },
        )[0]
    }

    /// Causal scaled-dot-product attention on packed `qkv[b, s, 3*h*d]` (GPT-2).
    pub fn sdpa(&mut self, name: &str, qkv: ValueId, heads: u64) -> ValueId {
        self.attention(name, &[qkv], heads, true)
    }

    /// Scaled-dot-product attention with the flash / memory-efficient kernels, on packed
    /// `[qkv]` (`[b, s, 3*h*d]`) or separate `[q, k, v]` (`[b, s, h*d]` each): out
    /// `[b, s, h*d]` plus the log-sum-exp (and dropout RNG state in training); nothing
    /// quadratic in `s` is kept.
    pub fn attention(
        &mut self,
        name: &str,
        inputs: &[ValueId],
        heads: u64,
        causal: bool,
    ) -> ValueId {
        let packed = inputs.len() == 1;
        let s = self.shape(inputs[0]);
        let (bsz, seq) = (s[0], s[1]);
        let width = if packed { s[2] / 3 } else { s[2] };
        let d = width / heads;
        let dt = self.dtype(inputs[0]);
        let mut outs = vec![
            ("out", vec![bsz, seq, width], dt),
            ("lse", vec![bsz, heads, seq], DType::F32),
        ];
        if self.train && dt != DType::F32 {
            // Philox seed and offset of the flash kernel's dropout (bf16 only: the real
            // fp32 BERT trace, run by the memory-efficient kernel, shows none).
            outs.push(("rng_seed", vec![1], DType::I64));
            outs.push(("rng_offset", vec![1], DType::I64));
        }
        let saved_out = (0..outs.len()).collect();
        let full = 4.0 * (bsz * heads * seq * seq * d) as f64;
        let flops = if causal { full / 2.0 } else { full };
        let bsh = bsz * seq * width;
        // One block with the fp32 dq accumulator and the softmax row sums (the real
        // GPT-2 trace shows it as one allocation of b*h*s*(4d + 4) bytes); for packed
        // inputs also dq, dk, dv, concatenated afterwards into the qkv gradient.
        let mut bwd_temps = vec![bsh * 4 + bsz * heads * seq * 4];
        if packed {
            bwd_temps.splice(0..0, [bsh * dt.size(); 3]);
        }
        self.b.op(
            name,
            inputs,
            None,
            &outs,
            OpSpec {
                saved_in: (0..inputs.len()).collect(),
                saved_out,
                diff_inputs: inputs.to_vec(),
                unit: Unit::Matmul {
                    dtype: dt,
                    tf32: false,
                },
                fwd_flops: flops,
                bwd_flops: 2.5 * flops,
                bwd_temps,
                ..Default::default()
            },
        )[0]
    }

    /// Exact GELU (`nn.functional.gelu`, one kernel): saves its input.
    pub fn gelu(&mut self, name: &str, x: ValueId) -> ValueId {
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
}
