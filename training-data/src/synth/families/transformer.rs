//! GPT-2 (Hugging Face `GPT2LMHeadModel` layout): token + position embeddings, `depth`
//! pre-LN blocks (`c_attn` -> causal SDPA -> `c_proj`, `c_fc` -> `gelu_new` ->
//! `c_proj`, dropout 0.1, fp32 residual stream), final LayerNorm, an LM head tied to the
//! token embedding, and HF's causal-LM loss (`logits.float()`, shifted labels).
//! Training calls return `present` key/value copies (HF's `use_cache=True` default),
//! which the loop holds until the iteration ends, as seen in the real trace.
//! GPT-2 small: depth 12, width 768, 12 heads, vocabulary 50257, 1024 positions.

use super::super::graph::{DType, Graph, OpSpec, Unit, ValueId};
use super::super::ops::Net;
use super::super::schedule::IterShape;
use crate::error::TraceError;

/// Sizes of a GPT-2-style transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptDims {
    pub depth: u64,
    pub width: u64,
    pub heads: u64,
    pub vocab: u64,
    /// Rows of the position embedding (maximum sequence length).
    pub positions: u64,
}

impl GptDims {
    pub fn check(&self, seq: u64) -> Result<(), TraceError> {
        if self.heads == 0 || !self.width.is_multiple_of(self.heads) {
            return Err(TraceError::Param(format!(
                "width {} is not a multiple of heads {}",
                self.width, self.heads
            )));
        }
        if seq == 0 || seq > self.positions {
            return Err(TraceError::Param(format!(
                "sequence length {seq} outside 1..={}",
                self.positions
            )));
        }
        Ok(())
    }
}

/// Embeddings: token ids `[b, s]` -> fp32 hidden `[b, s, width]`. Returns the hidden
/// state, the token table (tied to the LM head) and the two lookups, which
/// `GPT2Model.forward` holds in locals until it returns. Position ids are `[1, s]` in
/// training and `[b, s]` in `generate` (derived from the attention mask), so the
/// position lookup is batch-sized there.
fn embed(net: &mut Net, d: GptDims, ids: ValueId, pos_rows: u64, s: u64) -> Embedded {
    let wte = net.b.param("wte.weight", &[d.vocab, d.width], DType::F32);
    let wpe = net
        .b
        .param("wpe.weight", &[d.positions, d.width], DType::F32);
    let pos = net.b.op(
        "position_ids",
        &[],
        None,
        &[("out", vec![pos_rows, s], DType::I64)],
        OpSpec::default(),
    )[0];
    let tok = net.embedding("wte", ids, wte);
    let pe = net.embedding("wpe", pos, wpe);
    let h = net.add("embed.add", tok, pe);
    Embedded {
        h: net.dropout("drop", h),
        wte,
        held: [tok, pe],
    }
}

struct Embedded {
    h: ValueId,
    wte: ValueId,
    held: [ValueId; 2],
}

/// The MLP half of a block: returns the new residual stream.
fn mlp(net: &mut Net, d: GptDims, name: &str, h: ValueId) -> ValueId {
    let m = net.layer_norm(&format!("{name}.ln_2"), h);
    let f = net.linear(&format!("{name}.mlp.c_fc"), m, 4 * d.width, true);
    let g = net.gelu_new(&format!("{name}.mlp.act"), f);
    let p = net.linear(&format!("{name}.mlp.c_proj"), g, d.width, true);
    let p = net.dropout(&format!("{name}.mlp.dropout"), p);
    net.add(&format!("{name}.residual2"), p, h)
}

/// The forward graph of one training step (or one full-sequence inference forward).
pub fn build(
    d: GptDims,
    shape: IterShape,
    autocast: Option<DType>,
    train: bool,
) -> Result<Graph, TraceError> {
    let (b, s) = (shape.batch, shape.seq);
    d.check(s)?;
    let mut net = Net::new(autocast, train);
    let ids = net.b.input("input_ids", &[b, s], DType::I64);
    let labels = net.b.input("labels", &[b, s], DType::I64);
    let Embedded { mut h, wte, held } = embed(&mut net, d, ids, 1, s);
    for l in 0..d.depth {
        let name = format!("h.{l}");
        let a = net.layer_norm(&format!("{name}.ln_1"), h);
        let qkv = net.linear(&format!("{name}.attn.c_attn"), a, 3 * d.width, true);
        for kv in ["key", "value"] {
            // `present` (use_cache): contiguous per-head copies, returned to the caller.
            let c = net.copy(
                &format!("{name}.attn.present_{kv}"),
                qkv,
                vec![b, s, d.width],
            );
            net.b.hold(c);
        }
        let att = net.sdpa(&format!("{name}.attn.sdpa"), qkv, d.heads);
        let o = net.linear(&format!("{name}.attn.c_proj"), att, d.width, true);
        let o = net.dropout(&format!("{name}.attn.resid_dropout"), o);
        let h_in = h;
        h = net.add(&format!("{name}.residual1"), o, h);
        h = mlp(&mut net, d, &name, h);
        // GPT2Block holds `attn_output` and its caller the block input until it returns.
        net.keep_until_last(&[h_in, o]);
    }
    let hf = net.layer_norm("ln_f", h);
    net.keep_until_last(&held);
    let logits = net.linear_with("lm_head", hf, wte, None);
    net.b.hold(logits);
    if !train {
        return Ok(net.b.finish(None));
    }
    // HF ForCausalLMLoss: upcast, pad + shift the labels, cross-entropy over b*s rows.
    let lf = net.cast("loss.logits_float", logits, DType::F32);
    let shifted = net.b.op(
        "loss.shift_labels",
        &[labels],
        None,
        &[("out", vec![b * s], DType::I64)],
        OpSpec::default(),
    )[0];
    let loss = net.cross_entropy("loss", lf, shifted);
    net.b.hold(loss);
    Ok(net.b.finish(Some(loss)))
}

