//! The no-budget replay the table examples share: memcast reactive (`None`) or in
//! predictive mode with forecaster `f`, on the simulated H200, every other option at its
//! default.

use memcast_alloc::replay::{replay, Policy, ReplayForecaster, ReplayOptions, ReplayReport};
use memcast_trace::Trace;

pub fn no_budget(
    t: &Trace,
    f: Option<ReplayForecaster>,
) -> Result<ReplayReport, Box<dyn std::error::Error>> {
    Ok(replay(
        t,
        &ReplayOptions {
            policy: if f.is_some() {
                Policy::Predictive
            } else {
                Policy::Memcast
            },
            forecaster: f.unwrap_or(ReplayForecaster::None),
            ..Default::default()
        },
    )?)
}
