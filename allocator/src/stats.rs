//! Allocator statistics: a plain struct, logged through `tracing`, serialized as JSON.
//!
//! Definitions (one of each, used everywhere):
//! - requested: bytes callers asked for, live;
//! - allocated: bytes handed out for them (rounded to the minimum block or the slab
//!   class), live; `internal_waste = allocated - requested`;
//! - reserved: bytes obtained from the device (segments, mapped growable bytes);
//! - free = reserved - allocated (free buddy blocks, free slab slots, cached runs);
//! - fragmentation at an instant = 1 - largest free block / free bytes.

use serde::Serialize;

/// A current value and its peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Gauge {
    pub current: u64,
    pub peak: u64,
}

impl Gauge {
    #[inline]
    pub fn add(&mut self, v: u64) {
        self.current += v;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }
    #[inline]
    pub fn sub(&mut self, v: u64) {
        self.current -= v;
    }
}

/// Latency histogram with power-of-two nanosecond buckets: bucket `i` counts samples in
/// `[2^i, 2^(i+1))` ns (bucket 0 also holds 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; 40],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, ns: u64) {
        let b = (63 - ns.max(1).leading_zeros()) as usize;
        self.buckets[b.min(39)] += 1;
        self.count += 1;
        self.sum_ns += ns;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Upper bound of the bucket holding quantile `q` (0..=1), in ns.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= target {
                return 1u64 << (i + 1);
            }
        }
        self.max_ns
    }

    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64
        }
    }
}

/// Everything the allocator counts. Updated on every call (O(1) each).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AllocStats {
    pub requested: Gauge,
    pub allocated: Gauge,
    pub reserved: Gauge,
    /// `allocated - requested` at the moment `requested` peaked.
    pub internal_waste_at_peak: u64,
    /// Fixed segments obtained plus growable-segment growths (each one device call).
    pub device_allocs: u64,
    /// Fixed segments released plus growable-segment shrinks.
    pub device_frees: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Large requests served from the cache of freed runs (deferred coalescing).
    pub cache_hits: u64,
    /// Times the cache of freed runs was merged back into the buddy trees.
    pub cache_flushes: u64,
    /// Small requests served by slabs.
    pub slab_allocs: u64,
    /// Slabs carved from the buddy trees (a measure of slab churn).
    pub slabs_carved: u64,
    /// Requests that failed with out-of-memory (after the retry).
    pub ooms: u64,
    /// Times an out-of-memory made the allocator release memory and retry: once for a
    /// request's growth, and once for each stretch of released pages its run had backed
    /// again (so one request can count several times).
    pub oom_retries: u64,
    /// Segments taken over from another stream (after an event).
    pub segments_stolen: u64,
    /// Frees deferred until events on other streams completed.
    pub deferred_frees: u64,
    /// Sampled host time of `allocate` calls.
    pub latency: Histogram,
    /// Predictive mode: device calls made while following a forecast (ahead of need:
    /// not for the request being served), and the host time they took (backend
    /// stall). They are made on the allocating thread, at a hand-over inside an
    /// `allocate` or `deallocate`: a job's thread still waits for them, earlier.
    pub ahead_device_calls: u64,
    pub ahead_device_us: f64,
    /// Predictive mode: forecasts read and pieces of advice applied.
    pub forecasts_used: u64,
    pub advice_applied: u64,
    /// Page release: pages whose memory free blocks gave back, and pages backed again
    /// under a run placed over them (each stretch one device call, counted in
    /// `device_frees` / `device_allocs`).
    pub pages_released: u64,
    pub pages_backed: u64,
}

impl AllocStats {
    pub fn internal_waste(&self) -> u64 {
        self.allocated.current - self.requested.current
    }
    pub fn free_bytes(&self) -> u64 {
        self.reserved.current - self.allocated.current
    }

    /// Logs a one-line summary at `info` level.
    pub fn log(&self) {
        tracing::info!(
            requested = self.requested.current,
            peak_requested = self.requested.peak,
            allocated = self.allocated.current,
            reserved = self.reserved.current,
            peak_reserved = self.reserved.peak,
            device_allocs = self.device_allocs,
            device_frees = self.device_frees,
            cache_hits = self.cache_hits,
            ooms = self.ooms,
            "memcast allocator stats"
        );
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::default();
        for ns in [10, 20, 40, 1000] {
            h.record(ns);
        }
        assert_eq!(h.count, 4);
        assert_eq!(h.quantile_ns(0.5), 32);
        assert_eq!(h.quantile_ns(1.0), 1024);
        assert_eq!(h.max_ns, 1000);
    }

    #[test]
    fn gauge_tracks_peak() {
        let mut g = Gauge::default();
        g.add(5);
        g.add(3);
        g.sub(6);
        g.add(1);
        assert_eq!((g.current, g.peak), (3, 8));
    }
}
