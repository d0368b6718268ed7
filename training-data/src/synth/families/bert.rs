//! BERT for masked-LM pre-training (Hugging Face `BertForMaskedLM` layout): word +
//! token-type + position embeddings, LayerNorm, dropout; `depth` post-LN encoder
//! layers (separate query/key/value projections, bidirectional scaled-dot-product
//! attention, output projection, dropout, residual + LayerNorm; intermediate 4x width with
//! exact GELU, output projection, dropout, residual + LayerNorm); MLM head (dense, GELU,
//! LayerNorm, decoder tied to the word embeddings with its own bias), cross-entropy over
//! every position. BERT-base: depth 12, width 768, 12 heads, vocabulary 30522, 512
//! positions. The `position_ids` and `token_type_ids` buffers are static blocks.

use super::super::graph::{DType, Graph, OpSpec, ValueId};
use super::super::ops::Net;
use super::super::schedule::IterShape;
use super::transformer::GptDims;
use crate::error::TraceError;

/// An embedding lookup of an index buffer `[1, positions]` sliced to `[1, s]` and
/// expanded to `[rows, s]` (HF's buffered position / token-type ids).
fn buffered_lookup(
    net: &mut Net,
    name: &str,
    ids: ValueId,
    table: ValueId,
    rows: u64,
    s: u64,
) -> ValueId {
    let w = net.b.value(table).shape[1];
    net.b.op(
        name,
        &[ids, table],
        None,
        &[("out", vec![rows, s, w], DType::F32)],
        OpSpec {
            saved_in: vec![0],
            diff_inputs: vec![table],
            ..Default::default()
        },
    )[0]
}

/// The forward graph of one MLM training step (or one inference forward).
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
    let word = net.b.param(
        "embeddings.word_embeddings.weight",
        &[d.vocab, d.width],
        DType::F32,
    );
    let pos_table = net.b.param(
        "embeddings.position_embeddings.weight",
        &[d.positions, d.width],
        DType::F32,
    );
    let tt_table = net.b.param(
        "embeddings.token_type_embeddings.weight",
        &[2, d.width],
        DType::F32,
    );
    let pos_ids = net
        .b
        .buffer("embeddings.position_ids", &[1, d.positions], DType::I64);
    let tt_ids = net
        .b
        .buffer("embeddings.token_type_ids", &[1, d.positions], DType::I64);
    let we = net.embedding("embeddings.word", ids, word);
    let te = buffered_lookup(&mut net, "embeddings.token_type", tt_ids, tt_table, b, s);
    let mut h = net.add("embeddings.add", we, te);
    let pe = buffered_lookup(&mut net, "embeddings.position", pos_ids, pos_table, 1, s);
    h = net.add_("embeddings.add_pos", h, pe);
    h = net.layer_norm("embeddings.LayerNorm", h);
    h = net.dropout("embeddings.dropout", h);
    for l in 0..d.depth {
        let name = format!("encoder.layer.{l}");
        let q = net.linear(&format!("{name}.attention.self.query"), h, d.width, true);
        let k = net.linear(&format!("{name}.attention.self.key"), h, d.width, true);
        let v = net.linear(&format!("{name}.attention.self.value"), h, d.width, true);
        let ctx = net.attention(
            &format!("{name}.attention.self.sdpa"),
            &[q, k, v],
            d.heads,
            false,
        );
        let a = net.linear(
            &format!("{name}.attention.output.dense"),
            ctx,
            d.width,
            true,
        );
        let a = net.dropout(&format!("{name}.attention.output.dropout"), a);
        let a = net.add(&format!("{name}.attention.output.residual"), a, h);
        let h1 = net.layer_norm(&format!("{name}.attention.output.LayerNorm"), a);
        let i = net.linear(&format!("{name}.intermediate.dense"), h1, 4 * d.width, true);
        let i = net.gelu(&format!("{name}.intermediate.gelu"), i);
        let o = net.linear(&format!("{name}.output.dense"), i, d.width, true);
        let o = net.dropout(&format!("{name}.output.dropout"), o);
        let o = net.add(&format!("{name}.output.residual"), o, h1);
        h = net.layer_norm(&format!("{name}.output.LayerNorm"), o);
    }
    let t = net.linear("cls.predictions.transform.dense", h, d.width, true);
    let t = net.gelu("cls.predictions.transform.gelu", t);
    let t = net.layer_norm("cls.predictions.transform.LayerNorm", t);
    let bias = net.b.param("cls.predictions.bias", &[d.vocab], DType::F32);
    let logits = net.linear_with("cls.predictions.decoder", t, word, Some(bias));
    net.b.hold(logits);
    if !train {
        return Ok(net.b.finish(None));
    }
    let loss = net.cross_entropy("loss", logits, labels);
    net.b.hold(loss);
    Ok(net.b.finish(Some(loss)))
}
