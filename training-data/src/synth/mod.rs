//! Synthetic traces from computation graphs.
//!
//! Pipeline, one concern per module:
//! - [`graph`]: the graph model (values with shapes and dtypes, ops with what they save);
//! - [`ops`], [`ops_nn`]: PyTorch layers as ops, with autocast and PyTorch's allocation
//!   behaviour;
//! - [`families`]: MLP, ResNet (bottleneck), MobileNetV3, GPT-2 and BERT graphs for a
//!   given shape;
//! - [`expand`]: a graph -> program steps for a training iteration (forward, saved
//!   activations, backward, gradients, optimizer) or an inference forward;
//! - [`generation`]: KV-cached generation requests (prefill + growing decode steps);
//! - [`program`] + [`liveness`]: buffers and steps -> live intervals -> trace events;
//! - [`cost`] + [`timeline`]: the FLOP/bandwidth time model, run on a host and a device
//!   clock; [`schedule`]: seeded dynamic shapes.
//!
//! [`generate`] is the entry point. Output is deterministic for a given config and seed.

pub mod cost;
pub mod expand;
pub mod families;
pub mod generation;
pub mod graph;
pub mod liveness;
pub mod ops;
pub mod ops_nn;
pub mod program;
pub mod schedule;
pub mod timeline;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::TraceError;
use crate::limits::MAX_SYNTH_EVENTS;
use crate::model::{Trace, TraceMeta};

pub use cost::CostModel;
pub use expand::Optimizer;
pub use generation::GenSpec;
pub use graph::DType;
pub use schedule::{DynParam, Dynamic, IterShape};

use families::{cnn::CnnDims, mlp::MlpDims, transformer::GptDims};
use graph::Graph;
use schedule::SplitMix64;

/// Which model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Family {
    Mlp,
    Cnn,
    /// GPT-2-style decoder (causal LM).
    Transformer,
    /// BERT-style encoder (masked LM).
    Bert,
    /// MobileNetV3-Large (depthwise convolutions, many small tensors).
    MobileNet,
}

/// What the trace records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Training iterations (forward, backward, optimizer step).
    Train,
    /// Inference forwards under `torch.no_grad()`.
    Infer,
    /// KV-cached greedy generation requests (transformer only).
    Generate,
}

/// Numeric precision of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    Fp32,
    /// `torch.autocast(bfloat16)`: fp32 master weights, bf16 matmul activations.
    Bf16Autocast,
}

/// Everything that defines a synthetic trace. `Default` is GPT-2 small training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SynthConfig {
    pub family: Family,
    pub mode: Mode,
    pub batch: u64,
    /// Sequence length (transformer).
    pub seq: u64,
    /// Square image side in pixels (CNN).
    pub image: u64,
    /// MLP hidden width, ResNet base channels, transformer model width.
    pub width: u64,
    /// MLP hidden layers, ResNet depth (18/34/50/101/152), transformer blocks.
    pub depth: u64,
    /// Attention heads (transformer).
    pub heads: u64,
    /// Vocabulary (transformer).
    pub vocab: u64,
    /// Maximum positions (transformer).
    pub positions: u64,
    /// Classes (MLP, CNN).
    pub classes: u64,
    /// Input features (MLP).
    pub in_features: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    /// Iterations (training steps, inference batches or generation requests).
    pub iterations: usize,
    pub seed: u64,
    /// A shape parameter drawn per iteration (train / infer).
    pub dynamic: Option<Dynamic>,
    /// Request choices (generate).
    pub generation: GenSpec,
    /// Library workspaces live before the trace (both real traces hold two 32 MiB blocks,
    /// likely cuBLAS workspaces, and one of 1 MiB).
    pub workspaces: Vec<u64>,
    pub cost: CostModel,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig::gpt2_small()
    }
}

