//! The artifact directory `memcast train` writes and every other command reads:
//!
//! | file | content |
//! |---|---|
//! | `config.json` | [`ArtifactConfig`]: model, training and step configs |
//! | `model.safetensors` | weights + normalisation (see [`crate::weights`]) |
//! | `model.mpk` | the same weights in burn's record format (`NamedMpkFileRecorder`, full precision) |
//! | `norm.json` | the normalisation statistics, readable (a copy: nothing reads it back) |
//! | `metrics.json` | training history and validation metrics |

use std::path::Path;

use crate::config::ArtifactConfig;
use crate::error::{io, PredictorError, Result};
use crate::infer::EmbeddedLstm;
use crate::weights::Weights;

pub const CONFIG: &str = "config.json";
pub const SAFETENSORS: &str = "model.safetensors";
pub const BURN_RECORD: &str = "model.mpk";
pub const NORM: &str = "norm.json";
pub const METRICS: &str = "metrics.json";

/// Reads `config.json`.
pub fn load_config(dir: &Path) -> Result<ArtifactConfig> {
    let path = dir.join(CONFIG);
    let text =
        memcast_trace::io::read_bounded_text(&path, memcast_trace::limits::MAX_TEXT_FILE_BYTES)
            .map_err(io(&path))?;
    let c: ArtifactConfig = serde_json::from_str(&text).map_err(|err| PredictorError::Json {
        path: path.clone(),
        err,
    })?;
    c.validate()
        .map_err(|e| PredictorError::Config(format!("{}: {e}", path.display())))?;
    Ok(c)
}

/// Loads the weights of an artifact directory (or a bare `.safetensors` file), checked
/// against `config.json` when there is one.
pub fn load_weights(path: &Path) -> Result<Weights> {
    if path.is_dir() {
        let config = load_config(path)?;
        Weights::load(&path.join(SAFETENSORS), Some(&config))
    } else {
        Weights::load(path, None).map_err(|e| match e {
            // burn's record, which `memcast export --format burn` and `train` write for
            // burn users: memcast itself reads the safetensors.
            PredictorError::Weights { path, what } if path.extension() == Some("mpk".as_ref()) => {
                PredictorError::Weights {
                    what: format!(
                        "{what} (a burn record, which memcast writes for burn but does not read: \
                         give the model's folder or its {SAFETENSORS})"
                    ),
                    path,
                }
            }
            e => e,
        })
    }
}

/// Loads a ready-to-run embedded model.
pub fn load_model(path: &Path) -> Result<EmbeddedLstm> {
    EmbeddedLstm::new(load_weights(path)?)
}

/// Writes `config.json`, `model.safetensors` and `norm.json` into `dir` (created).
pub fn save(dir: &Path, w: &Weights) -> Result<()> {
    memcast_trace::output::create_dir(dir)?;
    let path = dir.join(CONFIG);
    let text = serde_json::to_string_pretty(&w.config).expect("plain struct serialises");
    memcast_trace::output::write_bytes(&path, text.as_bytes())?;
    w.save(&dir.join(SAFETENSORS))?;
    w.norm.save(&dir.join(NORM))
}

/// Writes any serialisable value as pretty JSON.
pub fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(v).expect("plain data serialises");
    Ok(memcast_trace::output::write_bytes(path, text.as_bytes())?)
}

/// The default model's weights, compiled into the library (its config is embedded in
/// the safetensors metadata), so that a copied or installed binary has it.
pub const DEFAULT_SAFETENSORS: &[u8] =
    include_bytes!("../../training-data/models/default/model.safetensors");

/// The default model, from the copy compiled in.
pub fn default_weights() -> Result<Weights> {
    Weights::from_safetensors(DEFAULT_SAFETENSORS, None)
}

/// The default model ready to run.
pub fn default_model() -> Result<EmbeddedLstm> {
    EmbeddedLstm::new(default_weights()?)
}
