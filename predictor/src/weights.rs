//! The model's weights as plain arrays, and their safetensors file format.
//!
//! Tensor names and shapes (all `F32`, row-major; `F` features, `H` hidden, `O = N*C`
//! outputs, plus 1 with `peak_head`; `T = C`, plus 1 with `peak_head`; layer `l` from
//! 0; layer 0's input width is `F`, the others' `H`):
//!
//! | name | shape | meaning |
//! |---|---|---|
//! | `lstm.{l}.w_ih` | `[in, 4H]` | input weights, gate blocks in order i, f, g, o |
//! | `lstm.{l}.w_hh` | `[H, 4H]` | recurrent weights, same gate order |
//! | `lstm.{l}.bias` | `[4H]` | gate bias |
//! | `head.weight` | `[H, O]` | output `o = h W + b`, `o[h*C + c]` = horizon `h+1`, channel `c`; `o[N*C]` the horizon's peak rise |
//! | `head.bias` | `[O]` | |
//! | `norm.feature_mean`, `norm.feature_std` | `[F]` | input normalisation |
//! | `norm.target_std` | `[T]` | output scale per channel (and of the peak rise) |
//!
//! The header's `__metadata__` holds `config` (the `config.json` text) and `format`
//! (`memcast-lstm/1`). Cell: `g = x W_ih + h W_hh + b`, `i,f,o = sigmoid`, `g = tanh`,
//! `c' = f c + i g`, `h' = o tanh(c')`.

use std::collections::HashMap;
use std::path::Path;

use ndarray::{Array1, Array2};
use safetensors::{Dtype, SafeTensors};

use crate::config::ArtifactConfig;
use crate::error::{io, PredictorError, Result};
use crate::norm::NormStats;

pub const FORMAT: &str = "memcast-lstm/1";

/// One LSTM layer. Invariant: `w_ih: [in, 4H]`, `w_hh: [H, 4H]`, `bias: [4H]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    pub w_ih: Array2<f32>,
    pub w_hh: Array2<f32>,
    pub bias: Array1<f32>,
}

/// Everything inference needs.
///
/// Invariant: shapes agree with `config.model` (checked by [`check_invariants`](Self::check_invariants)).
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    pub config: ArtifactConfig,
    pub layers: Vec<LayerWeights>,
    pub head_w: Array2<f32>,
    pub head_b: Array1<f32>,
    pub norm: NormStats,
}

