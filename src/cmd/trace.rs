//! `memcast trace ...` (being written: issue 2).

#[derive(clap::Subcommand)]
pub enum TraceCommand {
    /// Print summary statistics of a trace.
    Stats { file: std::path::PathBuf },
}

pub fn run(_c: TraceCommand) -> anyhow::Result<()> {
    anyhow::bail!("trace commands are not implemented yet")
}
