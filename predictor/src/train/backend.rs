//! Backend choice (NdArray on the CPU, CUDA through burn-cuda behind the `cuda` feature),
//! the burn-side forward used to check embedded inference, and burn-record export.

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{Tensor, TensorData};

use crate::config::ArtifactConfig;
use crate::data::Series;
use crate::error::{PredictorError, Result};
use crate::train::model::LstmForecaster;
use crate::train::trainer::{train, Progress, TrainOutcome};
use crate::weights::Weights;

/// Where training runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// burn's NdArray backend on the CPU (always available).
    Ndarray,
    /// burn-cuda on GPU 0 (cargo feature `cuda`, a CUDA driver and device).
    Cuda,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ndarray" | "cpu" => Ok(Self::Ndarray),
            "cuda" | "gpu" => Ok(Self::Cuda),
            _ => Err(format!("unknown backend `{s}` (ndarray or cuda)")),
        }
    }
}

/// Trains on the chosen backend.
pub fn train_with(
    kind: BackendKind,
    series: &[Series],
    config: &ArtifactConfig,
    progress: &mut dyn Progress,
) -> Result<TrainOutcome> {
    match kind {
        BackendKind::Ndarray => {
            let device = Default::default();
            train::<Autodiff<NdArray<f32>>>(series, config, &device, progress)
        }
        BackendKind::Cuda => train_cuda(series, config, progress),
    }
}

/// Checks that `kind` can train here (the `cuda` feature, a driver and a device), before
/// any long work.
pub fn check_backend(kind: BackendKind) -> Result<()> {
    match kind {
        BackendKind::Ndarray => Ok(()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => cuda_available(),
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => Err(PredictorError::Config(
            "--backend cuda: this memcast was built without the `cuda` feature \
             (rebuild with `cargo build --release --features cuda`)"
                .into(),
        )),
    }
}

#[cfg(feature = "cuda")]
fn train_cuda(
    series: &[Series],
    config: &ArtifactConfig,
    progress: &mut dyn Progress,
) -> Result<TrainOutcome> {
    cuda_available()?;
    let device = burn_cuda::CudaDevice::default();
    train::<Autodiff<burn_cuda::Cuda<f32, i32>>>(series, config, &device, progress)
}

#[cfg(not(feature = "cuda"))]
fn train_cuda(_: &[Series], _: &ArtifactConfig, _: &mut dyn Progress) -> Result<TrainOutcome> {
    check_backend(BackendKind::Cuda)?;
    Err(PredictorError::Config(
        "no CUDA backend in this build".into(),
    ))
}

/// Checks for a CUDA driver and a device before burn-cuda touches them (cudarc panics
/// when `libcuda` is missing). Loads `libcuda.so.1` and asks it for the device count.
#[cfg(feature = "cuda")]
pub fn cuda_available() -> Result<()> {
    let no = |s: String| Err(PredictorError::Config(s));
    // SAFETY: loading the CUDA driver library runs its initialisers, which is what
    // cudarc would do next anyway.
    let lib = match unsafe {
        libloading::Library::new("libcuda.so.1").or_else(|_| libloading::Library::new("libcuda.so"))
    } {
        Ok(l) => l,
        Err(e) => {
            return no(format!(
                "--backend cuda: no CUDA driver found (libcuda.so.1: {e})"
            ))
        }
    };
    // SAFETY: `CUresult cuInit(unsigned int)` is the driver's documented C signature.
    let init: libloading::Symbol<unsafe extern "C" fn(u32) -> i32> =
        match unsafe { lib.get(b"cuInit\0") } {
            Ok(f) => f,
            Err(e) => {
                return no(format!(
                    "--backend cuda: the CUDA driver has no cuInit: {e}"
                ))
            }
        };
    // SAFETY: a call with the symbol's own signature; `lib` outlives it.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return no(format!(
            "--backend cuda: no usable CUDA device (cuInit returned {rc})"
        ));
    }
    // SAFETY: `CUresult cuDeviceGetCount(int*)` is the driver's documented C signature.
    let count: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
        match unsafe { lib.get(b"cuDeviceGetCount\0") } {
            Ok(f) => f,
            Err(e) => {
                return no(format!(
                    "--backend cuda: the CUDA driver has no cuDeviceGetCount: {e}"
                ))
            }
        };
    let mut n = 0i32;
    // SAFETY: `n` is a valid `int` to write; the driver was initialised above.
    if unsafe { count(&mut n) } != 0 || n == 0 {
        return no("--backend cuda: no CUDA device found".into());
    }
    Ok(())
}

/// burn's forward (NdArray) on normalised inputs `x [b, w, F]`, flat row-major output
/// `[b, w, O]`: the reference embedded inference is checked against.
pub fn burn_forward(weights: &Weights, x: &[f32], b: usize, w: usize) -> Result<Vec<f32>> {
    let device = Default::default();
    let model: LstmForecaster<NdArray<f32>> = LstmForecaster::from_weights(weights, &device);
    let f = weights.config.model.features;
    if x.len() != b * w * f {
        return Err(PredictorError::FeatureWidth {
            expected: b * w * f,
            got: x.len(),
        });
    }
    let input =
        Tensor::<NdArray<f32>, 3>::from_data(TensorData::new(x.to_vec(), [b, w, f]), &device);
    model
        .forward(input)
        .into_data()
        .to_vec::<f32>()
        .map_err(|e| PredictorError::Train(format!("{e:?}")))
}

/// Writes the weights in burn's record format (`NamedMpkBytesRecorder`, full precision:
/// the bytes of burn's `.mpk` files) to exactly `path`, through `memcast_trace::output`.
pub fn save_burn_record(weights: &Weights, path: &Path) -> Result<()> {
    let device = Default::default();
    let model: LstmForecaster<NdArray<f32>> = LstmForecaster::from_weights(weights, &device);
    let bytes = NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
        .record(model.into_record(), ())
        .map_err(|e| PredictorError::Train(format!("{}: {e}", path.display())))?;
    Ok(memcast_trace::output::write_bytes(path, &bytes)?)
}

/// Reads a burn record written by [`save_burn_record`] into weights with `config`.
pub fn load_burn_record(
    path: &Path,
    config: &ArtifactConfig,
    template: &Weights,
) -> Result<Weights> {
    let device = Default::default();
    let bytes = memcast_trace::io::read_bounded(path, memcast_trace::limits::MAX_WEIGHTS_BYTES)
        .map_err(crate::error::io(path))?;
    let model: LstmForecaster<NdArray<f32>> = LstmForecaster::from_weights(template, &device);
    let record = NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
        .load(bytes, &device)
        .map_err(|e| PredictorError::Weights {
            path: path.into(),
            what: e.to_string(),
        })?;
    model.load_record(record).to_weights(config, &template.norm)
}
