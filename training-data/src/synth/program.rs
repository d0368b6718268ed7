//! The expanded program: a linear list of kernel steps over memory buffers, which the
//! liveness analysis turns into allocation and free events.
//!
//! The expansion (`expand.rs`) never decides when to free: it only says which buffers a
//! step allocates, reads, writes or merely keeps referenced ("holds", as a Python
//! variable does). `liveness.rs` frees each buffer right after its last use, which is
//! when PyTorch's reference counting frees it.

use serde::{Deserialize, Serialize};

/// Index of a buffer in [`Program::bufs`].
pub type BufId = usize;

/// One block of device memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buf {
    /// Requested bytes.
    pub bytes: u64,
    /// Name of what made it (the value's or op's name).
    pub name: String,
    /// Live before the trace and never freed (parameters, optimizer state, workspaces).
    pub is_static: bool,
    /// Microseconds to recompute it from what was live when it was made, for
    /// activations kept for the backward (the activation-checkpointing trade-off).
    pub recompute_us: Option<f64>,
}

/// One kernel (or a short fused group) of the program.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub name: String,
    /// An iteration boundary marker (all lists empty, no duration).
    pub boundary: bool,
    /// Buffers this step brings to life (allocated at its start, then written).
    pub allocs: Vec<BufId>,
    pub reads: Vec<BufId>,
    pub writes: Vec<BufId>,
    /// Buffers kept referenced here without a device access (Python references).
    pub holds: Vec<BufId>,
    /// Device time of the step in microseconds.
    pub dur_us: f64,
    /// Kernels (or copies) the host launches for it; each costs host time.
    pub kernels: u32,
    /// Host time beyond the kernels' launches (Python work between them).
    pub host_us: f64,
    /// The host waits for the device to finish all earlier work before this step
    /// (`.item()`, `torch.cuda.synchronize()`).
    pub sync: bool,
}

/// Buffers and steps in program order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub bufs: Vec<Buf>,
    pub steps: Vec<Step>,
}

impl Program {
    /// A new static buffer (live before the trace).
    pub fn static_buf(&mut self, name: &str, bytes: u64) -> BufId {
        self.bufs.push(Buf {
            bytes,
            name: name.to_string(),
            is_static: true,
            recompute_us: None,
        });
        self.bufs.len() - 1
    }

    /// A new dynamic buffer; some later step must list it in `allocs`.
    pub fn buf(&mut self, name: &str, bytes: u64) -> BufId {
        self.bufs.push(Buf {
            bytes,
            name: name.to_string(),
            is_static: false,
            recompute_us: None,
        });
        self.bufs.len() - 1
    }

    pub fn push(&mut self, step: Step) {
        self.steps.push(step);
    }

    /// Appends an iteration boundary marker. Not a synchronization point: the real
    /// recordings show the host running ahead across iterations (see `timeline.rs`).
    pub fn boundary(&mut self) {
        self.steps.push(Step {
            name: "iteration".into(),
            boundary: true,
            sync: false,
            ..Default::default()
        });
    }

    /// Appends a host-device synchronization point.
    pub fn sync(&mut self, name: &str) {
        self.steps.push(Step {
            name: name.into(),
            sync: true,
            ..Default::default()
        });
    }

    /// Sum of the static buffers' bytes.
    pub fn static_bytes(&self) -> u64 {
        self.bufs
            .iter()
            .filter(|b| b.is_static)
            .map(|b| b.bytes)
            .sum()
    }
}
