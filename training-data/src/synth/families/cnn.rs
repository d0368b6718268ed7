//! ResNet (torchvision v1.5 layout): 7x7/2 stem, BatchNorm, in-place ReLU, 3x3/2 max
//! pool, four stages of bottleneck blocks (stride on the 3x3 convolution, 1x1
//! downsample + BN on the first block of a stage), global average pool, linear
//! classifier, cross-entropy. Depth 50 is `[3, 4, 6, 3]` bottlenecks (ResNet-50).

use super::super::graph::{DType, Graph, ValueId};
use super::super::ops::Net;
use super::super::schedule::IterShape;
use crate::error::TraceError;

/// Sizes of a ResNet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CnnDims {
    /// 50, 101 or 152 (bottleneck blocks) or 18, 34 (basic blocks).
    pub depth: u64,
    /// Channels of the stem and of the first stage's 3x3 convs (64 in ResNet-50).
    pub width: u64,
    pub classes: u64,
}

/// Blocks per stage and whether they are bottlenecks.
fn layout(depth: u64) -> Result<([u64; 4], bool), TraceError> {
    Ok(match depth {
        18 => ([2, 2, 2, 2], false),
        34 => ([3, 4, 6, 3], false),
        50 => ([3, 4, 6, 3], true),
        101 => ([3, 4, 23, 3], true),
        152 => ([3, 8, 36, 3], true),
        _ => {
            return Err(TraceError::Param(format!(
                "ResNet depth {depth}: expected 18, 34, 50, 101 or 152"
            )))
        }
    })
}

fn conv_bn(net: &mut Net, name: &str, x: ValueId, cout: u64, k: u64, stride: u64) -> ValueId {
    let c = net.conv2d(&format!("{name}.conv"), x, cout, k, stride);
    net.batchnorm(&format!("{name}.bn"), c)
}

/// The forward graph for one batch of `shape.batch` images of `shape.image` pixels square.
pub fn build(
    d: CnnDims,
    shape: IterShape,
    autocast: Option<DType>,
    train: bool,
) -> Result<Graph, TraceError> {
    let (blocks, bottleneck) = layout(d.depth)?;
    if shape.image < 32 {
        return Err(TraceError::Param(format!(
            "image size {} is too small for a ResNet (need >= 32)",
            shape.image
        )));
    }
    let mut net = Net::new(autocast, train);
    let n = shape.batch;
    let img = net
        .b
        .input("images", &[n, 3, shape.image, shape.image], DType::F32);
    let target = net.b.input("target", &[n], DType::I64);
    let mut x = conv_bn(&mut net, "stem", img, d.width, 7, 2);
    x = net.relu_("stem.relu", x);
    x = net.maxpool("maxpool", x);
    let expansion = if bottleneck { 4 } else { 1 };
    let mut cin = d.width;
    for (stage, &nb) in blocks.iter().enumerate() {
        let planes = d.width << stage;
        for blk in 0..nb {
            let name = format!("layer{}.{blk}", stage + 1);
            let stride = if stage > 0 && blk == 0 { 2 } else { 1 };
            let identity = x;
            let mut out;
            if bottleneck {
                out = conv_bn(&mut net, &format!("{name}.1"), x, planes, 1, 1);
                out = net.relu_(&format!("{name}.relu1"), out);
                out = conv_bn(&mut net, &format!("{name}.2"), out, planes, 3, stride);
                out = net.relu_(&format!("{name}.relu2"), out);
                out = conv_bn(&mut net, &format!("{name}.3"), out, planes * 4, 1, 1);
            } else {
                out = conv_bn(&mut net, &format!("{name}.1"), x, planes, 3, stride);
                out = net.relu_(&format!("{name}.relu1"), out);
                out = conv_bn(&mut net, &format!("{name}.2"), out, planes, 3, 1);
            }
            let cout = planes * expansion;
            let id = if stride != 1 || cin != cout {
                conv_bn(
                    &mut net,
                    &format!("{name}.downsample"),
                    identity,
                    cout,
                    1,
                    stride,
                )
            } else {
                identity
            };
            out = net.add_(&format!("{name}.add"), out, id);
            x = net.relu_(&format!("{name}.relu3"), out);
            cin = cout;
        }
    }
    let pooled = net.avgpool("avgpool", x);
    let logits = net.linear("fc", pooled, d.classes, true);
    if !train {
        net.b.hold(logits);
        return Ok(net.b.finish(None));
    }
    let loss = net.cross_entropy("loss", logits, target);
    net.b.hold(loss);
    Ok(net.b.finish(Some(loss)))
}
