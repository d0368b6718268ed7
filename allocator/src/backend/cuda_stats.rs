//! Per-call latency counters of the CUDA backend, with what `sim` charges for the same
//! calls beside them.
//!
//! Every device call that blocks the host (`cuMemAlloc`, `cuMemFree`, a growable
//! segment's map or unmap, `cuMemHostAlloc`, `cuMemFreeHost`, synchronizations) is timed
//! with the wall clock. Each sample keeps its size, so that the report can put next to
//! it what a cost model of the `sim` backend ([`CostModel::h200`] unless the caller
//! names another) charges for a call of the same size:
//! `sim_total_us` is the sum of the sim's charges for exactly the calls measured.

use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::sim::CostModel;

/// Which device call a sample is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// `cuMemAlloc` (a fixed segment).
    Alloc,
    /// `cuMemFree`.
    Free,
    /// A growable segment's growth: `cuMemCreate` + `cuMemMap` per page, one
    /// `cuMemSetAccess`.
    Map,
    /// A growable segment's shrink: the synchronization, `cuMemUnmap` + `cuMemRelease`
    /// per page.
    Unmap,
    /// `cuMemHostAlloc` (pinned host memory).
    HostAlloc,
    /// `cuMemFreeHost`.
    HostFree,
    /// `cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`.
    Sync,
    /// A copy to or from pageable host memory (`cuMemcpy*Async`), which blocks the host.
    Copy,
}

/// Samples of one call kind: (bytes, pages, wall microseconds).
#[derive(Debug, Clone, Default)]
struct Samples {
    v: Vec<(u64, u32, f32)>,
}

/// Summary of one call kind. `sim_*` is what the `sim` backend charges for the same
/// calls (the same sizes); `None` where sim has no cost for the kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CallSummary {
    pub calls: u64,
    pub bytes: u64,
    /// Pages (granules) mapped or unmapped: growable segments only.
    pub pages: u64,
    pub total_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// `total_us / pages` (growable segments), else 0.
    pub per_page_us: f64,
    pub sim_total_us: Option<f64>,
    pub sim_p50_us: Option<f64>,
}

/// The report: one summary per call kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CudaCallReport {
    pub alloc: CallSummary,
    pub free: CallSummary,
    pub map: CallSummary,
    pub unmap: CallSummary,
    pub host_alloc: CallSummary,
    pub host_free: CallSummary,
    pub sync: CallSummary,
    /// Copies to or from pageable host memory (the host blocks in them).
    pub copy: CallSummary,
}

/// The counters, shared between a [`super::cuda::CudaBackend`] and whoever reads them
/// (the replay keeps a handle while the backend is owned by an allocator).
#[derive(Debug, Clone, Default)]
pub struct CallStats(Arc<Mutex<[Samples; 8]>>);

/// Samples kept per kind; beyond it, new samples replace old ones round-robin (the
/// quantiles stay representative, the totals stay exact in `CallSummary` only up to it).
const MAX_SAMPLES: usize = 1 << 20;

impl CallStats {
    pub(super) fn record(&self, kind: CallKind, bytes: u64, pages: u32, us: f64) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut g[kind as usize].v;
        if s.len() < MAX_SAMPLES {
            s.push((bytes, pages, us as f32));
        } else {
            let i = (bytes as usize ^ s.len()) % MAX_SAMPLES;
            s[i] = (bytes, pages, us as f32);
        }
    }

    /// Forgets every sample (e.g. after a warm-up).
    pub fn reset(&self) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for s in g.iter_mut() {
            s.v.clear();
        }
    }

    /// Summaries, with the charges of the sim's default model (the H200's) for the
    /// same calls.
    pub fn report(&self) -> CudaCallReport {
        self.report_with(&CostModel::h200())
    }

    /// Summaries, with what cost model `c` charges for the same calls.
    pub fn report_with(&self, c: &CostModel) -> CudaCallReport {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let sim_for = |kind: CallKind, bytes: u64, pages: u32| -> Option<f64> {
            let pages = pages.max(1) as f64;
            match kind {
                CallKind::Alloc => Some(c.malloc_us(bytes)),
                CallKind::Free => Some(c.free_us(bytes)),
                CallKind::Map => Some(c.map_page_us * pages),
                CallKind::Unmap => Some(c.unmap_page_us * pages),
                CallKind::HostAlloc => Some(CostModel::interp(&c.host_alloc_pinned, bytes as f64)),
                CallKind::HostFree => Some(CostModel::interp(&c.host_free_pinned, bytes as f64)),
                CallKind::Sync => None,
                // The sim charges copies on its link model, not per call.
                CallKind::Copy => None,
            }
        };
        let summary = |kind: CallKind| -> CallSummary {
            let s = &g[kind as usize].v;
            if s.is_empty() {
                return CallSummary::default();
            }
            let mut us: Vec<f64> = s.iter().map(|x| x.2 as f64).collect();
            us.sort_by(f64::total_cmp);
            let q = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
            let total: f64 = us.iter().sum();
            let pages: u64 = s.iter().map(|x| x.1 as u64).sum();
            let sim: Option<Vec<f64>> = s.iter().map(|x| sim_for(kind, x.0, x.1)).collect();
            let (sim_total, sim_p50) = match sim {
                Some(mut v) => {
                    v.sort_by(f64::total_cmp);
                    (Some(v.iter().sum()), Some(q(&v, 0.5)))
                }
                None => (None, None),
            };
            CallSummary {
                calls: s.len() as u64,
                bytes: s.iter().map(|x| x.0).sum(),
                pages,
                total_us: total,
                p50_us: q(&us, 0.5),
                p99_us: q(&us, 0.99),
                max_us: us[us.len() - 1],
                per_page_us: if pages > 0 { total / pages as f64 } else { 0.0 },
                sim_total_us: sim_total,
                sim_p50_us: sim_p50,
            }
        };
        CudaCallReport {
            alloc: summary(CallKind::Alloc),
            free: summary(CallKind::Free),
            map: summary(CallKind::Map),
            unmap: summary(CallKind::Unmap),
            host_alloc: summary(CallKind::HostAlloc),
            host_free: summary(CallKind::HostFree),
            sync: summary(CallKind::Sync),
            copy: summary(CallKind::Copy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_put_the_sim_charge_beside_the_measurement() {
        let s = CallStats::default();
        s.record(CallKind::Alloc, 2 << 20, 0, 40.0);
        s.record(CallKind::Alloc, 2 << 20, 0, 60.0);
        s.record(CallKind::Map, 4 << 20, 2, 30.0);
        s.record(CallKind::Sync, 0, 0, 5.0);
        let r = s.report();
        assert_eq!(r.alloc.calls, 2);
        assert_eq!(r.alloc.total_us, 100.0);
        assert_eq!(r.alloc.sim_total_us, Some(102.0));
        assert_eq!(r.map.per_page_us, 15.0);
        assert_eq!(
            r.map.sim_total_us,
            Some(2.0 * CostModel::h200().map_page_us)
        );
        assert_eq!(r.sync.sim_total_us, None);
        let h100 = CostModel::h100();
        assert_eq!(
            s.report_with(&h100).map.sim_total_us,
            Some(2.0 * h100.map_page_us)
        );
        assert_eq!(r.free, CallSummary::default());
        s.reset();
        assert_eq!(s.report().alloc.calls, 0);
    }
}
