//! The simulated device's costs: host-blocking call costs and copy bandwidths, each
//! measured on an NVIDIA H200 (the module above says how they are used).

use super::super::CopyKind;

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Host-blocking costs (microseconds) and bandwidths (GB/s), with the H200 defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    /// (bytes, p50 us) for `cudaMalloc`.
    pub malloc: Vec<(f64, f64)>,
    /// (bytes, p50 us) for `cudaFree`.
    pub free: Vec<(f64, f64)>,
    /// (bytes, p50 us) for `cudaHostAlloc` (pinned).
    pub host_alloc_pinned: Vec<(f64, f64)>,
    /// (bytes, p50 us) for `cudaFreeHost`.
    pub host_free_pinned: Vec<(f64, f64)>,
    /// Pageable host allocation (malloc), flat.
    pub host_alloc_pageable_us: f64,
    /// (bytes, GB/s) per copy kind.
    pub h2d_pinned: Vec<(f64, f64)>,
    pub d2h_pinned: Vec<(f64, f64)>,
    pub h2d_pageable: Vec<(f64, f64)>,
    pub d2h_pageable: Vec<(f64, f64)>,
    pub d2d: Vec<(f64, f64)>,
    /// Host-to-host memcpy bandwidth (GB/s), not measured: a typical DDR5 figure.
    pub h2h_gbps: f64,
    /// Fixed latency added to every copy (launch), microseconds.
    pub copy_latency_us: f64,
    /// Event record / query / stream wait cost on the host, microseconds.
    pub event_us: f64,
    /// Measured total bandwidth of concurrent H2D + D2H copies (GB/s): while both
    /// directions are busy, each copy gets at most half of it (added for the tiers).
    #[serde(default)]
    pub duplex_gbps: f64,
    /// Growable segments: host time to map one page (2 MiB), microseconds
    /// (`cuMemCreate` + `cuMemMap`, `cuMemSetAccess` amortized), measured with the CUDA
    /// backend on the H200.
    #[serde(default = "default_map_page_us")]
    pub map_page_us: f64,
    /// Growable segments: host time to unmap one page (`cuMemUnmap` + `cuMemRelease`),
    /// microseconds, measured likewise (the synchronization before it is not included).
    #[serde(default = "default_unmap_page_us")]
    pub unmap_page_us: f64,
}

/// Mean per page of two H200 machines (docs/cuda.md): 52-57 us and 37-40 us.
fn default_map_page_us() -> f64 {
    47.0
}

/// Mean per page of two H200 machines (docs/cuda.md): 41-46 us and 28-31 us.
fn default_unmap_page_us() -> f64 {
    36.0
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::h200()
    }
}

impl CostModel {
    /// The figures measured on an NVIDIA H200.
    pub fn h200() -> Self {
        CostModel {
            malloc: vec![
                (512.0, 2.5),
                (64.0 * KIB, 2.4),
                (2.0 * MIB, 51.0),
                (20.0 * MIB, 63.5),
                (256.0 * MIB, 77.9),
                (GIB, 122.2),
            ],
            free: vec![
                (512.0, 2.6),
                (64.0 * KIB, 2.6),
                (2.0 * MIB, 44.6),
                (20.0 * MIB, 63.8),
                (256.0 * MIB, 190.3),
                (GIB, 684.5),
            ],
            host_alloc_pinned: vec![(2.0 * MIB, 1580.3), (256.0 * MIB, 152580.5)],
            host_free_pinned: vec![(2.0 * MIB, 375.0), (256.0 * MIB, 37916.5)],
            host_alloc_pageable_us: 1.0,
            h2d_pinned: vec![(2.0 * MIB, 45.6), (64.0 * MIB, 54.7), (GIB, 55.0)],
            d2h_pinned: vec![(2.0 * MIB, 51.4), (64.0 * MIB, 54.7), (GIB, 55.1)],
            h2d_pageable: vec![(2.0 * MIB, 13.9), (64.0 * MIB, 13.9), (GIB, 18.1)],
            d2h_pageable: vec![(2.0 * MIB, 7.8), (64.0 * MIB, 10.6), (GIB, 15.5)],
            d2d: vec![(2.0 * MIB, 170.0), (64.0 * MIB, 1798.0), (GIB, 2117.0)],
            h2h_gbps: 20.0,
            copy_latency_us: 2.0,
            event_us: 0.5,
            duplex_gbps: 102.0,
            map_page_us: default_map_page_us(),
            unmap_page_us: default_unmap_page_us(),
        }
    }

    /// Piecewise-linear interpolation in log2(size), clamped at both ends.
    pub fn interp(table: &[(f64, f64)], bytes: f64) -> f64 {
        let x = bytes.max(1.0).log2();
        let first = table[0];
        if x <= first.0.log2() {
            return first.1;
        }
        for w in table.windows(2) {
            let (x0, y0) = (w[0].0.log2(), w[0].1);
            let (x1, y1) = (w[1].0.log2(), w[1].1);
            if x <= x1 {
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
            }
        }
        table[table.len() - 1].1
    }

    pub fn malloc_us(&self, bytes: u64) -> f64 {
        Self::interp(&self.malloc, bytes as f64)
    }
    pub fn free_us(&self, bytes: u64) -> f64 {
        Self::interp(&self.free, bytes as f64)
    }
    /// Duration of a copy of `bytes` over `kind`, microseconds (latency included).
    pub fn copy_us(&self, kind: CopyKind, bytes: u64) -> f64 {
        let gbps = match kind {
            CopyKind::HostToDevicePinned => Self::interp(&self.h2d_pinned, bytes as f64),
            CopyKind::DeviceToHostPinned => Self::interp(&self.d2h_pinned, bytes as f64),
            CopyKind::HostToDevicePageable => Self::interp(&self.h2d_pageable, bytes as f64),
            CopyKind::DeviceToHostPageable => Self::interp(&self.d2h_pageable, bytes as f64),
            CopyKind::DeviceToDevice => Self::interp(&self.d2d, bytes as f64),
            CopyKind::HostToHost => self.h2h_gbps,
        };
        // GB/s = 1e3 bytes/us.
        self.copy_latency_us + bytes as f64 / (gbps * 1e3)
    }
}
