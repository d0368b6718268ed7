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

/// Finds a bundled trace by name.
pub fn get(name: &str) -> Option<&'static Bundled> {
    ALL.iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_bundled_trace_decodes_and_is_valid() {
        for b in super::ALL {
            let t = b.load().unwrap();
            t.validate().unwrap();
            assert_eq!(t.meta.name, b.name);
            assert!(t.iterations() >= 8, "{}", b.name);
        }
    }
}
