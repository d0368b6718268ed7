//! `memcast demo` (being written: issue 2).

#[derive(clap::Args)]
pub struct DemoArgs {}

pub fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("demo is not implemented yet")
}
