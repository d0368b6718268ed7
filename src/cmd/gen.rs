//! `memcast trace gen`: a synthetic trace from a computation graph, written in the native
//! format. Every size defaults to the family's preset (MLP 1024 -> 4096 x 4 -> 1000;
//! ResNet-50 batch 64 at 224x224, fp32, SGD; GPT-2 small batch 8 x 1024, bf16, AdamW;
//! BERT-base batch 32 x 128, fp32, AdamW; MobileNetV3-Large batch 128 at 224x224, fp32,
//! SGD).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use memcast_trace::native::{save_with, WriteOptions};
use memcast_trace::stats::{human_bytes, TraceStats};
use memcast_trace::synth::{
    generate, DynParam, Dynamic, Family, Mode, Optimizer, Precision, SynthConfig,
};

#[derive(Clone, Copy, ValueEnum)]
pub enum FamilyArg {
    Mlp,
    /// ResNet (bottleneck blocks from depth 50).
    Cnn,
    /// GPT-2-style decoder.
    Transformer,
    /// BERT-style encoder, masked-LM pre-training.
    Bert,
    /// MobileNetV3-Large.
    Mobilenet,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Training iterations: forward, backward, optimizer step.
    Train,
    /// Inference forwards without autograd.
    Infer,
    /// KV-cached greedy generation requests (transformer).
    Generate,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    Fp32,
    /// bf16 autocast: fp32 master weights, bf16 matmul activations.
    Bf16,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OptimizerArg {
    /// SGD with momentum (one state buffer per parameter).
    Sgd,
    /// AdamW (two state buffers per parameter).
    Adamw,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DynamicArg {
    Batch,
    Seq,
    Image,
}

#[derive(clap::Args)]
pub struct GenArgs {
    /// Model family.
    #[arg(long, value_enum)]
    pub family: FamilyArg,
    /// What to record.
    #[arg(long, value_enum, default_value = "train")]
    pub mode: ModeArg,
    /// Batch size (rows, images or sequences).
    #[arg(long)]
    pub batch: Option<u64>,
    /// Sequence length (transformer, bert).
    #[arg(long)]
    pub seq: Option<u64>,
    /// Square image side in pixels (cnn).
    #[arg(long)]
    pub image: Option<u64>,
    /// Hidden width (mlp), base channels (cnn; mobilenet: 16 = standard), model width
    /// (transformer, bert).
    #[arg(long)]
    pub width: Option<u64>,
    /// Hidden layers (mlp), ResNet depth 18/34/50/101/152 (cnn), blocks (transformer, bert).
    #[arg(long)]
    pub depth: Option<u64>,
    /// Attention heads (transformer, bert).
    #[arg(long)]
    pub heads: Option<u64>,
    /// Vocabulary size (transformer, bert).
    #[arg(long)]
    pub vocab: Option<u64>,
    /// Position-embedding rows, the longest sequence (transformer, bert).
    #[arg(long)]
    pub positions: Option<u64>,
    /// Output classes (mlp, cnn).
    #[arg(long)]
    pub classes: Option<u64>,
    /// Input features (mlp).
    #[arg(long)]
    pub in_features: Option<u64>,
    /// Precision (default: the family preset's).
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Optimizer of a training run (default: the family preset's).
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerArg>,
    /// Iterations: training steps, inference batches or generation requests.
    #[arg(long, default_value_t = 8)]
    pub iterations: usize,
    /// Seed of the per-iteration choices; the same seed gives the same trace.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Draw this shape parameter per iteration from `--values`.
    #[arg(long, value_enum, requires = "values")]
    pub dynamic: Option<DynamicArg>,
    /// Choices for `--dynamic`, e.g. `64,128,256,512`.
    #[arg(long, value_delimiter = ',', requires = "dynamic")]
    pub values: Vec<u64>,
    /// Take `--values` in order (repeating) instead of drawing them: replays a schedule.
    #[arg(long, requires = "dynamic")]
    pub in_order: bool,
    /// Generation: batch choices per request.
    #[arg(long, value_delimiter = ',')]
    pub gen_batches: Vec<u64>,
    /// Generation: prompt-length choices per request.
    #[arg(long, value_delimiter = ',')]
    pub gen_prompts: Vec<u64>,
    /// Generation: new-token-count choices per request.
    #[arg(long, value_delimiter = ',')]
    pub gen_new_tokens: Vec<u64>,
    /// Output trace (native format).
    #[arg(short, long)]
    pub output: PathBuf,
    /// zstd level for the output, 1..=22 (0 = uncompressed).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(i32).range(0..=22))]
    pub zstd: i32,
    /// Print the full configuration as JSON before generating.
    #[arg(long)]
    pub print_config: bool,
}

impl GenArgs {
    /// The family preset with every given option applied.
    pub fn config(&self) -> SynthConfig {
        let family = match self.family {
            FamilyArg::Mlp => Family::Mlp,
            FamilyArg::Cnn => Family::Cnn,
            FamilyArg::Transformer => Family::Transformer,
            FamilyArg::Bert => Family::Bert,
            FamilyArg::Mobilenet => Family::MobileNet,
        };
        let mut c = SynthConfig::preset(family);
        c.mode = match self.mode {
            ModeArg::Train => Mode::Train,
            ModeArg::Infer => Mode::Infer,
            ModeArg::Generate => Mode::Generate,
        };
        let set = |slot: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut c.batch, self.batch);
        set(&mut c.seq, self.seq);
        set(&mut c.image, self.image);
        set(&mut c.width, self.width);
        set(&mut c.depth, self.depth);
        set(&mut c.heads, self.heads);
        set(&mut c.vocab, self.vocab);
        set(&mut c.positions, self.positions);
        set(&mut c.classes, self.classes);
        set(&mut c.in_features, self.in_features);
        if let Some(d) = self.dtype {
            c.precision = match d {
                DtypeArg::Fp32 => Precision::Fp32,
                DtypeArg::Bf16 => Precision::Bf16Autocast,
            };
        }
        if let Some(o) = self.optimizer {
            c.optimizer = match o {
                OptimizerArg::Sgd => Optimizer::SgdMomentum,
                OptimizerArg::Adamw => Optimizer::AdamW,
            };
        }
        c.iterations = self.iterations;
        c.seed = self.seed;
        c.dynamic = self.dynamic.map(|d| Dynamic {
            param: match d {
                DynamicArg::Batch => DynParam::Batch,
                DynamicArg::Seq => DynParam::Seq,
                DynamicArg::Image => DynParam::Image,
            },
            values: self.values.clone(),
            in_order: self.in_order,
        });
        for (slot, given) in [
            (&mut c.generation.batches, &self.gen_batches),
            (&mut c.generation.prompts, &self.gen_prompts),
            (&mut c.generation.new_tokens, &self.gen_new_tokens),
        ] {
            if !given.is_empty() {
                *slot = given.clone();
            }
        }
        c
    }
}

/// Options that the family or mode asked for cannot use are errors, not ignored.
fn check_applies(a: &GenArgs) -> Result<()> {
    use FamilyArg::*;
    let fam = a.family;
    let families = |ok: &[FamilyArg]| {
        ok.iter()
            .any(|f| std::mem::discriminant(f) == std::mem::discriminant(&fam))
    };
    let given: [(&str, bool, &[FamilyArg]); 8] = [
        ("--depth", a.depth.is_some(), &[Mlp, Cnn, Transformer, Bert]),
        ("--seq", a.seq.is_some(), &[Transformer, Bert]),
        ("--image", a.image.is_some(), &[Cnn, Mobilenet]),
        ("--heads", a.heads.is_some(), &[Transformer, Bert]),
        ("--vocab", a.vocab.is_some(), &[Transformer, Bert]),
        ("--positions", a.positions.is_some(), &[Transformer, Bert]),
        ("--classes", a.classes.is_some(), &[Mlp, Cnn, Mobilenet]),
        ("--in-features", a.in_features.is_some(), &[Mlp]),
    ];
    for (name, set, ok) in given {
        if set && !families(ok) {
            let names: Vec<String> = ok
                .iter()
                .filter_map(|f| f.to_possible_value().map(|v| v.get_name().to_string()))
                .collect();
            bail!("{name} applies to the {} families only", names.join(", "));
        }
    }
    let generate = matches!(a.mode, ModeArg::Generate);
    // Generation draws each request's batch and prompt (--gen-batches, --gen-prompts).
    for (name, set) in [("--batch", a.batch.is_some()), ("--seq", a.seq.is_some())] {
        if set && generate {
            bail!("{name} does not apply to --mode generate, which draws each request's batch and prompt (--gen-batches, --gen-prompts)");
        }
    }
    for (name, set) in [
        ("--gen-batches", !a.gen_batches.is_empty()),
        ("--gen-prompts", !a.gen_prompts.is_empty()),
        ("--gen-new-tokens", !a.gen_new_tokens.is_empty()),
    ] {
        if set && !generate {
            bail!("{name} applies to --mode generate only");
        }
    }
    if a.optimizer.is_some() && !matches!(a.mode, ModeArg::Train) {
        bail!("--optimizer applies to --mode train only");
    }
    Ok(())
}

pub fn run(args: GenArgs) -> Result<()> {
    check_applies(&args)?;
    memcast_trace::output::check(&args.output)?;
    let cfg = args.config();
    if args.print_config {
        out!("{}", serde_json::to_string_pretty(&cfg)?);
    }
    let busy = super::progress::Busy::new("generating the synthetic trace");
    let trace = generate(&cfg).context("generating the synthetic trace")?;
    drop(busy);
    let opts = WriteOptions {
        zstd_level: (args.zstd > 0).then_some(args.zstd),
    };
    save_with(&trace, &args.output, opts)?;
    let s = TraceStats::compute(&trace)?;
    out!(
        "{}: {} iterations, {} events ({} allocs), static {}, peak requested {} -> {}",
        trace.meta.name,
        s.iterations,
        s.events,
        s.allocs,
        human_bytes(s.static_bytes),
        human_bytes(s.peak_requested_bytes),
        args.output.display()
    );
    Ok(())
}
