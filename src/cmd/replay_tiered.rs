//! `memcast replay <TRACE> --policy reactive --budget <BYTES|FRACTION> [--json]`: replays a
//! trace under a device budget with spilling to host memory and prefetching back
//! (`memcast_alloc::tier::replay_budgeted`). A budget too small for some step's working
//! set prints the report and fails with the error naming the step and the bytes short.

use anyhow::{bail, Context, Result};
use memcast_alloc::replay::Device;
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions, TierReport};
use memcast_trace::stats::human_bytes;

use super::{DeviceArg, PolicyArg, ReplayArgs};

pub fn run(args: &ReplayArgs) -> Result<()> {
    if !matches!(args.policy, PolicyArg::Reactive | PolicyArg::Memcast) {
        bail!("--budget needs --policy memcast (or reactive: the same) or predictive");
    }
    let Some(b) = &args.budget else {
        bail!("the tiered replay needs --budget");
    };
    let budget: Budget = b
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))
        .context("--budget")?;
    let trace = args.import.load(&args.trace)?;
    let mut opts = TierReplayOptions {
        budget,
        device: match args.device {
            DeviceArg::Sim => Device::Sim,
            DeviceArg::Host => Device::Host,
            DeviceArg::Cuda => Device::Cuda,
        },
        prefetch: !args.no_prefetch,
        check_every: args.check_every,
        ..Default::default()
    };
    // Allocator settings: the tiered replay's defaults (fixed segments), then the
    // environment and --conf on top.
    if let Ok(env) = std::env::var("MEMCAST_ALLOC_CONF") {
        opts.alloc = opts
            .alloc
            .with_conf_string(&env)
            .context("MEMCAST_ALLOC_CONF")?;
    }
    if let Some(c) = &args.conf {
        opts.alloc = opts.alloc.with_conf_string(c).context("--conf")?;
    }
    let report = replay_budgeted(&trace, &opts)
        .with_context(|| format!("tiered replay of {} failed", args.trace.display()))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    if let Some(e) = &report.error {
        bail!("{e}");
    }
    Ok(())
}

fn print_table(r: &TierReport) {
    println!("trace              {}", r.trace);
    println!(
        "policy             {} (prefetch: {}, access model: {:?})",
        r.policy, r.prefetcher, r.access_model
    );
    println!(
        "budget             {} ({:.0}% of peak requested {})",
        human_bytes(r.budget_bytes),
        100.0 * r.budget_fraction,
        human_bytes(r.peak_requested_bytes)
    );
    println!("completed          {} ({} OOM)", r.completed, r.ooms);
    println!("compute            {:.1} ms", r.compute_us / 1e3);
    println!(
        "stall              {:.1} ms (transfers {:.1} ms), overhead {:.3}",
        r.stall_us / 1e3,
        r.transfer_stall_us / 1e3,
        r.stall_overhead
    );
    println!(
        "spilled            {} in {} spills ({} on the OOM path, {} cancelled)",
        human_bytes(r.spilled_bytes),
        r.spills,
        r.sync_spills,
        r.cancelled_spills
    );
    println!(
        "prefetched         {} in {} prefetches ({} never used)",
        human_bytes(r.prefetched_bytes),
        r.prefetches,
        r.wasted_prefetches
    );
    println!(
        "prefetch hit rate  {:.3} ({} hits, {} misses: {} faults, {} late)",
        r.prefetch_hit_rate, r.prefetch_hits, r.prefetch_misses, r.faults, r.late_prefetches
    );
    println!(
        "peak reserved      {} (host {}, pinned pool {})",
        human_bytes(r.peak_reserved_bytes),
        human_bytes(r.peak_host_bytes),
        human_bytes(r.staging_bytes)
    );
}
