//! `memcast trace features`: the featurizer's step series as CSV, raw demand first,
//! then the scale-free features the predictor reads.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use memcast_trace::features::{steps, StepConfig, FEATURE_NAMES, NUM_CLASSES};
use memcast_trace::Trace;

/// Writes the CSV; returns the number of steps.
pub fn write(t: &Trace, allocs_per_step: u32, out: &Path) -> Result<usize> {
    anyhow::ensure!(allocs_per_step > 0, "--step-allocs must be at least 1");
    let cfg = StepConfig {
        allocs_per_step,
        ..StepConfig::default()
    };
    let series = steps(t, cfg);
    memcast_trace::output::write_with(out, |w| write_csv(&series, w))?;
    Ok(series.len())
}

fn write_csv(series: &[memcast_trace::features::Step], w: &mut dyn Write) -> std::io::Result<()> {
    let mut header = vec![
        "step".to_string(),
        "iteration".into(),
        "step_in_iteration".into(),
        "start_time_us".into(),
        "allocs".into(),
        "frees".into(),
    ];
    header.extend((0..NUM_CLASSES).map(|c| format!("class{c}_bytes")));
    header.extend([
        "requested_bytes".into(),
        "freed_bytes".into(),
        "live_bytes".into(),
    ]);
    header.extend(
        FEATURE_NAMES
            .iter()
            .map(|n| format!("f:{n}").replace(',', ";")),
    );
    writeln!(w, "{}", header.join(","))?;
    for s in series {
        let mut row = vec![
            s.index.to_string(),
            s.iteration.to_string(),
            s.step_in_iteration.to_string(),
            s.start_time_us.to_string(),
            s.allocs.to_string(),
            s.frees.to_string(),
        ];
        row.extend(s.values.iter().map(u64::to_string));
        row.push(s.live_bytes.to_string());
        row.extend(s.features.iter().map(|x| format!("{x:.6}")));
        writeln!(w, "{}", row.join(","))?;
    }
    Ok(())
}
