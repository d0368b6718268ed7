//! Host and device clocks: when the allocator sees each step's requests.
//!
//! Allocation, access and free calls are made by the host when it launches a kernel,
//! not when the kernel runs (the caching allocator works on the host timeline, and
//! recorded `time_us` values are host times). The host runs ahead of the device by up to
//! `queue_depth` kernels, and waits for the device at synchronization points
//! (`.item()`-style checks such as generation's stopping test). Iteration boundaries are
//! not such points: in the real dynamic recordings the host time of an iteration follows
//! the previous iteration's shape (the host waits there for the device to drain it), and
//! the real GPT-2 recording shows the same start-of-iteration plateau that this model gives.
//!
//! Per step `i` with `k` kernels and device time `d`:
//! - at a sync point: `host = max(host, device)`;
//! - while more than `queue_depth` kernels are pending: `host = max(host, oldest completion)`;
//! - `start[i] = host`, `host += k * host_us_per_kernel + step.host_us`, `end[i] = host`;
//! - `device = max(device, end[i]) + d` (the kernels start once launched).
//!
//! Invariant: `start[i] <= end[i] <= start[i + 1]` (host time never decreases).
//! Cost: O(steps) time, O(queue_depth) memory.

use std::collections::VecDeque;

use super::cost::CostModel;
use super::program::Program;

/// Host times of each step: its requests are made at `start`, its frees at `end`.
#[derive(Debug, Clone, PartialEq)]
pub struct Times {
    pub start: Vec<f64>,
    pub end: Vec<f64>,
}

/// Runs the two clocks over the program.
pub fn schedule(p: &Program, c: &CostModel) -> Times {
    let (mut host, mut device) = (0.0f64, 0.0f64);
    // (completion time, kernels) of launched, possibly unfinished steps.
    let mut pending: VecDeque<(f64, u32)> = VecDeque::new();
    let mut in_flight: u64 = 0;
    let mut start = Vec::with_capacity(p.steps.len());
    let mut end = Vec::with_capacity(p.steps.len());
    for s in &p.steps {
        if s.sync {
            host = host.max(device);
        }
        while let Some(&(done, k)) = pending.front() {
            if done <= host || in_flight + u64::from(s.kernels) > u64::from(c.queue_depth) {
                host = host.max(done);
                in_flight -= u64::from(k);
                pending.pop_front();
            } else {
                break;
            }
        }
        start.push(host);
        host += f64::from(s.kernels) * c.host_us_per_kernel + s.host_us;
        end.push(host);
        if s.kernels > 0 || s.dur_us > 0.0 {
            device = device.max(host) + s.dur_us;
            pending.push_back((device, s.kernels));
            in_flight += u64::from(s.kernels);
        }
    }
    Times { start, end }
}

#[cfg(test)]
mod tests {
    use super::super::program::Step;
    use super::*;

    fn step(kernels: u32, dur_us: f64, sync: bool) -> Step {
        Step {
            kernels,
            dur_us,
            sync,
            ..Default::default()
        }
    }

    #[test]
    fn host_runs_ahead_until_a_sync() {
        let c = CostModel {
            host_us_per_kernel: 10.0,
            queue_depth: 1024,
            ..CostModel::h200()
        };
        let mut p = Program::default();
        // Three long kernels: the host launches them at 0, 10, 20; the device ends at 3010.
        for _ in 0..3 {
            p.push(step(1, 1000.0, false));
        }
        p.push(step(0, 0.0, true));
        let t = schedule(&p, &c);
        assert_eq!(t.start[..3], [0.0, 10.0, 20.0]);
        assert_eq!(t.start[3], 3010.0);
    }

    #[test]
    fn a_full_queue_blocks_the_host() {
        let c = CostModel {
            host_us_per_kernel: 1.0,
            queue_depth: 2,
            ..CostModel::h200()
        };
        let mut p = Program::default();
        for _ in 0..4 {
            p.push(step(1, 100.0, false));
        }
        let t = schedule(&p, &c);
        // Kernel 3 waits for kernel 1 (done at 101), kernel 4 for kernel 2 (done at 201).
        assert_eq!(t.start, vec![0.0, 1.0, 101.0, 201.0]);
        for w in t.start.windows(2) {
            assert!(w[0] <= w[1]);
        }
    }
}
