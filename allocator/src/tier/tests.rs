//! Integrity, fault-injection and pressure tests of the tiering layer (host backend:
//! real bytes move).

use super::replay::{replay_budgeted, Budget, TierReplayOptions};

#[test]
fn smoke_bundled_60() {
    for b in memcast_trace::bundled::ALL.iter().take(
        std::env::var("NT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    ) {
        let t = b.load().unwrap();
        let env = |k: &str, d: f64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let mut opts = TierReplayOptions {
            budget: Budget::Fraction(env("FR", 0.6)),
            ..Default::default()
        };
        opts.tier.high_watermark = env("HI", 0.9);
        opts.tier.low_watermark = env("LO", 0.8);
        opts.tier.prefetch_watermark = env("PW", 0.8);
        if let Ok(g) = std::env::var("GROW") {
            opts.alloc.growable_segments = g == "1";
        }
        opts.tier.prefetch_window = env("WIN", 512.0) as usize;
        opts.prefetch = env("PF", 1.0) > 0.0;
        let r = replay_budgeted(&t, &opts).unwrap();
        eprintln!("stall {:.0} transfer {:.0} compute {:.0} faults {} late {} sync_spills {} cancelled {} wasted {} prefetches {} peak_res {} budget {}", r.stall_us, r.transfer_stall_us, r.compute_us, r.faults, r.late_prefetches, r.sync_spills, r.cancelled_spills, r.wasted_prefetches, r.prefetches, r.peak_reserved_bytes, r.budget_bytes);
        eprintln!("{} completed {} err {:?} overhead {:.3} spilled {} prefetched {} hits {} misses {} wall {:.2}", r.trace, r.completed, r.error, r.stall_overhead, r.spilled_bytes, r.prefetched_bytes, r.prefetch_hits, r.prefetch_misses, r.wall_secs);
    }
}
