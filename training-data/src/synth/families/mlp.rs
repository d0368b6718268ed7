//! A multi-layer perceptron: `depth` hidden `Linear(width) + ReLU` layers, a classifier
//! and cross-entropy.

use super::super::graph::{DType, Graph};
use super::super::ops::Net;
use super::super::schedule::IterShape;

/// Sizes of an MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpDims {
    pub in_features: u64,
    pub width: u64,
    pub depth: u64,
    pub classes: u64,
}

/// The forward graph for one batch of `shape.batch` rows.
pub fn build(d: MlpDims, shape: IterShape, autocast: Option<DType>, train: bool) -> Graph {
    let mut net = Net::new(autocast, train);
    let x = net
        .b
        .input("input", &[shape.batch, d.in_features], DType::F32);
    let y = net.b.input("target", &[shape.batch], DType::I64);
    let mut h = x;
    for i in 0..d.depth {
        h = net.linear(&format!("fc{i}"), h, d.width, true);
        h = net.relu(&format!("relu{i}"), h);
    }
    let logits = net.linear("head", h, d.classes, true);
    if !train {
        net.b.hold(logits);
        return net.b.finish(None);
    }
    let loss = net.cross_entropy("loss", logits, y);
    net.b.hold(loss);
    net.b.finish(Some(loss))
}
