//! Converts traces to the native format without the CLI (which links burn):
//! `cargo run --release -p memcast-trace --example convert -- OUT_DIR FILE...`
//! Used to make the bundled copies in training-data/traces/ (zstd level 19).

use std::path::PathBuf;

use memcast_trace::io::{load_trace, trace_name};
use memcast_trace::native::{save_with, WriteOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: convert OUT_DIR FILE...")?);
    for f in args {
        let f = PathBuf::from(f);
        let t = load_trace(&f)?;
        let dest = out.join(format!("{}.mctrace", trace_name(&f)));
        save_with(
            &t,
            &dest,
            WriteOptions {
                zstd_level: Some(19),
            },
        )?;
        println!(
            "{} -> {} ({} bytes)",
            f.display(),
            dest.display(),
            std::fs::metadata(&dest)?.len()
        );
    }
    Ok(())
}
