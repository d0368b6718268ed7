//! Development helper: replays a trace stored as JSON (`serde_json` of `Trace`) through
//! a policy and prints the report. `memcast replay` is the user-facing command.
//!
//! `cargo run --release -p memcast-alloc --example replay_json -- TRACE.json [memcast|pytorch|naive] [sim|host]`
//! (`MEMCAST_ALLOC_CONF` configures the `memcast` policy).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: replay_json TRACE.json [policy] [device]")?;
    let trace: memcast_trace::Trace =
        serde_json::from_reader(std::io::BufReader::new(std::fs::File::open(path)?))?;
    let mut opts = memcast_alloc::replay::ReplayOptions {
        config: memcast_alloc::AllocConfig::from_env()?,
        ..Default::default()
    };
    if let Some(p) = args.get(1) {
        opts.policy = p.parse()?;
    }
    if let Some(d) = args.get(2) {
        opts.device = d.parse()?;
    }
    if std::env::var("CHECK").is_ok() {
        opts.check_every = 1;
    }
    let r = memcast_alloc::replay::replay(&trace, &opts)?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}
