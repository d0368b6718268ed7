//! One module per subcommand: each defines its clap arguments and a `run`.

pub mod chart;
pub mod corpus;
pub mod demo;
pub mod eval;
pub mod export;
pub mod features_csv;
pub mod gen;
pub mod plot;
pub mod predict;
pub mod progress;
pub mod replay;
pub mod trace;
pub mod train;

/// The model at `path`, or the default model built into memcast.
pub fn load_model(
    path: &Option<std::path::PathBuf>,
) -> anyhow::Result<memcast_predictor::EmbeddedLstm> {
    use anyhow::Context;
    match path {
        Some(p) => memcast_predictor::artifact::load_model(p)
            .with_context(|| format!("loading model {}", p.display())),
        None => memcast_predictor::artifact::default_model()
            .context("loading the built-in default model"),
    }
}