impl SynthConfig {
    /// GPT-2 small, batch 8, sequence 1024, bf16 autocast, AdamW, 8 iterations.
    pub fn gpt2_small() -> Self {
        SynthConfig {
            family: Family::Transformer,
            mode: Mode::Train,
            batch: 8,
            seq: 1024,
            image: 224,
            width: 768,
            depth: 12,
            heads: 12,
            vocab: 50257,
            positions: 1024,
            classes: 1000,
            in_features: 1024,
            precision: Precision::Bf16Autocast,
            optimizer: Optimizer::AdamW,
            iterations: 8,
            seed: 0,
            dynamic: None,
            generation: GenSpec::default(),
            workspaces: vec![32 << 20, 32 << 20, 1 << 20],
            cost: CostModel::h200(),
        }
    }

    /// torchvision ResNet-50, batch 64, 224x224, fp32, SGD with momentum.
    pub fn resnet50() -> Self {
        SynthConfig {
            family: Family::Cnn,
            batch: 64,
            width: 64,
            depth: 50,
            precision: Precision::Fp32,
            optimizer: Optimizer::SgdMomentum,
            ..SynthConfig::gpt2_small()
        }
    }

    /// BERT-base masked-LM pre-training, batch 32, sequence 128, fp32, AdamW.
    pub fn bert_base() -> Self {
        SynthConfig {
            family: Family::Bert,
            batch: 32,
            seq: 128,
            vocab: 30522,
            positions: 512,
            precision: Precision::Fp32,
            ..SynthConfig::gpt2_small()
        }
    }

    /// torchvision MobileNetV3-Large, batch 128, 224x224, fp32, SGD with momentum.
    pub fn mobilenet_v3() -> Self {
        SynthConfig {
            family: Family::MobileNet,
            batch: 128,
            width: 16,
            ..SynthConfig::resnet50()
        }
    }

    /// A 4-layer MLP, 1024 -> 4096 x 4 -> 1000, batch 256, fp32, SGD with momentum.
    pub fn mlp() -> Self {
        SynthConfig {
            family: Family::Mlp,
            batch: 256,
            width: 4096,
            depth: 4,
            precision: Precision::Fp32,
            optimizer: Optimizer::SgdMomentum,
            ..SynthConfig::gpt2_small()
        }
    }

    /// The preset of a family.
    pub fn preset(family: Family) -> Self {
        match family {
            Family::Mlp => SynthConfig::mlp(),
            Family::Cnn => SynthConfig::resnet50(),
            Family::Transformer => SynthConfig::gpt2_small(),
            Family::Bert => SynthConfig::bert_base(),
            Family::MobileNet => SynthConfig::mobilenet_v3(),
        }
    }

    fn autocast(&self) -> Option<DType> {
        (self.precision == Precision::Bf16Autocast).then_some(DType::BF16)
    }

    fn gpt(&self) -> GptDims {
        GptDims {
            depth: self.depth,
            width: self.width,
            heads: self.heads,
            vocab: self.vocab,
            positions: self.positions,
        }
    }

