//! `memcast replay` (being written: issue 3).

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trace file (PyTorch snapshot pickle or native).
    pub trace: std::path::PathBuf,
}

pub fn run(_args: ReplayArgs) -> anyhow::Result<()> {
    anyhow::bail!("replay is not implemented yet")
}