/// One forward of KV-cached greedy generation (inference, no dropout): `new` tokens
/// (the prompt at prefill, 1 when decoding) attend to `past` cached positions.
/// `past_kv[l] = (k, v)` are external values bound to the previous call's caches; the
/// returned graph holds the new caches in `held` order `k0, v0, k1, v1, ...`, followed by
/// the next-token ids.
pub fn build_decode(
    d: GptDims,
    b: u64,
    past: u64,
    new: u64,
    autocast: Option<DType>,
) -> Result<Graph, TraceError> {
    d.check(past + new)?;
    let mut net = Net::new(autocast, false);
    let ids = net.b.input("input_ids", &[b, new], DType::I64);
    let Embedded { mut h, wte, held } = embed(&mut net, d, ids, b, new);
    let act = autocast.unwrap_or(DType::F32);
    let hd = d.width / d.heads;
    for l in 0..d.depth {
        let name = format!("h.{l}");
        let a = net.layer_norm(&format!("{name}.ln_1"), h);
        let qkv = net.linear(&format!("{name}.attn.c_attn"), a, 3 * d.width, true);
        let mut caches = Vec::new();
        for kv in ["key", "value"] {
            let shape = vec![b, d.heads, past + new, hd];
            let c = if past == 0 {
                net.copy(&format!("{name}.attn.cache_{kv}"), qkv, shape)
            } else {
                let p = net
                    .b
                    .external(&format!("{name}.past_{kv}"), &[b, d.heads, past, hd], act);
                net.cat(&format!("{name}.attn.cache_{kv}"), p, qkv, shape)
            };
            caches.push(c);
        }
        let flops = 4.0 * (b * d.heads * new * (past + new) * hd) as f64;
        let att = net.b.op(
            &format!("{name}.attn.sdpa"),
            &[qkv, caches[0], caches[1]],
            None,
            &[("out", vec![b, new, d.width], act)],
            OpSpec {
                unit: Unit::Matmul {
                    dtype: act,
                    tf32: false,
                },
                fwd_flops: flops,
                ..Default::default()
            },
        )[0];
        for c in caches {
            net.b.hold(c);
        }
        let o = net.linear(&format!("{name}.attn.c_proj"), att, d.width, true);
        let h_in = h;
        h = net.add(&format!("{name}.residual1"), o, h);
        h = mlp(&mut net, d, &name, h);
        net.keep_until_last(&[h_in, o]);
    }
    let hf = net.layer_norm("ln_f", h);
    net.keep_until_last(&held);
    // Only the last position's logits are computed (`logits_to_keep=1`), then upcast.
    let last = net.copy("last_hidden", hf, vec![b, 1, d.width]);
    let logits = net.linear_with("lm_head", last, wte, None);
    // `generate` copies the last logits to fp32 (a copy even when they already are).
    let lf = net.b.op(
        "generate.next_token_logits",
        &[logits],
        None,
        &[("out", vec![b, d.vocab], DType::F32)],
        OpSpec::default(),
    )[0];
    let next = generate_bookkeeping(&mut net, lf, b, past + new);
    net.b.hold(next);
    Ok(net.b.finish(None))
}

/// The small tensors Hugging Face's greedy `generate` loop makes per token after the
/// forward, as seen in the real recording: argmax, padding of finished rows, the grown
/// `input_ids` and `attention_mask`, the end-of-sequence test and the unfinished-rows
/// update. Returns the next token ids.
fn generate_bookkeeping(net: &mut Net, logits: ValueId, b: u64, len: u64) -> ValueId {
    let mut op = |name: &str, inputs: &[ValueId], shape: Vec<u64>, dt: DType| {
        net.b
            .op(name, inputs, None, &[("out", shape, dt)], OpSpec::default())[0]
    };
    let next = op("generate.argmax", &[logits], vec![b], DType::I64);
    let unfinished = op("generate.unfinished", &[], vec![b], DType::I64);
    let kept = op(
        "generate.mul_unfinished",
        &[next, unfinished],
        vec![b],
        DType::I64,
    );
    let pad = op("generate.pad_finished", &[unfinished], vec![b], DType::I64);
    let next = op("generate.next_tokens", &[kept, pad], vec![b], DType::I64);
    op(
        "generate.input_ids_cat",
        &[next],
        vec![b, len + 1],
        DType::I64,
    );
    op(
        "generate.attention_mask_cat",
        &[],
        vec![b, len + 1],
        DType::I64,
    );
    op("generate.cache_position", &[], vec![1], DType::I64);
    let eos = op("generate.is_eos", &[next], vec![b], DType::Bool);
    let not_eos = op("generate.not_eos", &[eos], vec![b], DType::Bool);
    let still = op(
        "generate.and_unfinished",
        &[not_eos, unfinished],
        vec![b],
        DType::I64,
    );
    op("generate.any_unfinished", &[still], vec![], DType::I64);
    next
}
