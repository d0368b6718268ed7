//! Replay on a real GPU (`--device cuda`): the policy's device calls go to
//! [`CudaBackend`] (cuMemAlloc/cuMemFree, VMM maps and unmaps), and the report's
//! `extra.cuda` holds the measured latency of each kind of call beside what the `sim`
//! backend's cost model (`ReplayOptions::costs`) charges for exactly the same calls
//! (`sim_total_us`, `sim_p50_us`), plus `extra.cuda.sim_device_time_us`, the sim's
//! total for them, to compare with the measured `device_time_us`. No memory is touched: the replay measures the allocator
//! and the driver, not kernels.

use memcast_trace::Trace;

use super::{naive, pytorch, run, run_warm, Policy, ReplayError, ReplayOptions, ReplayReport};
use crate::backend::cuda::CudaBackend;
use crate::pool::Allocator;

/// Replays `trace` with `opts.policy` on CUDA device 0.
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let mut b = CudaBackend::new(0).map_err(ReplayError::Device)?;
    // Growable segments map pages of the configured segment granule (2 MiB by
    // default, the driver's granularity): `--conf segment_granule:32M` maps 32 MiB pages.
    let page = opts.config.segment_granule.max(b.driver_granularity());
    b.set_page_size(page).map_err(ReplayError::Device)?;
    let stats = b.call_stats();
    let mut r = match opts.policy {
        Policy::Memcast => {
            let a = Allocator::new(b, super::memcast_config(opts)).map_err(ReplayError::Setup)?;
            run(trace, a, opts)?
        }
        Policy::Predictive => run(trace, super::predictive_allocator(trace, b, opts)?, opts)?,
        Policy::Pytorch => {
            let emu = pytorch::PytorchEmu::new(b, opts.pytorch.clone());
            run_warm(trace, emu, opts, opts.pytorch.warmup_plan(trace).as_ref())?
        }
        Policy::Naive => run(trace, naive::Naive::new(b), opts)?,
    };
    // The allocator (and with it the backend) is dropped by `run`: its segments went
    // back to the device, which the counters also saw; report the calls of the replay.
    let calls = stats.report_with(&opts.costs);
    let sim_total: f64 = [&calls.alloc, &calls.free, &calls.map, &calls.unmap]
        .iter()
        .filter_map(|c| c.sim_total_us)
        .sum();
    let mut cuda = serde_json::to_value(&calls).unwrap_or_default();
    if let Some(o) = cuda.as_object_mut() {
        o.insert("sim_device_time_us".into(), sim_total.into());
    }
    match r.extra.as_object_mut() {
        Some(o) => {
            o.insert("cuda".into(), cuda);
        }
        None => r.extra = serde_json::json!({ "cuda": cuda }),
    }
    Ok(r)
}
