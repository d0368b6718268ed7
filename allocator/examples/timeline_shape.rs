//! How far the corpus's test traces (event times of a host that may run ahead of the
//! GPU), as recorded and with their final waits spread
//! (`memcast_trace::timeline::spread_final_waits`), lie from the same programs recorded
//! with launch blocking (event times that follow the GPU):
//! `memcast_trace::timeline::shape_distance`, per trace.
//!
//! `cargo run --release -p memcast-alloc --example timeline_shape` (from the repository
//! root).

use memcast_trace::corpus::Corpus;
use memcast_trace::timeline::{shape_distance, spread_final_waits};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new("training-data/corpus");
    let main = Corpus::load(&root.join("manifest.tsv"))?;
    let lb = Corpus::load(&root.join("launch-blocking/manifest.tsv"))?;
    println!("| trace | as recorded | final waits spread |");
    println!("|---|---:|---:|");
    for e in &lb.entries {
        let Some(m) = main.entry(&e.workload) else {
            continue;
        };
        let gpu = memcast_trace::io::load_trace(&e.path)?;
        let host = memcast_trace::io::load_trace(&m.path)?;
        let cell = |d: Option<f64>| d.map_or("-".into(), |d| format!("{d:.3}"));
        println!(
            "| {} | {} | {} |",
            e.workload,
            cell(shape_distance(&host, &gpu)),
            cell(shape_distance(&spread_final_waits(&host), &gpu))
        );
    }
    Ok(())
}
