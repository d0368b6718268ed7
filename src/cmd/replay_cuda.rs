//! The `--device cuda` part of `memcast replay`'s table: each kind of device call,
//! measured on the GPU, beside what the sim's cost model (`--costs`; by default the
//! model measured on the GPU the driver names) charges for the same calls.

use memcast_alloc::replay::ReplayReport;

pub fn print_calls(r: &ReplayReport) {
    let Some(c) = r.extra.get("cuda") else {
        return;
    };
    out!("device calls      measured on the GPU vs sim's cost of the same calls:");
    out!(
        "  {:<10} {:>7} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "call",
        "calls",
        "p50 us",
        "p99 us",
        "total ms",
        "sim total ms",
        "sim p50 us"
    );
    for k in ["alloc", "free", "map", "unmap", "sync", "copy"] {
        let Some(s) = c.get(k) else { continue };
        let f = |name: &str| s.get(name).and_then(|v| v.as_f64());
        let calls = s.get("calls").and_then(|v| v.as_u64()).unwrap_or(0);
        if calls == 0 {
            continue;
        }
        let opt = |v: Option<f64>, scale: f64| match v {
            Some(x) => format!("{:.1}", x / scale),
            None => "-".into(),
        };
        out!(
            "  {:<10} {:>7} {:>10.1} {:>10.1} {:>12.2} {:>12} {:>10}",
            k,
            calls,
            f("p50_us").unwrap_or(0.0),
            f("p99_us").unwrap_or(0.0),
            f("total_us").unwrap_or(0.0) / 1e3,
            opt(f("sim_total_us"), 1e3),
            opt(f("sim_p50_us"), 1.0),
        );
    }
    let measured: f64 = ["alloc", "free", "map", "unmap"]
        .iter()
        .filter_map(|k| c.get(*k)?.get("total_us")?.as_f64())
        .sum();
    if let Some(sim) = c.get("sim_device_time_us").and_then(|v| v.as_f64()) {
        out!(
            "alloc+free+map+unmap {:.1} ms measured, {:.1} ms charged by sim for the same calls",
            measured / 1e3,
            sim / 1e3
        );
    }
}
