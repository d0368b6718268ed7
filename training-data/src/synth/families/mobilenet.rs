//! MobileNetV3-Large (torchvision layout): 3x3/2 stem with hardswish, 15 inverted
//! residual blocks (1x1 expand, depthwise kxk, optional squeeze-and-excitation, 1x1
//! project, in-place residual add), 1x1 conv to 960 channels, average pool, classifier
//! `Linear(960, 1280)` + hardswish + dropout 0.2 + `Linear(1280, classes)`. Every
//! convolution is followed by BatchNorm. ReLU blocks run ReLU in place; hardswish keeps a
//! copy of its input. Many small tensors: the opposite of ResNet-50's few large ones.
//! `width` scales the channels (16 = the standard network, as its stem has 16 channels).

use super::super::graph::{DType, Graph, ValueId};
use super::super::ops::Net;
use super::super::schedule::IterShape;
use crate::error::TraceError;

/// torchvision's `_make_divisible(v, 8)`.
fn divisible(v: u64) -> u64 {
    let d = 8;
    let n = ((v + d / 2) / d * d).max(d);
    if (n as f64) < 0.9 * v as f64 {
        n + d
    } else {
        n
    }
}

/// (kernel, expanded, out, squeeze-excite, hardswish, stride) per block, for width 16.
const BLOCKS: [(u64, u64, u64, bool, bool, u64); 15] = [
    (3, 16, 16, false, false, 1),
    (3, 64, 24, false, false, 2),
    (3, 72, 24, false, false, 1),
    (5, 72, 40, true, false, 2),
    (5, 120, 40, true, false, 1),
    (5, 120, 40, true, false, 1),
    (3, 240, 80, false, true, 2),
    (3, 200, 80, false, true, 1),
    (3, 184, 80, false, true, 1),
    (3, 184, 80, false, true, 1),
    (3, 480, 112, true, true, 1),
    (3, 672, 112, true, true, 1),
    (5, 672, 160, true, true, 2),
    (5, 960, 160, true, true, 1),
    (5, 960, 160, true, true, 1),
];

/// Convolution + BatchNorm (+ activation: in-place ReLU or hardswish).
#[allow(clippy::too_many_arguments)]
fn conv_bn(
    net: &mut Net,
    name: &str,
    x: ValueId,
    cout: u64,
    k: u64,
    stride: u64,
    groups: u64,
    act: Option<bool>,
) -> ValueId {
    let c = net.conv2d_ex(
        &format!("{name}.0"),
        x,
        cout,
        k,
        stride,
        groups,
        false,
        false,
    );
    let y = net.batchnorm(&format!("{name}.1"), c);
    match act {
        None => y,
        Some(false) => net.relu_(&format!("{name}.2"), y),
        Some(true) => net.activation(&format!("{name}.2.hardswish"), y),
    }
}

/// The forward graph for one batch of `shape.batch` images of `shape.image` pixels.
pub fn build(
    width: u64,
    classes: u64,
    shape: IterShape,
    autocast: Option<DType>,
    train: bool,
) -> Result<Graph, TraceError> {
    if shape.image < 32 {
        return Err(TraceError::Param(format!(
            "image size {} is too small for MobileNetV3 (need >= 32)",
            shape.image
        )));
    }
    let scale = |c: u64| divisible(c * width / 16);
    let mut net = Net::new(autocast, train);
    let n = shape.batch;
    let img = net
        .b
        .input("images", &[n, 3, shape.image, shape.image], DType::F32);
    let target = net.b.input("target", &[n], DType::I64);
    let mut x = conv_bn(&mut net, "features.0", img, scale(16), 3, 2, 1, Some(true));
    let mut cin = scale(16);
    for (i, &(k, exp, out, se, hs, stride)) in BLOCKS.iter().enumerate() {
        let name = format!("features.{}.block", i + 1);
        let (exp, out) = (scale(exp), scale(out));
        let input = x;
        let mut h = x;
        let mut j = 0;
        if exp != cin {
            h = conv_bn(&mut net, &format!("{name}.{j}"), h, exp, 1, 1, 1, Some(hs));
            j += 1;
        }
        h = conv_bn(
            &mut net,
            &format!("{name}.{j}"),
            h,
            exp,
            k,
            stride,
            exp,
            Some(hs),
        );
        j += 1;
        if se {
            let sq = divisible(exp / 4);
            let p = net.avgpool_dims(&format!("{name}.{j}.avgpool"), h, true);
            let f1 = net.conv2d_ex(&format!("{name}.{j}.fc1"), p, sq, 1, 1, 1, true, false);
            let a = net.relu(&format!("{name}.{j}.relu"), f1);
            let f2 = net.conv2d_ex(&format!("{name}.{j}.fc2"), a, exp, 1, 1, 1, true, false);
            let s = net.activation(&format!("{name}.{j}.hardsigmoid"), f2);
            h = net.mul(&format!("{name}.{j}.scale"), h, s);
            j += 1;
        }
        h = conv_bn(&mut net, &format!("{name}.{j}"), h, out, 1, 1, 1, None);
        if stride == 1 && cin == out {
            h = net.add_(&format!("{name}.residual"), h, input);
        }
        x = h;
        cin = out;
    }
    let last = 6 * scale(160);
    x = conv_bn(&mut net, "features.16", x, last, 1, 1, 1, Some(true));
    let pooled = net.avgpool("avgpool", x);
    let h = net.linear("classifier.0", pooled, 1280, true);
    let h = net.activation("classifier.1.hardswish", h);
    let h = net.dropout("classifier.2", h);
    let logits = net.linear("classifier.3", h, classes, true);
    if !train {
        net.b.hold(logits);
        return Ok(net.b.finish(None));
    }
    let loss = net.cross_entropy("loss", logits, target);
    net.b.hold(loss);
    Ok(net.b.finish(Some(loss)))
}

#[cfg(test)]
mod tests {
    use super::divisible;

    #[test]
    fn make_divisible_matches_torchvision() {
        // _make_divisible(72 // 4, 8) = 24, (120 // 4) = 32, (480 // 4) = 120, 960/4 = 240
        assert_eq!(divisible(18), 24);
        assert_eq!(divisible(30), 32);
        assert_eq!(divisible(120), 120);
        assert_eq!(divisible(240), 240);
        assert_eq!(divisible(168), 168);
        assert_eq!(divisible(3), 8);
    }
}
