//! `memcast demo`: the main job on the bundled real traces. It imports each bundled trace
//! and prints what is in it.

use anyhow::{Context, Result};
use memcast_trace::bundled;
use memcast_trace::stats::{human_bytes, TraceStats};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Print one JSON object per trace instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    if !args.json {
        println!(
            "memcast demo: {} bundled traces recorded with PyTorch on an NVIDIA H200\n",
            bundled::ALL.len()
        );
        println!(
            "{:<32} {:>8} {:>9} {:>5} {:>11} {:>11}",
            "trace", "kind", "events", "iters", "static", "peak req."
        );
    }
    for b in bundled::ALL {
        let t = b
            .load()
            .with_context(|| format!("bundled trace {}", b.name))?;
        let s = TraceStats::compute(&t)?;
        if args.json {
            println!("{}", serde_json::to_string(&s)?);
            continue;
        }
        println!(
            "{:<32} {:>8} {:>9} {:>5} {:>11} {:>11}",
            b.name,
            if b.dynamic { "dynamic" } else { "static" },
            s.events,
            s.iterations,
            human_bytes(s.static_bytes),
            human_bytes(s.peak_requested_bytes),
        );
    }
    Ok(())
}
