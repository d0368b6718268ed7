//! The cost model: how long a step takes on the device, and on the host to launch it.
//!
//! Device: a roofline per step,
//! `device = max(kernels * device_min_us, flops / (peak * compute_eff), bytes / (bw * bw_eff))`.
//! Host: `kernels * host_us_per_kernel` (eager PyTorch's per-op Python, dispatch and launch
//! cost). `timeline.rs` runs the two clocks against each other.
//!
//! Assumptions (NVIDIA H200 SXM, dense, no sparsity), all overridable:
//! - bf16 tensor cores: 790 TFLOP/s dense (the figure the project works with);
//! - fp32 convolutions run as TF32 (cuDNN's default `allow_tf32 = True`): half the bf16 rate;
//! - fp32 matmuls do not (PyTorch's default `matmul.allow_tf32 = False`): 67 TFLOP/s;
//! - HBM3e: 4.8 TB/s;
//! - achieved fractions: 65% of peak FLOP/s, 40% of peak bandwidth; 2 us minimum per kernel;
//! - host: 12 us per launched kernel, runs at most 1024 kernels ahead of the device
//!   (an assumed launch-queue depth), and 2.65 ms of Python
//!   per generated token (Hugging Face `generate`'s loop: logits processors, stopping
//!   criteria, cache bookkeeping).
//!
//! The two efficiencies were fitted (grid search) to the median iteration times of the
//! real ResNet-50, GPT-2 and BERT recordings, the per-token host time to the real
//! generation recording (docs/synthetic.md): those times are fitted, not independent.

use serde::{Deserialize, Serialize};

use super::graph::{DType, Unit};

/// Device throughputs and efficiencies, host launch cost. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub bf16_flops: f64,
    pub tf32_flops: f64,
    pub fp32_flops: f64,
    /// Bytes per second of device memory.
    pub hbm_bytes_per_s: f64,
    pub compute_eff: f64,
    pub bw_eff: f64,
    /// Shortest device time of one kernel.
    pub device_min_us: f64,
    /// Host time to issue one kernel (Python, dispatcher, launch).
    pub host_us_per_kernel: f64,
    /// Kernels the host may run ahead of the device before a launch blocks.
    pub queue_depth: u32,
    /// Host time of one generation step's Python loop, beyond its kernels.
    pub host_us_per_token: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::h200()
    }
}

impl CostModel {
    /// NVIDIA H200 SXM (141 GB HBM3e).
    pub fn h200() -> Self {
        CostModel {
            bf16_flops: 790e12,
            tf32_flops: 395e12,
            fp32_flops: 67e12,
            hbm_bytes_per_s: 4.8e12,
            compute_eff: 0.65,
            bw_eff: 0.40,
            device_min_us: 2.0,
            host_us_per_kernel: 12.0,
            queue_depth: 1024,
            host_us_per_token: 2650.0,
        }
    }

    /// Peak FLOP/s of `unit` (vector work is costed by bytes only).
    fn peak(&self, unit: Unit) -> Option<f64> {
        match unit {
            Unit::Vector => None,
            Unit::Matmul { dtype, tf32 } => Some(match (dtype, tf32) {
                (DType::F32, true) => self.tf32_flops,
                (DType::F32, false) => self.fp32_flops,
                _ => self.bf16_flops,
            }),
        }
    }

    /// Device microseconds for `kernels` kernels doing `flops` on `unit`, moving `bytes`.
    pub fn time_us(&self, unit: Unit, flops: f64, bytes: f64, kernels: u32) -> f64 {
        let compute = self
            .peak(unit)
            .map_or(0.0, |p| flops / (p * self.compute_eff));
        let memory = bytes / (self.hbm_bytes_per_s * self.bw_eff);
        (compute.max(memory) * 1e6).max(f64::from(kernels) * self.device_min_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roofline_picks_the_bound() {
        let c = CostModel::h200();
        let mm = Unit::Matmul {
            dtype: DType::BF16,
            tf32: false,
        };
        // 1 TFLOP over 1 MB: compute bound, 1e12 / (790e12 * 0.65) s = 1947.4 us.
        let t = c.time_us(mm, 1e12, 1e6, 1);
        assert!((t - 1e6 / (790.0 * 0.65)).abs() < 1e-6, "{t}");
        // 1.92 GB vector op: 1000 us at 1.92 TB/s effective.
        let t = c.time_us(Unit::Vector, 1e15, 1.92e9, 1);
        assert!((t - 1000.0).abs() < 1e-6, "{t}");
        // A tiny op: the kernel minimum.
        assert_eq!(c.time_us(Unit::Vector, 0.0, 8.0, 3), 6.0);
    }
}
