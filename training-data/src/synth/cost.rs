//! A roofline cost model: how long a step takes on the device.
//!
//! `time = launches * launch_us + max(flops / (peak * compute_eff), bytes / (bw * bw_eff))`
//!
//! Assumptions (NVIDIA H200 SXM, dense, no sparsity), all overridable:
//! - bf16 tensor cores: 790 TFLOP/s dense (the figure the project works with);
//! - fp32 convolutions run as TF32 (cuDNN's default `allow_tf32 = True`): half the bf16 rate;
//! - fp32 matmuls do not (PyTorch's default `matmul.allow_tf32 = False`): 67 TFLOP/s;
//! - HBM3e: 4.8 TB/s;
//! - achieved fractions: 55% of peak FLOP/s, 75% of peak bandwidth;
//! - 10 us per kernel: eager PyTorch's per-op host overhead (dispatch + launch), which
//!   dominates small ops and decode steps. Chosen so that synthetic iteration times land
//!   near the real ResNet-50 and GPT-2 recordings (docs/synthetic.md), so iteration time
//!   is a fitted, not an independent, figure.

use serde::{Deserialize, Serialize};

use super::graph::{DType, Unit};

/// Device throughputs and efficiencies. See the module docs for the defaults' sources.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub bf16_flops: f64,
    pub tf32_flops: f64,
    pub fp32_flops: f64,
    /// Bytes per second of device memory.
    pub hbm_bytes_per_s: f64,
    pub compute_eff: f64,
    pub bw_eff: f64,
    pub launch_us: f64,
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
            compute_eff: 0.55,
            bw_eff: 0.75,
            launch_us: 10.0,
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

    /// Microseconds for `launches` kernels doing `flops` on `unit` and moving `bytes`.
    pub fn time_us(&self, unit: Unit, flops: f64, bytes: f64, launches: u32) -> f64 {
        let compute = self
            .peak(unit)
            .map_or(0.0, |p| flops / (p * self.compute_eff));
        let memory = bytes / (self.hbm_bytes_per_s * self.bw_eff);
        f64::from(launches) * self.launch_us + compute.max(memory) * 1e6
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
        // 1 TFLOP over 1 MB: compute bound, 1e12 / (790e12 * 0.55) s = 2301.6 us + launch.
        let t = c.time_us(mm, 1e12, 1e6, 1);
        assert!((t - (10.0 + 1e6 / (790.0 * 0.55))).abs() < 1e-6, "{t}");
        // 3.6 GB vector op: 1000 us at 3.6 TB/s effective.
        let t = c.time_us(Unit::Vector, 1e15, 3.6e9, 0);
        assert!((t - 1000.0).abs() < 1e-6, "{t}");
    }
}
