//! `memcast export`: a trained model's weights as safetensors or as a burn record.

use std::path::PathBuf;

use anyhow::{Context, Result};
use memcast_predictor::artifact;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// safetensors (tensor names and shapes in docs/predictor.md; config in the metadata).
    Safetensors,
    /// burn's NamedMpk record, full precision.
    Burn,
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// Artifact directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Weight format to write.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Output file, written under exactly this name.
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn run(a: ExportArgs) -> Result<()> {
    // The model's own files (an artifact folder's, or the weights file named): writing
    // over one would replace what was exported from.
    let own = if a.model.is_dir() {
        [
            artifact::SAFETENSORS,
            artifact::BURN_RECORD,
            artifact::CONFIG,
            artifact::NORM,
        ]
        .iter()
        .map(|f| a.model.join(f))
        .collect()
    } else {
        vec![a.model.clone()]
    };
    for f in &own {
        memcast_trace::output::check_not_input(&a.output, f, "a file of the model")?;
    }
    let w = artifact::load_weights(&a.model)
        .with_context(|| format!("loading model {}", a.model.display()))?;
    match a.format {
        ExportFormat::Safetensors => w.save(&a.output)?,
        ExportFormat::Burn => memcast_predictor::train::backend::save_burn_record(&w, &a.output)?,
    }
    out!("wrote {}", a.output.display());
    Ok(())
}