impl Weights {
    pub fn check_invariants(&self) -> Result<()> {
        let m = &self.config.model;
        m.validate()?;
        let bad = |s: String| Err(PredictorError::Mismatch(s));
        if self.layers.len() != m.layers {
            return bad(format!(
                "{} LSTM layers, config says {}",
                self.layers.len(),
                m.layers
            ));
        }
        let g = 4 * m.hidden;
        for (l, w) in self.layers.iter().enumerate() {
            let input = if l == 0 { m.features } else { m.hidden };
            if w.w_ih.dim() != (input, g) || w.w_hh.dim() != (m.hidden, g) || w.bias.len() != g {
                return bad(format!(
                    "layer {l}: w_ih {:?}, w_hh {:?}, bias [{}]; config wants [{input}, {g}], [{}, {g}], [{g}]",
                    w.w_ih.dim(),
                    w.w_hh.dim(),
                    w.bias.len(),
                    m.hidden
                ));
            }
        }
        if self.head_w.dim() != (m.hidden, m.outputs()) || self.head_b.len() != m.outputs() {
            return bad(format!(
                "head {:?} + [{}]; config wants [{}, {}]",
                self.head_w.dim(),
                self.head_b.len(),
                m.hidden,
                m.outputs()
            ));
        }
        if self.norm.feature_mean.len() != m.features || self.norm.target_std.len() != m.targets() {
            return bad("normalisation statistics have the wrong width".into());
        }
        self.norm.check_invariants()?;
        fn finite<'a>(mut v: impl Iterator<Item = &'a f32>) -> bool {
            v.all(|x| x.is_finite())
        }
        for (l, w) in self.layers.iter().enumerate() {
            for (name, ok) in [
                ("w_ih", finite(w.w_ih.iter())),
                ("w_hh", finite(w.w_hh.iter())),
                ("bias", finite(w.bias.iter())),
            ] {
                if !ok {
                    return Err(PredictorError::NonFiniteWeights(format!("lstm.{l}.{name}")));
                }
            }
        }
        for (name, ok) in [
            ("head.weight", finite(self.head_w.iter())),
            ("head.bias", finite(self.head_b.iter())),
        ] {
            if !ok {
                return Err(PredictorError::NonFiniteWeights(name.to_string()));
            }
        }
        Ok(())
    }

    /// Serialises to safetensors bytes (see the module docs for names and shapes).
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut put = |name: String, shape: Vec<usize>, data: &mut dyn Iterator<Item = f32>| {
            let bytes = data.flat_map(f32::to_le_bytes).collect();
            tensors.push((name, shape, bytes));
        };
        for (l, w) in self.layers.iter().enumerate() {
            put(
                format!("lstm.{l}.w_ih"),
                w.w_ih.shape().to_vec(),
                &mut w.w_ih.iter().copied(),
            );
            put(
                format!("lstm.{l}.w_hh"),
                w.w_hh.shape().to_vec(),
                &mut w.w_hh.iter().copied(),
            );
            put(
                format!("lstm.{l}.bias"),
                vec![w.bias.len()],
                &mut w.bias.iter().copied(),
            );
        }
        put(
            "head.weight".into(),
            self.head_w.shape().to_vec(),
            &mut self.head_w.iter().copied(),
        );
        put(
            "head.bias".into(),
            vec![self.head_b.len()],
            &mut self.head_b.iter().copied(),
        );
        let n = &self.norm;
        put(
            "norm.feature_mean".into(),
            vec![n.feature_mean.len()],
            &mut n.feature_mean.iter().copied(),
        );
        put(
            "norm.feature_std".into(),
            vec![n.feature_std.len()],
            &mut n.feature_std.iter().copied(),
        );
        put(
            "norm.target_std".into(),
            vec![n.target_std.len()],
            &mut n.target_std.iter().copied(),
        );
        let views = tensors
            .iter()
            .map(|(name, shape, data)| {
                let v = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), data)
                    .map_err(|e| PredictorError::Mismatch(format!("{name}: {e}")))?;
                Ok((name.clone(), v))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            (
                "config".to_string(),
                serde_json::to_string(&self.config).expect("plain struct serialises"),
            ),
        ]);
        safetensors::serialize(views, &Some(meta))
            .map_err(|e| PredictorError::Mismatch(format!("serialise: {e}")))
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        Ok(memcast_trace::output::write_bytes(
            path,
            &self.to_safetensors()?,
        )?)
    }

    /// Loads and checks a safetensors file. With `config`, the file's shapes must match
    /// that config (an artifact's `config.json`); otherwise the embedded one is used.
    pub fn load(path: &Path, config: Option<&ArtifactConfig>) -> Result<Self> {
        let bytes = memcast_trace::io::read_bounded(path, memcast_trace::limits::MAX_WEIGHTS_BYTES)
            .map_err(io(path))?;
        Self::from_safetensors(&bytes, config).map_err(|e| match e {
            PredictorError::Weights { what, .. } => PredictorError::Weights {
                path: path.into(),
                what,
            },
            PredictorError::Mismatch(what) => {
                PredictorError::Mismatch(format!("{}: {what}", path.display()))
            }
            e @ (PredictorError::NonFiniteWeights(_) | PredictorError::Norm(_)) => {
                PredictorError::Weights {
                    path: path.into(),
                    what: e.to_string(),
                }
            }
            other => other,
        })
    }

    pub fn from_safetensors(bytes: &[u8], config: Option<&ArtifactConfig>) -> Result<Self> {
        let corrupt = |what: String| PredictorError::Weights {
            path: "<bytes>".into(),
            what,
        };
        let st =
            SafeTensors::deserialize(bytes).map_err(|e| corrupt(safetensors_error(bytes, &e)))?;
        let (_, meta) =
            SafeTensors::read_metadata(bytes).map_err(|e| corrupt(safetensors_error(bytes, &e)))?;
        let embedded: Option<ArtifactConfig> = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("config"))
            .map(|c| serde_json::from_str(c))
            .transpose()
            .map_err(|e| corrupt(format!("embedded config: {e}")))?;
        let config = match (config, embedded) {
            (Some(c), _) => c.clone(),
            (None, Some(c)) => c,
            (None, None) => return Err(corrupt("no config given and none embedded".into())),
        };
        config.validate()?;
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let t = st.tensor(name).map_err(|_| {
                PredictorError::Mismatch(format!(
                    "tensor `{name}` missing (config wants shape {shape:?})"
                ))
            })?;
            if t.dtype() != Dtype::F32 {
                return Err(corrupt(format!(
                    "`{name}` is {:?}, expected F32",
                    t.dtype()
                )));
            }
            if t.shape() != shape {
                return Err(PredictorError::Mismatch(format!(
                    "`{name}` has shape {:?}, the config wants {shape:?}",
                    t.shape()
                )));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let m = &config.model;
        let g = 4 * m.hidden;
        let mut layers = Vec::with_capacity(m.layers);
        for l in 0..m.layers {
            let input = if l == 0 { m.features } else { m.hidden };
            let arr2 = |v: Vec<f32>, r: usize, c: usize| {
                Array2::from_shape_vec((r, c), v).expect("length checked")
            };
            layers.push(LayerWeights {
                w_ih: arr2(get(&format!("lstm.{l}.w_ih"), &[input, g])?, input, g),
                w_hh: arr2(get(&format!("lstm.{l}.w_hh"), &[m.hidden, g])?, m.hidden, g),
                bias: Array1::from(get(&format!("lstm.{l}.bias"), &[g])?),
            });
        }
        if st.tensor(&format!("lstm.{}.w_ih", m.layers)).is_ok() {
            return Err(PredictorError::Mismatch(format!(
                "the file has more than the config's {} LSTM layers",
                m.layers
            )));
        }
        let o = m.outputs();
        let w = Self {
            layers,
            head_w: Array2::from_shape_vec((m.hidden, o), get("head.weight", &[m.hidden, o])?)
                .expect("length checked"),
            head_b: Array1::from(get("head.bias", &[o])?),
            norm: NormStats {
                feature_mean: get("norm.feature_mean", &[m.features])?,
                feature_std: get("norm.feature_std", &[m.features])?,
                target_std: get("norm.target_std", &[m.targets()])?,
            },
            config,
        };
        w.check_invariants()?;
        Ok(w)
    }
}

