//! The simulated device's costs: host-blocking call costs and copy bandwidths, each
//! measured on an NVIDIA H200 (the module above says how they are used).

use super::super::CopyKind;

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// (bytes, value) rows, sizes rising: a cost model's tables.
type Table = [(f64, f64)];

/// Host-blocking costs (microseconds) and bandwidths (GB/s), with the H200 defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
    pub duplex_gbps: f64,
    /// Growable segments: host time to map one page (2 MiB), microseconds
    /// (`cuMemCreate` + `cuMemMap`, `cuMemSetAccess` amortized), measured with the CUDA
    /// backend on the H200.
    pub map_page_us: f64,
    /// Growable segments: host time to unmap one page (`cuMemUnmap` + `cuMemRelease`),
    /// microseconds, measured likewise (the synchronization before it is not included).
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

    /// The figures measured on an NVIDIA H100 80GB HBM3 (SXM, PCIe Gen5 x16, driver
    /// 580) with the CUDA backend's own measuring tests (`measure_copy_bandwidths`,
    /// `measure_device_call_latencies` in `allocator/tests/cuda_measure.rs`; means of
    /// two to three runs; docs/cuda.md, "Another GPU: the H100"). The H200's call costs
    /// came from the runtime API through Python and its copies from CUDA events, these
    /// from the driver API and wall time: the H200's own runs of the call-cost test lie
    /// from 46% below to 16% above its constants. The copy latency and the event cost
    /// are the H200's (not measured apart on either).
    pub fn h100() -> Self {
        CostModel {
            malloc: vec![
                (512.0, 1.2),
                (64.0 * KIB, 1.1),
                (2.0 * MIB, 34.8),
                (20.0 * MIB, 38.1),
                (256.0 * MIB, 53.9),
                (GIB, 89.3),
            ],
            free: vec![
                (512.0, 1.4),
                (64.0 * KIB, 1.2),
                (2.0 * MIB, 28.8),
                (20.0 * MIB, 39.0),
                (256.0 * MIB, 107.6),
                (GIB, 480.3),
            ],
            host_alloc_pinned: vec![(2.0 * MIB, 668.4), (256.0 * MIB, 78458.6)],
            host_free_pinned: vec![(2.0 * MIB, 208.7), (256.0 * MIB, 22060.5)],
            host_alloc_pageable_us: 1.0,
            h2d_pinned: vec![(2.0 * MIB, 51.4), (64.0 * MIB, 55.2), (GIB, 55.3)],
            d2h_pinned: vec![(2.0 * MIB, 52.5), (64.0 * MIB, 55.1), (GIB, 55.2)],
            h2d_pageable: vec![(2.0 * MIB, 17.8), (64.0 * MIB, 13.9), (GIB, 9.8)],
            d2h_pageable: vec![(2.0 * MIB, 12.6), (64.0 * MIB, 16.4), (GIB, 16.2)],
            d2d: vec![(2.0 * MIB, 525.4), (64.0 * MIB, 1388.0), (GIB, 1498.3)],
            h2h_gbps: 20.0,
            copy_latency_us: 2.0,
            event_us: 0.5,
            duplex_gbps: 94.4,
            map_page_us: 36.4,
            unmap_page_us: 27.9,
        }
    }

    /// The built-in cost models by name (any case): `h200` (the default) and `h100`.
    pub fn named(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "h200" => Some(Self::h200()),
            "h100" => Some(Self::h100()),
            _ => None,
        }
    }

    /// The built-in model measured on the GPU a device name (the driver's, e.g. "NVIDIA
    /// H100 80GB HBM3") names by a whole word, with that model's name; `None` for a GPU
    /// no model was measured on (a GH200, whose host link is not PCIe, included).
    pub fn for_gpu(device_name: &str) -> Option<(&'static str, Self)> {
        let words: Vec<String> = device_name
            .split(|c: char| !c.is_ascii_alphanumeric())
            .map(str::to_ascii_lowercase)
            .collect();
        ["h200", "h100"]
            .into_iter()
            .find(|m| words.iter().any(|w| w == m))
            .and_then(|m| Some((m, Self::named(m)?)))
    }

    /// Checks a cost model read from a file before any replay uses it: every table has
    /// a row, sizes rise and are positive, bandwidths are positive and times are not
    /// negative, all finite. The error names the field and the row.
    pub fn validate(&self) -> Result<(), String> {
        // A bandwidth from 1 MB/s to 1 PB/s, a time from 0 to 1,000 s: beyond them a
        // copy or a call would take no time or forever, and the sums overflow to inf.
        let check = |v: f64, rate: bool| -> Result<(), &'static str> {
            match rate {
                true if (1e-3..=1e6).contains(&v) => Ok(()),
                false if (0.0..=1e9).contains(&v) => Ok(()),
                true => Err("a bandwidth from 0.001 to 1e6 GB/s"),
                false => Err("a time from 0 to 1e9 us"),
            }
        };
        // Values as written: `1e308`, not its 309 digits.
        let show = |v: f64| {
            if v != 0.0 && !(1e-4..1e9).contains(&v.abs()) {
                format!("{v:e}")
            } else {
                format!("{v}")
            }
        };
        let tables: [(&str, &Table, bool); 9] = [
            ("malloc", &self.malloc, false),
            ("free", &self.free, false),
            ("host_alloc_pinned", &self.host_alloc_pinned, false),
            ("host_free_pinned", &self.host_free_pinned, false),
            ("h2d_pinned", &self.h2d_pinned, true),
            ("d2h_pinned", &self.d2h_pinned, true),
            ("h2d_pageable", &self.h2d_pageable, true),
            ("d2h_pageable", &self.d2h_pageable, true),
            ("d2d", &self.d2d, true),
        ];
        for (name, table, rate) in tables {
            if table.is_empty() {
                return Err(format!("`{name}` has no row"));
            }
            let mut last = 0.0;
            for (i, &(bytes, v)) in table.iter().enumerate() {
                if !(bytes > last && bytes <= 1e18) {
                    return Err(format!(
                        "`{name}` row {i}: size {} is not above the row before and at most 1e18 bytes",
                        show(bytes)
                    ));
                }
                check(v, rate)
                    .map_err(|what| format!("`{name}` row {i}: {} is not {what}", show(v)))?;
                last = bytes;
            }
        }
        let scalars = [
            ("h2h_gbps", self.h2h_gbps, true),
            ("duplex_gbps", self.duplex_gbps, true),
            ("host_alloc_pageable_us", self.host_alloc_pageable_us, false),
            ("copy_latency_us", self.copy_latency_us, false),
            ("event_us", self.event_us, false),
            ("map_page_us", self.map_page_us, false),
            ("unmap_page_us", self.unmap_page_us, false),
        ];
        for (name, v, rate) in scalars {
            check(v, rate).map_err(|what| format!("`{name}` is {}, not {what}", show(v)))?;
        }
        Ok(())
    }

    /// Piecewise-linear interpolation in log2(size), clamped at both ends.
    ///
    /// Cost: a scan of the table comparing sizes (log2 is monotonic, so the segment is
    /// found without it) and three `log2` for the segment found. The victim choice
    /// scores every spill candidate with two of these per choice.
    pub fn interp(table: &[(f64, f64)], bytes: f64) -> f64 {
        let b = bytes.max(1.0);
        let first = table[0];
        if b <= first.0 {
            return first.1;
        }
        for w in table.windows(2) {
            if b <= w[1].0 {
                let (x0, y0) = (w[0].0.log2(), w[0].1);
                let (x1, y1) = (w[1].0.log2(), w[1].1);
                return y0 + (y1 - y0) * (b.log2() - x0) / (x1 - x0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_models_are_valid_and_named() {
        for name in ["h200", "h100"] {
            let c = CostModel::named(name).unwrap();
            assert_eq!(c.validate(), Ok(()), "{name}");
        }
        assert_eq!(CostModel::named("h200"), Some(CostModel::default()));
        assert_ne!(CostModel::named("h100"), Some(CostModel::default()));
        assert_eq!(CostModel::named("a100"), None);
    }

    /// The names the driver gives the GPUs the models were measured on pick them.
    #[test]
    fn a_gpu_name_picks_the_model_measured_on_it() {
        let pick = |n| CostModel::for_gpu(n).map(|(m, c)| (m, c == CostModel::named(m).unwrap()));
        assert_eq!(pick("NVIDIA H100 80GB HBM3"), Some(("h100", true)));
        assert_eq!(pick("NVIDIA H200"), Some(("h200", true)));
        assert_eq!(pick("NVIDIA H100 PCIe"), Some(("h100", true)));
        assert_eq!(pick("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(pick("NVIDIA GH200 480GB"), None);
        assert_eq!(pick(""), None);
    }

    /// The interpolation is its definition: linear in log2(size) between the rows that
    /// bracket a size, the end rows' values beyond them. Every row, a point between
    /// each two rows and both sides of each row, on every table of both models.
    #[test]
    fn interpolation_is_linear_in_log_size_between_the_bracketing_rows() {
        let by_definition = |t: &[(f64, f64)], b: f64| {
            let x = b.max(1.0).log2();
            let i = t.partition_point(|&(s, _)| s.log2() < x);
            if i == 0 {
                return t[0].1;
            }
            if i == t.len() {
                return t[t.len() - 1].1;
            }
            let ((s0, y0), (s1, y1)) = (t[i - 1], t[i]);
            y0 + (y1 - y0) * (x - s0.log2()) / (s1.log2() - s0.log2())
        };
        for c in [CostModel::h200(), CostModel::h100()] {
            for t in [
                &c.malloc,
                &c.free,
                &c.host_alloc_pinned,
                &c.host_free_pinned,
                &c.h2d_pinned,
                &c.d2h_pinned,
                &c.h2d_pageable,
                &c.d2h_pageable,
                &c.d2d,
            ] {
                let mut sizes = vec![0.0, 1.0, 3.0, 1e18];
                for w in t.windows(2) {
                    sizes.push((w[0].0 * w[1].0).sqrt());
                }
                for &(s, _) in t.iter() {
                    sizes.extend([s * (1.0 - 1e-9), s - 1.0, s, s + 1.0]);
                }
                for b in sizes {
                    let (got, want) = (CostModel::interp(t, b), by_definition(t, b));
                    assert!(
                        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                        "size {b}: {got} against {want}"
                    );
                }
            }
        }
    }

    /// The example file the docs point users to is the H100's model, field for field.
    #[test]
    fn the_documented_example_file_is_the_h100_model() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cost-model-h100.json");
        let text = std::fs::read_to_string(path).unwrap();
        let c: CostModel = serde_json::from_str(&text).unwrap();
        assert_eq!(c, CostModel::h100());
    }

    #[test]
    fn a_bad_model_is_refused_naming_the_field_and_row() {
        let bad = |edit: fn(&mut CostModel), want: &str| {
            let mut c = CostModel::h100();
            edit(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.contains(want), "{err} should name {want}");
        };
        bad(|c| c.d2d.clear(), "`d2d` has no row");
        bad(|c| c.h2d_pinned[1].0 = 1.0, "`h2d_pinned` row 1");
        bad(|c| c.d2h_pageable[2].1 = 0.0, "`d2h_pageable` row 2");
        bad(|c| c.free[0].1 = f64::NAN, "`free` row 0");
        bad(
            |c| c.duplex_gbps = 1e308,
            "`duplex_gbps` is 1e308, not a bandwidth",
        );
        bad(|c| c.malloc[3].1 = -1.0, "`malloc` row 3");
        bad(
            |c| c.host_free_pinned[0].0 = f64::INFINITY,
            "`host_free_pinned` row 0",
        );
        bad(|c| c.duplex_gbps = 0.0, "`duplex_gbps`");
        bad(|c| c.map_page_us = f64::NAN, "`map_page_us`");
        // Values that would make a copy take forever or a sum overflow.
        bad(|c| c.h2d_pinned[0].1 = 5e-324, "`h2d_pinned` row 0");
        bad(|c| c.event_us = 1e300, "`event_us`");
        bad(|c| c.d2d[2].0 = 1e300, "`d2d` row 2");
    }

    /// The library's entry points check the model too: a caller who builds one by hand
    /// gets an error, not a panic in the interpolation.
    #[test]
    fn replays_refuse_a_bad_model() {
        let t = memcast_trace::bundled::ALL[0].load().unwrap();
        let mut costs = CostModel::h100();
        costs.malloc.clear();
        let opts = crate::replay::ReplayOptions {
            costs: costs.clone(),
            ..Default::default()
        };
        let err = crate::replay::replay(&t, &opts).unwrap_err().to_string();
        assert!(err.contains("`malloc` has no row"), "{err}");
        let opts = crate::tier::TierReplayOptions {
            budget: crate::tier::Budget::Fraction(0.6),
            costs,
            ..Default::default()
        };
        let err = crate::tier::replay_budgeted(&t, &opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`malloc` has no row"), "{err}");
    }
}