    /// Rejects parameters that make no sense or would overflow (every product of sizes
    /// stays far below 2^63 when all checks pass).
    pub fn check(&self) -> Result<(), TraceError> {
        let bad = |w: String| Err(TraceError::Param(w));
        let ranges: [(&str, u64, u64, u64); 9] = [
            ("batch", self.batch, 1, 1 << 16),
            ("seq", self.seq, 1, 1 << 17),
            ("image", self.image, 32, 1 << 13),
            ("width", self.width, 1, 1 << 16),
            ("depth", self.depth, 1, 1 << 10),
            ("vocab", self.vocab, 1, 1 << 22),
            ("positions", self.positions, 1, 1 << 17),
            ("classes", self.classes, 1, 1 << 22),
            ("in_features", self.in_features, 1, 1 << 20),
        ];
        for (name, v, lo, hi) in ranges {
            if v < lo || v > hi {
                return bad(format!("{name} = {v} outside {lo}..={hi}"));
            }
        }
        if self.iterations == 0 || self.iterations > 100_000 {
            return bad(format!(
                "iterations = {} outside 1..=100000",
                self.iterations
            ));
        }
        let mut sizes = vec![self.batch];
        if let Some(d) = &self.dynamic {
            sizes.extend(&d.values);
        }
        sizes.extend(&self.generation.batches);
        sizes.extend(&self.generation.prompts);
        sizes.extend(&self.generation.new_tokens);
        if sizes.iter().any(|&x| x > 1 << 17) {
            return bad("a dynamic or generation size exceeds 131072".into());
        }
        // Largest tensors: logits b*s*V, MLP hidden b*s*4w, CNN stem b*w*(i/2)^2, as f64.
        let b = sizes.iter().copied().max().unwrap_or(1) as f64;
        let s = self.seq.max(self.positions) as f64;
        let big = [
            b * s * self.vocab.max(4 * self.width) as f64 * 4.0,
            b * self.width as f64 * (self.image as f64 / 2.0).powi(2) * 16.0,
            b * self.in_features.max(self.width) as f64 * 4.0,
        ];
        if big.iter().any(|&x| x > 1e14) {
            return bad("the workload would need tensors over 100 TB".into());
        }
        if self.mode == Mode::Generate && self.family != Family::Transformer {
            return bad("generation needs the transformer family".into());
        }
        if let Some(d) = &self.dynamic {
            let applies = match d.param {
                DynParam::Batch => true,
                DynParam::Seq => matches!(self.family, Family::Transformer | Family::Bert),
                DynParam::Image => matches!(self.family, Family::Cnn | Family::MobileNet),
            };
            if !applies {
                return bad(format!(
                    "a dynamic {:?} does not apply to the {:?} family (seq: transformer, bert; image: cnn, mobilenet; batch: all)",
                    d.param, self.family
                )
                .to_lowercase());
            }
            if self.mode == Mode::Generate {
                return bad("a dynamic shape does not apply to generation, which draws each request's batch, prompt and new tokens (--gen-batches, --gen-prompts, --gen-new-tokens)".into());
            }
        }
        if matches!(self.family, Family::Transformer | Family::Bert) {
            let mut need = self.seq;
            if let Some(d) = self.dynamic.as_ref().filter(|d| d.param == DynParam::Seq) {
                need = d.values.iter().copied().max().unwrap_or(need);
            }
            if self.mode == Mode::Generate {
                let p = self.generation.prompts.iter().max().copied().unwrap_or(0);
                let n = self
                    .generation
                    .new_tokens
                    .iter()
                    .max()
                    .copied()
                    .unwrap_or(0);
                need = p + n;
            }
            if need > self.positions {
                return bad(format!(
                    "sequence {need} exceeds positions {}",
                    self.positions
                ));
            }
        }
        Ok(())
    }

    /// A short name for the trace, e.g. `synth_transformer_b8_s1024_bf16_adamw_train`.
    pub fn name(&self) -> String {
        let fam = format!("{:?}", self.family).to_lowercase();
        let shape = match self.family {
            _ if self.mode == Mode::Generate => format!("d{}_w{}", self.depth, self.width),
            Family::Mlp => format!("b{}_w{}_d{}", self.batch, self.width, self.depth),
            Family::Cnn => format!("d{}_b{}_i{}", self.depth, self.batch, self.image),
            Family::MobileNet => format!("w{}_b{}_i{}", self.width, self.batch, self.image),
            Family::Transformer | Family::Bert => format!(
                "d{}_w{}_b{}_s{}",
                self.depth, self.width, self.batch, self.seq
            ),
        };
        let prec = match self.precision {
            Precision::Fp32 => "fp32",
            Precision::Bf16Autocast => "bf16",
        };
        let dynamic = match &self.dynamic {
            Some(d) => format!("_dyn{:?}", d.param).to_lowercase(),
            None => String::new(),
        };
        let mode = format!("{:?}", self.mode).to_lowercase();
        format!("synth_{fam}_{shape}_{prec}{dynamic}_{mode}")
    }