/// One sentence for a file safetensors cannot read (its error names are not for users).
fn safetensors_error(bytes: &[u8], e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    let len = bytes.len();
    let what = match e {
        E::HeaderTooSmall => {
            format!("the file ({len} bytes) is shorter than a safetensors header: truncated, or not a safetensors file")
        }
        E::InvalidHeaderLength => {
            let n = bytes
                .get(..8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
            format!("the first 8 bytes announce a header of {n} bytes, which runs past the end of the file ({len} bytes): truncated, or not a safetensors file")
        }
        E::MetadataIncompleteBuffer => format!(
            "the tensors the header lists do not end where the file ends ({len} bytes): truncated, or bytes appended"
        ),
        E::HeaderTooLarge => {
            "the first 8 bytes announce a header larger than safetensors allows: not a safetensors file"
                .to_string()
        }
        E::InvalidHeader | E::InvalidHeaderStart | E::InvalidHeaderDeserialization => {
            "the header is not the JSON of a safetensors file".to_string()
        }
        E::InvalidOffset(name) => {
            format!("the header gives tensor {name:?} offsets outside its data: damaged")
        }
        E::TensorInvalidInfo | E::InvalidTensorView(..) | E::ValidationOverflow => {
            "a tensor's type, shape and offsets in the header disagree: damaged".to_string()
        }
        other => format!("not a readable safetensors file ({other})"),
    };
    format!("{what}; a model is an artifact folder from `memcast train` or its model.safetensors")
}
