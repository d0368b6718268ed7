//! `memcast replay <TRACE> --policy memcast|pytorch|naive [--device sim|host|cuda] [--json]`:
//! replays a trace (PyTorch snapshot, native, synthetic) through an allocator policy and
//! prints the metrics of DESIGN.md (`memcast_alloc::replay`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use memcast_alloc::config::AllocConfig;
use memcast_alloc::replay::{replay, Device, Policy, ReplayOptions, ReplayReport};
use memcast_trace::stats::human_bytes;

// `--policy reactive --budget B`: the tiered replay (issue 5), in its own file.
#[path = "replay_tiered.rs"]
mod tiered;
// `--device cuda`: the measured device calls beside the sim's costs, in its own file.
#[path = "replay_cuda.rs"]
mod cuda;

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum PolicyArg {
    /// memcast's allocator (configured by --conf or MEMCAST_ALLOC_CONF).
    Memcast,
    /// An emulation of PyTorch's CUDACachingAllocator (native mode).
    Pytorch,
    /// One device allocation per request.
    Naive,
    /// Tiered memory under `--budget`: memcast's allocator, spilling to host memory and
    /// prefetching back (reactive policies: LRU-K spill, previous-iteration prefetch).
    Reactive,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum DeviceArg {
    /// Simulated H200: any capacity, measured device-call costs, no real memory.
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
    /// Device backend.
    #[arg(long, value_enum, default_value = "sim")]
    pub device: DeviceArg,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// memcast allocator settings, `key:value,...` (over MEMCAST_ALLOC_CONF).
    #[arg(long)]
    pub conf: Option<String>,
    /// Device budget in bytes or as a fraction of peak requested bytes (tiered
    /// replay: issue 5).
    #[arg(long)]
    pub budget: Option<String>,
    /// Run the allocator's invariant check every N events (slow; 0 = never).
    #[arg(long, default_value_t = 0)]
    pub check_every: u64,
    /// With `--policy reactive`: no prefetching (every use of a spilled tensor waits).
    #[arg(long)]
    pub no_prefetch: bool,
    #[command(flatten)]
    pub import: ReplayImportArgs,
}

/// How to read PyTorch snapshots (`trace`'s import options; the CUDA device index is
/// `--cuda-device` here because `--device` picks the replay backend).
#[derive(clap::Args, Clone)]
pub struct ReplayImportArgs {
    /// Allocation size (bytes) that marks an iteration boundary in PyTorch snapshots.
    #[arg(long, default_value_t = memcast_trace::snapshot::DEFAULT_MARKER_BYTES)]
    pub marker_bytes: u64,
    /// Do not treat marker allocations as iteration boundaries (replay them).
    #[arg(long)]
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
            device: self.cuda_device,
        }
        .load(path)
    }
}

pub fn run(args: ReplayArgs) -> Result<()> {
    if matches!(args.policy, PolicyArg::Reactive) || args.budget.is_some() {
        return tiered::run(&args);
    }
    let trace = args.import.load(&args.trace)?;
    let mut config = AllocConfig::from_env().context("MEMCAST_ALLOC_CONF")?;
    if let Some(c) = &args.conf {
        config = config.with_conf_string(c).context("--conf")?;
    }
    let opts = ReplayOptions {
        policy: match args.policy {
            PolicyArg::Memcast => Policy::Memcast,
            PolicyArg::Pytorch => Policy::Pytorch,
            PolicyArg::Naive => Policy::Naive,
            PolicyArg::Reactive => bail!("--policy reactive goes to the tiered replay"),
        },
        device: match args.device {
            DeviceArg::Sim => Device::Sim,
            DeviceArg::Host => Device::Host,
            DeviceArg::Cuda => Device::Cuda,
        },
        config,
        check_every: args.check_every,
        ..Default::default()
    };
    let report = replay(&trace, &opts)
        .with_context(|| format!("replay of {} failed", args.trace.display()))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &ReplayReport) {
    let policy = serde_json::to_value(r.policy).unwrap_or_default();
    let device = serde_json::to_value(r.device).unwrap_or_default();
    println!("trace             {}", r.trace);
    println!(
        "policy / device   {} / {}",
        policy.as_str().unwrap_or("?"),
        device.as_str().unwrap_or("?")
    );
    println!(
        "events            {} ({} allocs, {} frees, {} static blocks)",
        r.events, r.allocs, r.frees, r.static_blocks
    );
    println!("peak requested    {}", human_bytes(r.peak_requested_bytes));
    println!("peak reserved     {}", human_bytes(r.peak_reserved_bytes));
    println!("reserved overhead {:.2}%", 100.0 * r.reserved_overhead);
    println!(
        "device allocs     {} ({} frees)",
        r.device_allocs, r.device_frees
    );
    println!(
        "fragmentation     max {:.2}, at peak {:.2}",
        r.max_fragmentation, r.fragmentation_at_peak
    );
    println!("device time       {:.1} ms", r.device_time_us / 1e3);
    println!("replay speed      {:.2} M events/s", r.events_per_sec / 1e6);
    cuda::print_calls(r);
}
