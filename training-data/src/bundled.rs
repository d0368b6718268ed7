//! The real traces shipped with memcast (`training-data/traces/*.mctrace`), compiled into
//! the library so that `memcast demo`, the tests and the default model's training work
//! from any directory on a fresh machine. ~300 KB in all (native format, zstd 19).
//!
//! They are converted copies of the PyTorch snapshots recorded on an NVIDIA H200 (see
//! docs/trace-format.md): `memcast trace import X.snapshot.pickle -o X.mctrace --zstd 19`.

use crate::error::TraceError;
use crate::model::Trace;
use crate::native;

/// One bundled trace.
#[derive(Debug, Clone, Copy)]
pub struct Bundled {
    pub name: &'static str,
    /// `true` if shapes change between iterations (dynamic workloads).
    pub dynamic: bool,
    pub bytes: &'static [u8],
}

impl Bundled {
    /// Decodes the trace.
    pub fn load(&self) -> Result<Trace, TraceError> {
        native::decode(self.bytes)
    }
}

macro_rules! bundled {
    ($($name:literal, $dynamic:literal;)*) => {
        /// All bundled traces, static ones first.
        pub const ALL: &[Bundled] = &[$(Bundled {
            name: $name,
            dynamic: $dynamic,
            bytes: include_bytes!(concat!("../traces/", $name, ".mctrace")),
        }),*];
    };
}

bundled! {
    "resnet50_b64_train", false;
    "gpt2_b8_s1024_train_bf16", false;
    "bert_base_b32_s128_train", false;
    "mobilenet_v3_b128_train", false;
    "bert_dynseq_b16_train", true;
    "gpt2_dynbatch_s512_train_bf16", true;
    "resnet50_multiscale_b32_train", true;
    "gpt2_generate_dynamic", true;
}

/// What PyTorch's own allocator reported for the bundled real traces
/// (`torch.cuda.memory_stats()` after the recorded iterations; JSON Lines with `name`,
/// `allocator` = `pytorch-native` or `pytorch-expandable-segments`, `peak_allocated`,
/// `peak_reserved`, `num_device_alloc`, `num_device_free`, `iters`): the figures to beat.
pub const PYTORCH_FIGURES_JSONL: &str = include_str!("../traces/pytorch_allocator_figures.jsonl");

/// One row of [`PYTORCH_FIGURES_JSONL`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct PytorchFigures {
    pub name: String,
    pub allocator: String,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The peak of the bytes the program asked for (`requested_bytes.all.peak`), where
    /// the figures file has it (the corpus's does; the bundled traces' does not).
    #[serde(default)]
    pub peak_requested: Option<u64>,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
}

impl PytorchFigures {
    /// `peak_reserved / peak_allocated - 1`, PyTorch's reserved-memory overhead as
    /// PyTorch counts it: its allocated bytes include its rounding of each request.
    pub fn reserved_overhead(&self) -> f64 {
        self.peak_reserved as f64 / self.peak_allocated as f64 - 1.0
    }

    /// `peak_reserved / peak_requested - 1`: the overhead over the bytes the program
    /// asked for, memcast's definition (its `reserved_overhead`), so the two compare on
    /// one footing; `None` without `peak_requested`.
    pub fn requested_overhead(&self) -> Option<f64> {
        self.peak_requested
            .filter(|&r| r > 0)
            .map(|r| self.peak_reserved as f64 / r as f64 - 1.0)
    }

    /// [`Self::requested_overhead`] where the figures have it, else
    /// [`Self::reserved_overhead`].
    pub fn comparable_overhead(&self) -> f64 {
        self.requested_overhead()
            .unwrap_or_else(|| self.reserved_overhead())
    }
}

/// PyTorch's figures for trace `name` with `allocator` (`pytorch-native` or
/// `pytorch-expandable-segments`).
pub fn pytorch_figures(name: &str, allocator: &str) -> Option<PytorchFigures> {
    PYTORCH_FIGURES_JSONL
        .lines()
        .filter_map(|l| serde_json::from_str::<PytorchFigures>(l).ok())
        .find(|f| f.name == name && f.allocator == allocator)
}

/// Finds a bundled trace by name.
pub fn get(name: &str) -> Option<&'static Bundled> {
    ALL.iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn overheads_over_requested_and_over_allocated() {
        let line = r#"{"name": "w", "allocator": "pytorch-native", "peak_allocated": 1100,
            "peak_reserved": 1210, "peak_requested": 1000, "num_device_alloc": 3, "num_device_free": 0}"#;
        let f: super::PytorchFigures = serde_json::from_str(line).unwrap();
        assert!((f.reserved_overhead() - 0.1).abs() < 1e-12);
        assert!((f.requested_overhead().unwrap() - 0.21).abs() < 1e-12);
        assert_eq!(f.comparable_overhead(), f.requested_overhead().unwrap());
        // The bundled figures have no requested peak: PyTorch's own figure stands.
        let old = super::PytorchFigures {
            peak_requested: None,
            ..f.clone()
        };
        assert_eq!(old.requested_overhead(), None);
        assert_eq!(old.comparable_overhead(), old.reserved_overhead());
        let zero = super::PytorchFigures {
            peak_requested: Some(0),
            ..f
        };
        assert_eq!(zero.requested_overhead(), None);
    }

    #[test]
    fn every_bundled_trace_decodes_and_is_valid() {
        for b in super::ALL {
            let t = b.load().unwrap();
            t.validate().unwrap();
            assert_eq!(t.meta.name, b.name);
            assert!(t.iterations() >= 8, "{}", b.name);
            for a in ["pytorch-native", "pytorch-expandable-segments"] {
                let f = super::pytorch_figures(b.name, a).unwrap();
                assert!(f.reserved_overhead() > 0.0 && f.reserved_overhead() < 0.25);
            }
        }
    }
}