    fn build(&self, shape: IterShape, train: bool) -> Result<Graph, TraceError> {
        let ac = self.autocast();
        let g = match self.family {
            Family::Mlp => families::mlp::build(
                MlpDims {
                    in_features: self.in_features,
                    width: self.width,
                    depth: self.depth,
                    classes: self.classes,
                },
                shape,
                ac,
                train,
            ),
            Family::Cnn => families::cnn::build(
                CnnDims {
                    depth: self.depth,
                    width: self.width,
                    classes: self.classes,
                },
                shape,
                ac,
                train,
            )?,
            Family::Transformer => families::transformer::build(self.gpt(), shape, ac, train)?,
            Family::Bert => families::bert::build(self.gpt(), shape, ac, train)?,
            Family::MobileNet => {
                families::mobilenet::build(self.width, self.classes, shape, ac, train)?
            }
        };
        g.check_invariants()?;
        Ok(g)
    }
}

/// Generates the synthetic trace of `cfg`: static blocks (parameters, optimizer state,
/// module buffers, workspaces), then per iteration a boundary and its events, and a
/// final boundary. Validated before it is returned.
pub fn generate(cfg: &SynthConfig) -> Result<Trace, TraceError> {
    cfg.check()?;
    let train = cfg.mode == Mode::Train;
    let opt = train.then_some(cfg.optimizer);
    let mut ex = expand::Expander::new(cfg.cost, opt, &cfg.workspaces);
    let mut rng = SplitMix64::new(cfg.seed);
    let base = IterShape {
        batch: cfg.batch,
        seq: cfg.seq,
        image: cfg.image,
    };
    let mut size = SizeCheck::default();
    if cfg.mode == Mode::Generate {
        let reqs = cfg.generation.draw(cfg.iterations, &mut rng)?;
        for (i, r) in reqs.into_iter().enumerate() {
            generation::request(&mut ex, cfg.gpt(), cfg.autocast(), r)?;
            size.check(&ex.p, i + 1, cfg.iterations)?;
        }
    } else {
        let shapes = schedule::shapes(base, cfg.dynamic.as_ref(), cfg.iterations, &mut rng)?;
        let mut graphs: HashMap<IterShape, Graph> = HashMap::new();
        let mut done = 0;
        for s in shapes {
            let g = match graphs.entry(s) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(cfg.build(s, train)?),
            };
            if train {
                ex.train_iteration(g)?;
            } else {
                ex.infer_iteration(g)?;
            }
            done += 1;
            size.check(&ex.p, done, cfg.iterations)?;
        }
    }
    ex.p.boundary();
    let live = liveness::analyze(&ex.p)?;
    let meta = TraceMeta {
        name: cfg.name(),
        source: format!("synthetic:{:?}", cfg.family).to_lowercase(),
        description: serde_json::to_string(cfg).unwrap_or_default(),
    };
    let times = timeline::schedule(&ex.p, &cfg.cost);
    let trace = liveness::emit(&ex.p, &live, &times, meta);
    trace.validate()?;
    Ok(trace)
}

/// The events a program will emit, counted as it grows, against [`MAX_SYNTH_EVENTS`].
#[derive(Default)]
struct SizeCheck {
    steps: usize,
    events: u64,
}

impl SizeCheck {
    fn check(&mut self, p: &program::Program, done: usize, of: usize) -> Result<(), TraceError> {
        for st in &p.steps[self.steps..] {
            // An alloc and its free, every access, the boundaries.
            self.events += (2 * st.allocs.len() + st.reads.len() + st.writes.len()) as u64
                + u64::from(st.boundary);
        }
        self.steps = p.steps.len();
        if self.events > MAX_SYNTH_EVENTS {
            let per = self.events / done as u64;
            return Err(TraceError::Limit {
                what: format!(
                    "the synthetic trace passes {MAX_SYNTH_EVENTS} events after {done} of {of} iterations (about {per} each; limit MAX_SYNTH_EVENTS): ask for at most {} iterations",
                    (MAX_SYNTH_EVENTS / per.max(1)).max(1)
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
