//! `memcast replay <TRACE> --policy memcast|predictive|pytorch|naive [--device sim|host|cuda]
//! [--json]`: replays a trace (PyTorch snapshot, native, synthetic) through an allocator
//! policy and prints its metrics (`memcast_alloc::replay`); `--compare a,b,...` replays
//! several policies and prints them side by side (one JSON object keyed by policy).
//! With `--budget`, the tiered replay (spill and prefetch) in `replay_tiered.rs`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use memcast_alloc::backend::sim::CostModel;
use memcast_alloc::config::{AllocConfig, ForecasterKind};
use memcast_alloc::replay::{
    replay, Device, Policy, ReplayForecaster, ReplayOptions, ReplayReport,
};
use memcast_trace::stats::human_bytes;

// `--budget B`: the tiered replay (spill and prefetch), in its own file.
#[path = "replay_tiered.rs"]
mod tiered;
// `--device cuda`: the measured device calls beside the sim's costs, in its own file.
#[path = "replay_cuda.rs"]
mod cuda;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyArg {
    /// memcast's allocator (configured by --conf or MEMCAST_ALLOC_CONF); under
    /// --budget, with the reactive spill and prefetch policies.
    Memcast,
    /// memcast's allocator in predictive mode: a forecaster (--forecaster) drives
    /// growth and release ahead of need, and under --budget spill and prefetch.
    Predictive,
    /// An emulation of PyTorch's CUDACachingAllocator (native mode).
    Pytorch,
    /// One device allocation per request.
    Naive,
    /// Tiered memory under `--budget`: memcast's allocator, spilling to host memory and
    /// prefetching back (reactive policies: LRU-K spill, previous-iteration prefetch).
    /// The same as `memcast` with a budget.
    Reactive,
}

/// One name of `--compare`'s list: an empty one (an empty argument, two commas, or a
/// comma at an end) is named as such (clap's own parser calls it a missing value);
/// `--help` lists the policies as for `--policy`.
#[derive(Clone)]
struct CompareItem;

impl clap::builder::TypedValueParser for CompareItem {
    type Value = PolicyArg;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<PolicyArg, clap::Error> {
        if value.to_string_lossy().trim().is_empty() {
            return Err(cmd.clone().error(
                clap::error::ErrorKind::InvalidValue,
                "--compare: an empty policy name (an empty argument, or a comma too many)",
            ));
        }
        clap::builder::EnumValueParser::<PolicyArg>::new().parse_ref(cmd, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            PolicyArg::value_variants()
                .iter()
                .filter_map(ValueEnum::to_possible_value),
        ))
    }
}

impl PolicyArg {
    pub fn name(&self) -> &'static str {
        match self {
            PolicyArg::Memcast => "memcast",
            PolicyArg::Predictive => "predictive",
            PolicyArg::Pytorch => "pytorch",
            PolicyArg::Naive => "naive",
            PolicyArg::Reactive => "reactive",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForecasterArg {
    /// The embedded LSTM (--model, or the default model built into memcast).
    Lstm,
    /// The featurizer's copy-and-rescale base: the previous iteration at the same
    /// phase, rescaled by this iteration's demand so far. No learning.
    Seasonal,
    /// The trace's true future: the upper bound of what any forecast can give.
    Oracle,
    /// No forecast: predictive mode's bookkeeping with reactive decisions.
    None,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum DeviceArg {
    /// Simulated GPU: an H200's capacity, the measured device-call and copy costs of
    /// --costs (the H200's by default), no real memory.
    Sim,
    /// Real host memory (pages are touched only when written).
    Host,
    /// A real NVIDIA GPU (device 0) through the CUDA driver: real device calls,
    /// measured latencies beside the sim's costs.
    Cuda,
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trace file (PyTorch snapshot pickle, optionally .xz, or native).
    pub trace: PathBuf,
    /// Allocator policy.
    #[arg(long, value_enum, default_value = "memcast")]
    pub policy: PolicyArg,
    /// Replay several policies (comma-separated, e.g. `memcast,predictive`) and print
    /// them side by side; with --json one object keyed by policy name.
    #[arg(long, value_delimiter = ',', value_parser = CompareItem, conflicts_with = "policy")]
    pub compare: Vec<PolicyArg>,
    /// Forecaster of --policy predictive.
    #[arg(long, value_enum)]
    pub forecaster: Option<ForecasterArg>,
    /// Model of the lstm forecaster: an artifact directory from `memcast train` or a
    /// .safetensors file (default: the model built into memcast).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Device backend.
    #[arg(long, value_enum, default_value = "sim")]
    pub device: DeviceArg,
    /// The simulated device's costs (device calls, copies, the link both ways), used by
    /// `--device sim`, set beside the measured calls of `--device cuda`, and under
    /// --budget by the policies and floors on every device:
    /// `h200` or `h100`, each measured on that GPU, or a JSON file of a cost model (its
    /// fields: docs/cost-model-h100.json). Default: under `--device cuda` the model of
    /// the GPU the driver names (the H200's, with a warning, for another GPU), else
    /// the H200's.
    #[arg(long, value_name = "h200|h100|FILE")]
    pub costs: Option<String>,
    /// Replay at the trace's own pace (it takes the trace's span): predictive mode
    /// keeps its forecast thread, so forecasts arrive as late as in the job. Without
    /// it, as fast as possible with the forecaster in step. Not under --budget.
    #[arg(long)]
    pub real_time: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// memcast allocator settings, `key:value,...` (over MEMCAST_ALLOC_CONF).
    #[arg(long)]
    pub conf: Option<String>,
    /// Device budget: a share of the trace's peak requested bytes (`60%`, or `0.6`: a
    /// number with a point, at most 1) or bytes (`12G`, `512M`, `123456`): the tiered
    /// replay, with spill and prefetch.
    #[arg(long)]
    pub budget: Option<String>,
    /// Run the allocator's invariant check every N events (slow; 0 = never).
    #[arg(long, default_value_t = 0)]
    pub check_every: u64,
    /// With --budget: no prefetching (every use of a spilled tensor waits).
    #[arg(long)]
    pub no_prefetch: bool,
    /// With --budget: no single arena (the allocator grows and releases fixed
    /// segments under the budget as without one; by default the budget is reserved as
    /// one segment, so that pressure frees and re-creates none).
    #[arg(long)]
    pub no_arena: bool,
    /// With --budget: no relocation (the out-of-memory path does not move a window's
    /// tensors elsewhere on the device before it spills).
    #[arg(long)]
    pub no_relocate: bool,
    /// With --budget and predictive tiers: no step plans (past the end of an
    /// iteration plan's trajectory, the token steps of a request longer than the one
    /// planned run without a plan of their own).
    #[arg(long)]
    pub no_step_plans: bool,
    /// With --budget and predictive tiers: no plans for a new shape (an iteration of
    /// an input shape not seen before runs under the previous iteration's plan instead
    /// of one morphed from an earlier iteration to its bytes).
    #[arg(long)]
    pub no_new_shape_plans: bool,
    /// With --budget: spills that nothing waits for (the watermark's batches, spills
    /// ahead of a forecast, planned moves) may go to pageable memory when the pinned
    /// pool has no room (by default such a spill is not issued then: a copy to pageable
    /// memory holds the host until it is done).
    #[arg(long)]
    pub early_pageable: bool,
    /// With --budget: spills in flight count as gone at the high watermark, so that a
    /// batch is spilled once the mark is crossed and none until it is crossed again (by
    /// default each allocation above the mark while a batch is in flight spills up to
    /// its own size; much faster to replay with many live tensors: docs/tiers.md,
    /// "Spill hysteresis").
    #[arg(long)]
    pub spill_hysteresis: bool,
    /// With --budget: the pinned host pool that spills go to, written as --budget is
    /// (a share of the trace's peak requested bytes, or bytes); default: the peak
    /// (what is off the device can exceed `peak - budget` while copies are in flight).
    /// What does not fit goes to pageable memory, whose copies hold the host.
    #[arg(long, value_name = "POOL")]
    pub pinned: Option<String>,
    /// With --budget: take compute time from the GPU's timeline as modelled from the
    /// trace: each iteration's final wait (where a host that ran ahead of the GPU
    /// waited at a synchronization; `memcast trace stats` shows it) spread over the
    /// iteration's events, instead of the event times as recorded.
    #[arg(long)]
    pub spread_waits: bool,
    /// With --budget: the spill watermarks, `HIGH,LOW` (shares of the budget; default
    /// 0.9,0.8): spilling starts when allocated bytes would pass HIGH and goes down to
    /// LOW.
    #[arg(long, value_name = "HIGH,LOW")]
    pub watermarks: Option<String>,
    /// With --budget: execute this plan (a `memcast-plan` JSON document of spills,
    /// prefetches and drops by trace event, e.g. written by memcast_torch's
    /// `Offload.write_trace`) instead of the reactive prefetcher.
    #[arg(long)]
    pub plan: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub import: ReplayImportArgs,
}

/// How to read PyTorch snapshots (`trace`'s import options; `--device` picks the replay
/// backend).
#[derive(clap::Args, Clone)]
pub struct ReplayImportArgs {
    /// Allocation size (bytes) that marks an iteration boundary in PyTorch snapshots.
    #[arg(long, default_value_t = memcast_trace::snapshot::DEFAULT_MARKER_BYTES)]
    pub marker_bytes: u64,
    /// Do not treat marker allocations as iteration boundaries (replay them).
    #[arg(long, conflicts_with = "marker_bytes")]
    pub no_markers: bool,
    /// Which CUDA device's events to read from a snapshot.
    #[arg(long, default_value_t = 0)]
    pub cuda_device: usize,
}

impl ReplayImportArgs {
    pub fn load(&self, path: &std::path::Path) -> Result<memcast_trace::Trace> {
        super::trace::ImportArgs {
            marker_bytes: self.marker_bytes,
            no_markers: self.no_markers,
            cuda_device: self.cuda_device,
        }
        .load(path)
    }
}

/// Prints the reports: one JSON object (keyed by policy name under `--compare`) with
/// `--json`, else a table each.
pub fn print_reports<R: serde::Serialize>(
    args: &ReplayArgs,
    costs: &Costs,
    reports: &[(&str, R)],
    table: fn(&R),
) -> Result<()> {
    if args.json {
        // Each object names the cost model its figures assumed, where one was used,
        // and under --device cuda the GPU.
        let (label, gpu) = (costs_apply(args).then_some(&costs.label), &costs.gpu);
        let value = |r: &R| -> Result<serde_json::Value> {
            let mut v = serde_json::to_value(r)?;
            if let Some(o) = v.as_object_mut() {
                if let Some(c) = label {
                    o.insert("costs".into(), c.clone().into());
                }
                if let Some(g) = gpu {
                    o.insert("gpu".into(), g.clone().into());
                }
            }
            Ok(v)
        };
        if args.compare.is_empty() {
            out!("{}", value(&reports[0].1)?);
        } else {
            let obj: serde_json::Map<String, serde_json::Value> = reports
                .iter()
                .map(|(n, r)| Ok((n.to_string(), value(r)?)))
                .collect::<Result<_>>()?;
            out!("{}", serde_json::Value::Object(obj));
        }
    } else {
        for (i, (_, r)) in reports.iter().enumerate() {
            if i > 0 {
                out!("");
            }
            table(r);
        }
        if let Some(g) = &costs.gpu {
            out!("gpu               {g}");
            out!(
                "costs             {} (the model beside the measured calls)",
                costs.label
            );
        }
    }
    Ok(())
}

/// The policies to replay: `--compare`'s, else `--policy`.
fn policies(args: &ReplayArgs) -> Vec<PolicyArg> {
    if args.compare.is_empty() {
        vec![args.policy]
    } else {
        args.compare.clone()
    }
}

/// Checks that every option given applies to what is replayed.
fn check_options(args: &ReplayArgs) -> Result<()> {
    let ps = policies(args);
    // One JSON key per policy: a policy named twice would be replayed twice and
    // printed under one key.
    let twice = (ps.iter().enumerate()).find_map(|(i, p)| ps[..i].contains(p).then_some(p));
    if let Some(p) = twice {
        bail!("--compare names {} twice", p.name());
    }
    if args.budget.is_some()
        && ps.contains(&PolicyArg::Memcast)
        && ps.contains(&PolicyArg::Reactive)
    {
        bail!("--compare names memcast and reactive, which under --budget are one replay (the reactive tiers): name one");
    }
    let predictive = ps.contains(&PolicyArg::Predictive);
    if args.forecaster.is_some() && !predictive {
        bail!("--forecaster applies to --policy predictive only");
    }
    if args.model.is_some() {
        if !predictive {
            bail!("--model applies to --policy predictive only");
        }
        if !matches!(args.forecaster, None | Some(ForecasterArg::Lstm)) {
            bail!("--model applies to the lstm forecaster only");
        }
    }
    if args.no_prefetch && args.budget.is_none() {
        bail!("--no-prefetch applies to a replay under --budget only");
    }
    if args.plan.is_some() && args.budget.is_none() {
        bail!("--plan applies to a replay under --budget only");
    }
    if args.no_arena && args.budget.is_none() {
        bail!("--no-arena applies to a replay under --budget only");
    }
    if args.no_relocate && args.budget.is_none() {
        bail!("--no-relocate applies to a replay under --budget only");
    }
    if args.no_new_shape_plans && args.budget.is_none() {
        bail!("--no-new-shape-plans applies to a replay under --budget only");
    }
    if args.no_step_plans && args.budget.is_none() {
        bail!("--no-step-plans applies to a replay under --budget only");
    }
    if args.early_pageable && args.budget.is_none() {
        bail!("--early-pageable applies to a replay under --budget only");
    }
    if args.spill_hysteresis && args.budget.is_none() {
        bail!("--spill-hysteresis applies to a replay under --budget only");
    }
    if args.pinned.is_some() && args.budget.is_none() {
        bail!("--pinned applies to a replay under --budget only");
    }
    if args.spread_waits && args.budget.is_none() {
        bail!("--spread-waits applies to a replay under --budget only");
    }
    if args.watermarks.is_some() && args.budget.is_none() {
        bail!("--watermarks applies to a replay under --budget only");
    }
    if args.real_time && args.budget.is_some() {
        bail!("--real-time applies to a replay without --budget only");
    }
    if args.costs.is_some() && !costs_apply(args) {
        bail!("--costs applies to --device sim or cuda, or to a replay under --budget");
    }
    if args.budget.is_none() && ps.contains(&PolicyArg::Reactive) {
        bail!("--policy reactive needs --budget (bytes such as 8G, or a share of the trace's peak requested bytes such as 0.6 or 60%)");
    }
    if args.conf.is_some()
        && ps
            .iter()
            .all(|p| matches!(p, PolicyArg::Pytorch | PolicyArg::Naive))
    {
        bail!(
            "--conf sets memcast's allocator, which --policy {} does not use",
            ps[0].name()
        );
    }
    // The environment variable may be set for the whole job: a warning, not an error.
    if std::env::var_os("MEMCAST_ALLOC_CONF").is_some()
        && ps
            .iter()
            .all(|p| matches!(p, PolicyArg::Pytorch | PolicyArg::Naive))
    {
        eprintln!(
            "warning: MEMCAST_ALLOC_CONF is ignored: --policy {} does not use memcast's allocator",
            ps[0].name()
        );
    }
    Ok(())
}

/// memcast's allocator settings: MEMCAST_ALLOC_CONF over `base`, then --conf, then
/// --model.
pub fn alloc_config(args: &ReplayArgs, base: AllocConfig) -> Result<AllocConfig> {
    let mut config = base;
    if let Ok(env) = std::env::var("MEMCAST_ALLOC_CONF") {
        config = config
            .with_conf_string(&env)
            .context("MEMCAST_ALLOC_CONF")?;
    }
    if let Some(c) = &args.conf {
        config = config.with_conf_string(c).context("--conf")?;
    }
    if let Some(m) = &args.model {
        config.model = Some(m.display().to_string());
    }
    if config.page_release != memcast_alloc::config::PageRelease::OnOom && !config.growable_segments
    {
        eprintln!(
            "warning: page_release applies to growable segments, which these settings do not use \
             (growable_segments:false{}): it changes nothing",
            if args.budget.is_some() {
                "; replays under --budget use fixed segments unless growable_segments:true"
            } else {
                ""
            }
        );
    }
    Ok(config)
}

/// Whether a cost model enters the figures: the simulated device's, the calls of
/// `--device cuda` compared with it, or the link under --budget (not `--device host`
/// alone).
fn costs_apply(args: &ReplayArgs) -> bool {
    args.budget.is_some() || !matches!(args.device, DeviceArg::Host)
}

/// The driver's name of GPU 0 under `--device cuda` (`None` elsewhere, or without a
/// driver).
fn gpu_name(args: &ReplayArgs) -> Option<String> {
    if !matches!(args.device, DeviceArg::Cuda) {
        return None;
    }
    memcast_alloc::backend::cuda::gpu_name(0).ok()
}

/// A replay's cost model, the label its JSON carries (`costs`) and, under `--device
/// cuda`, the driver's name of the GPU (`gpu`), looked up once.
pub struct Costs {
    pub label: String,
    pub model: CostModel,
    pub gpu: Option<String>,
}

/// The cost model `--costs` names: a built-in one by name, or a JSON file, checked
/// before use (`CostModel::validate`). Without `--costs`: under `--device cuda` the
/// model measured on the GPU the driver names (the H200's, with a warning, for a GPU
/// without one), else the H200's.
pub fn cost_model(args: &ReplayArgs) -> Result<Costs> {
    let gpu = gpu_name(args);
    let (label, model) = match &args.costs {
        None if matches!(args.device, DeviceArg::Cuda) => detected_costs(gpu.as_deref()),
        None => ("h200".into(), CostModel::default()),
        Some(spec) => match CostModel::named(spec) {
            Some(c) => (spec.to_ascii_lowercase(), c),
            None => {
                let text = memcast_trace::io::read_bounded_text(
                    std::path::Path::new(spec),
                    memcast_trace::limits::MAX_TEXT_FILE_BYTES,
                )
                .with_context(|| {
                    format!("--costs {spec}: not h200 or h100, and not a file to read")
                })?;
                let c: CostModel = serde_json::from_str(&text)
                    .with_context(|| format!("{spec}: not a cost model"))?;
                c.validate().map_err(|e| anyhow::anyhow!("{spec}: {e}"))?;
                (spec.clone(), c)
            }
        },
    };
    Ok(Costs { label, model, gpu })
}

/// The built-in model of the GPU the driver names. A GPU without one gets the H200's,
/// with a warning on stderr; so does a GPU the driver cannot name, silently (the
/// replay itself then reports why the GPU is unusable).
fn detected_costs(gpu: Option<&str>) -> (String, CostModel) {
    match gpu.and_then(CostModel::for_gpu) {
        Some((label, model)) => (label.into(), model),
        None => {
            if let Some(n) = gpu {
                eprintln!(
                    "warning: no cost model was measured on a {n}; the measured calls are \
                     set beside the H200's costs (--costs h200|h100|FILE chooses)"
                );
            }
            ("h200".into(), CostModel::default())
        }
    }
}

/// The forecaster of predictive mode: `--forecaster`, else the settings' `forecaster`
/// key (MEMCAST_ALLOC_CONF, then --conf); the flag wins, with a warning where the
/// settings name another.
pub fn forecaster(args: &ReplayArgs, config: &AllocConfig) -> ReplayForecaster {
    let from_settings = match config.forecaster {
        ForecasterKind::Lstm => ReplayForecaster::Lstm,
        ForecasterKind::Seasonal => ReplayForecaster::Seasonal,
        ForecasterKind::None => ReplayForecaster::None,
    };
    let Some(flag) = args.forecaster else {
        return from_settings;
    };
    let f = match flag {
        ForecasterArg::Lstm => ReplayForecaster::Lstm,
        ForecasterArg::Seasonal => ReplayForecaster::Seasonal,
        ForecasterArg::Oracle => ReplayForecaster::Oracle,
        ForecasterArg::None => ReplayForecaster::None,
    };
    if f != from_settings && config.forecaster != ForecasterKind::default() {
        eprintln!(
            "warning: --forecaster {} overrides forecaster:{} of the settings",
            f.name(),
            from_settings.name()
        );
    }
    f
}

/// Whether replaying `p` with `config` runs predictive mode: `--policy predictive`, or
/// memcast's allocator with `predictive:true` in its settings.
pub fn runs_predictive(config: &AllocConfig, p: PolicyArg) -> bool {
    p == PolicyArg::Predictive || (p == PolicyArg::Memcast && config.predictive)
}

/// Warns about --conf keys that only predictive mode reads when no replayed policy
/// runs it (those of MEMCAST_ALLOC_CONF may be set for a whole job, and are not named).
pub fn warn_unused_predictive_keys(args: &ReplayArgs, config: &AllocConfig) {
    let Some(conf) = &args.conf else { return };
    if policies(args).iter().any(|&p| runs_predictive(config, p)) {
        return;
    }
    let keys: Vec<&str> = conf
        .split(',')
        .filter_map(|item| Some(item.split_once(':')?.0.trim()))
        .filter(|k| memcast_alloc::config::PREDICTIVE_KEYS.contains(k))
        .collect();
    if !keys.is_empty() {
        eprintln!(
            "warning: --conf sets {} of predictive mode, which this replay does not run \
             (--policy predictive, or predictive:true): not used",
            keys.join(", ")
        );
    }
}

pub fn run(args: ReplayArgs) -> Result<()> {
    check_options(&args)?;
    if args.budget.is_some() {
        return tiered::run(&args);
    }
    let busy = super::progress::Busy::new(format!("loading {}", args.trace.display()));
    let trace = args.import.load(&args.trace)?;
    drop(busy);
    // PyTorch's emulation and the naive policy take no settings (check_options warned
    // if the environment holds some).
    let uses_memcast =
        (policies(&args).iter()).any(|p| !matches!(p, PolicyArg::Pytorch | PolicyArg::Naive));
    let config = if uses_memcast {
        alloc_config(&args, AllocConfig::default())?
    } else {
        AllocConfig::default()
    };
    warn_unused_predictive_keys(&args, &config);
    if args.real_time {
        // The replay takes the trace's span of wall time (per policy): said before it
        // starts, so that a long one is not a silent wait.
        let span_s = match (trace.events.first(), trace.events.last()) {
            (Some(a), Some(b)) => b.time_us.saturating_sub(a.time_us) as f64 / 1e6,
            _ => 0.0,
        };
        if span_s > 10.0 {
            eprintln!(
                "--real-time: the trace spans {span_s:.0} s, which each replayed policy takes"
            );
        }
    }
    let costs = cost_model(&args)?;
    let mut reports = Vec::new();
    for p in policies(&args) {
        let opts = ReplayOptions {
            policy: match p {
                PolicyArg::Memcast => Policy::Memcast,
                PolicyArg::Predictive => Policy::Predictive,
                PolicyArg::Pytorch => Policy::Pytorch,
                PolicyArg::Naive => Policy::Naive,
                PolicyArg::Reactive => bail!("--policy reactive goes to the tiered replay"),
            },
            device: match args.device {
                DeviceArg::Sim => Device::Sim,
                DeviceArg::Host => Device::Host,
                DeviceArg::Cuda => Device::Cuda,
            },
            config: config.clone(),
            check_every: args.check_every,
            forecaster: forecaster(&args, &config),
            costs: costs.model.clone(),
            real_time: args.real_time,
            ..Default::default()
        };
        let busy = super::progress::Busy::new(format!(
            "replaying {} ({}, {:?})",
            args.trace.display(),
            p.name(),
            args.device
        ));
        let report = replay(&trace, &opts)
            .with_context(|| format!("{} replay of {} failed", p.name(), args.trace.display()))?;
        drop(busy);
        reports.push((p.name(), report));
    }
    print_reports(&args, &costs, &reports, print_table)?;
    Ok(())
}

fn print_table(r: &ReplayReport) {
    let policy = serde_json::to_value(r.policy).unwrap_or_default();
    let device = serde_json::to_value(r.device).unwrap_or_default();
    out!("trace             {}", r.trace);
    out!(
        "policy / device   {} / {}{}",
        policy.as_str().unwrap_or("?"),
        device.as_str().unwrap_or("?"),
        if r.policy == Policy::Predictive {
            format!(" (forecaster {})", r.forecaster)
        } else {
            String::new()
        }
    );
    // `memcast trace stats` counts the trace's events; a replay also makes its static
    // blocks, so both counts are given.
    out!(
        "events            {} ({} of the trace and {} static blocks; {} allocs, {} frees)",
        r.events,
        r.events.saturating_sub(r.static_blocks),
        r.static_blocks,
        r.allocs,
        r.frees
    );
    out!("peak requested    {}", human_bytes(r.peak_requested_bytes));
    out!("peak reserved     {}", human_bytes(r.peak_reserved_bytes));
    out!(
        "reserved overhead {:.2}%  (peak reserved / peak requested - 1)",
        100.0 * r.reserved_overhead
    );
    out!(
        "mean reserved     {}  (time-weighted)",
        human_bytes(r.mean_reserved_bytes as u64)
    );
    out!(
        "device allocs     {} ({} frees); {} inside requests ({} after the first iteration), {} ahead of need",
        r.device_allocs,
        r.device_frees,
        r.critical_path_device_calls,
        r.critical_path_device_calls_after_first_iteration,
        r.ahead_device_calls
    );
    out!(
        "fragmentation     mean {:.3}, max {:.2}, at peak {:.2}  (1 - largest free block / free bytes)",
        r.mean_fragmentation, r.max_fragmentation, r.fragmentation_at_peak
    );
    if r.device == Device::Sim {
        out!(
            "device time       {:.1} ms, {:.1} ms of it inside requests",
            r.device_time_us / 1e3,
            r.critical_path_device_us / 1e3
        );
    } else {
        out!(
            "device time       not modelled on this device (the host time of its calls: {:.3} ms, {:.3} ms of it inside requests)",
            r.device_time_us / 1e3,
            r.critical_path_device_us / 1e3
        );
    }
    if r.pages_moved_per_iteration.iter().any(|&n| n > 0) {
        let list: Vec<String> = r
            .pages_moved_per_iteration
            .iter()
            .map(|n| n.to_string())
            .collect();
        out!(
            "pages moved       {} per iteration (released + backed again, page release)",
            list.join(" ")
        );
    }
    let p = &r.extra["placement"];
    if p.is_object() {
        out!(
            "placement         planned: {} at the profile's offset ({} not), {} at the plan's ({} not, {} keys unknown); {} plans",
            p["profile_hits"],
            p["profile_misses"],
            p["planned_hits"],
            p["planned_misses"],
            p["unplanned"],
            p["plans_kept"]
        );
    }
    out!("replay speed      {:.2} M events/s", r.events_per_sec / 1e6);
    cuda::print_calls(r);
}
