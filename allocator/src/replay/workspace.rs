//! cuBLAS workspaces: static blocks that a PyTorch process creates lazily, inside its
//! first (warm-up) iteration, not with the model's parameters.
//!
//! ATen gives every (cuBLAS handle, stream) pair a workspace, allocated through the
//! caching allocator on the handle's first matrix multiply and kept for the life of
//! the process (`CublasHandlePool.cpp`; 32 MiB on Hopper GPUs, the size the corpus's
//! H200 runs show). Handles are per thread: a training step's forward runs on the
//! main thread and its backward on autograd's device thread, so a training process
//! holds two workspaces, an inference one one. Both are created where the warm-up's
//! first multiplies run, among the iteration's activations: the recordings made from a
//! process's start (`training-data/recorded/*_from_start_memcast.mctrace`, GPT-2, BERT
//! and ResNet-50) show the forward's early in GPT-2's and BERT's forward (ResNet's
//! first multiply is its classifier, at the end of forward) and the backward's where
//! backward starts, at the iteration's peak of live bytes. Where a workspace lands
//! decides whether the segment around it can later serve a request of the segment's
//! size: an emulation that allocates it with the parameters leaves those segments
//! whole. See docs/allocator.md, "Validating the PyTorch emulation".

use std::collections::HashSet;
use std::ops::Range;

use memcast_trace::{EventKind, Trace};
use serde::{Deserialize, Serialize};

/// cuBLAS's workspace on Hopper (sm90) GPUs, PyTorch's default there.
pub const CUBLAS_WORKSPACE_BYTES: u64 = 32 << 20;

/// Where the modelled warm-up creates the workspaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkspaceAt {
    /// With the parameters, before the warm-up iteration (no workspace model: the
    /// blocks are static blocks like any other).
    Before,
    /// The forward's at the warm-up iteration's start, the backward's at its peak.
    #[default]
    StartAndPeak,
    /// Every workspace at the iteration's peak.
    Peak,
    /// The forward's just after the iteration's first free, the backward's at its peak.
    FirstFreeAndPeak,
}

/// Which static blocks are workspaces and where the warm-up creates them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkspaceRule {
    /// A workspace's size in bytes (0: no workspace model).
    pub bytes: u64,
    pub at: WorkspaceAt,
}

impl Default for WorkspaceRule {
    fn default() -> Self {
        WorkspaceRule {
            bytes: CUBLAS_WORKSPACE_BYTES,
            at: WorkspaceAt::default(),
        }
    }
}

impl WorkspaceRule {
    /// The static blocks (indices into `trace.static_blocks`, taken from the end of
    /// `order`) read as workspaces: blocks of exactly `bytes` that the recording never
    /// frees, at most two when the trace trains (`copies > 1`: optimizer state was
    /// recognised, so there is a backward) and one otherwise. Blocks of one size are
    /// interchangeable for placement, so which of them is called the workspace does
    /// not matter.
    pub fn pick(&self, trace: &Trace, order: &[usize], copies: usize) -> Vec<usize> {
        if self.bytes == 0 || self.at == WorkspaceAt::Before {
            return Vec::new();
        }
        let freed: HashSet<u64> = trace
            .events
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Free { id } => Some(id),
                _ => None,
            })
            .collect();
        let most = if copies > 1 { 2 } else { 1 };
        let mut picked: Vec<usize> = order
            .iter()
            .rev()
            .copied()
            .filter(|&i| {
                let b = &trace.static_blocks[i];
                b.bytes == self.bytes && !freed.contains(&b.id)
            })
            .take(most)
            .collect();
        picked.reverse();
        picked
    }

    /// The event index (in `iteration`, or its end) before which each of `n`
    /// workspaces is created: the forward's at `iteration.start`, the backward's at
    /// `peak` (the iteration's first event of most live bytes); with
    /// [`WorkspaceAt::Peak`] all at `peak`. An inference trace's one workspace is the
    /// forward's.
    pub fn points(&self, n: usize, start: usize, first_free: usize, peak: usize) -> Vec<usize> {
        (0..n)
            .map(|k| match self.at {
                WorkspaceAt::Peak => peak,
                WorkspaceAt::FirstFreeAndPeak if k == 0 => first_free,
                _ if k == 0 => start,
                _ => peak,
            })
            .collect()
    }
}

/// The event index just after `it`'s first free of a tensor it allocated (its end if
/// none): where [`WorkspaceAt::FirstFreeAndPeak`] creates the forward's workspace.
pub fn first_free(trace: &Trace, it: Range<usize>) -> usize {
    let mut own = HashSet::new();
    trace.events[it.clone()]
        .iter()
        .position(|e| match e.kind {
            EventKind::Alloc { id, .. } => {
                own.insert(id);
                false
            }
            EventKind::Free { id } => own.contains(&id),
            _ => false,
        })
        .map_or(it.end, |k| it.start + k + 1)
}

#[cfg(test)]
mod tests {
    use memcast_trace::{Event, StaticBlock};

    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::replay::pytorch::{PytorchConfig, PytorchEmu};
    use crate::replay::warmup::tests::{events, statics};
    use crate::replay::{run_warm, ReplayOptions};

    const MIB: u64 = 1 << 20;

    fn trace(sizes: &[u64], freed: &[u64]) -> Trace {
        Trace {
            static_blocks: sizes
                .iter()
                .enumerate()
                .map(|(i, &bytes)| StaticBlock {
                    id: i as u64,
                    bytes,
                    stream: 0,
                })
                .collect(),
            events: freed
                .iter()
                .map(|&id| Event {
                    time_us: 0,
                    kind: EventKind::Free { id },
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn workspaces_are_blocks_of_the_workspace_size_never_freed() {
        let rule = WorkspaceRule::default();
        let t = trace(&[32 * MIB, 8, 32 * MIB, 32 * MIB, 4], &[3]);
        let order: Vec<usize> = (0..5).collect();
        // Training: two (block 3 is freed while recording, so it is no workspace).
        assert_eq!(rule.pick(&t, &order, 3), vec![0, 2]);
        // Inference: one.
        assert_eq!(rule.pick(&t, &order, 1), vec![2]);
        // Off.
        let off = WorkspaceRule {
            at: WorkspaceAt::Before,
            ..rule
        };
        assert!(off.pick(&t, &order, 3).is_empty());
        let none = WorkspaceRule { bytes: 0, ..rule };
        assert!(none.pick(&t, &order, 3).is_empty());
        assert!(rule.pick(&trace(&[8, 4], &[]), &[0, 1], 3).is_empty());
    }

    #[test]
    fn the_forward_workspace_comes_first_the_backward_one_at_the_peak() {
        let rule = WorkspaceRule::default();
        assert_eq!(rule.points(2, 10, 20, 40), vec![10, 40]);
        assert_eq!(rule.points(1, 10, 20, 40), vec![10]);
        let peak = WorkspaceRule {
            at: WorkspaceAt::Peak,
            ..rule
        };
        assert_eq!(peak.points(2, 10, 20, 40), vec![40, 40]);
    }

    /// A training step (one Adam-trained 6 MiB parameter: three static 6 MiB blocks)
    /// with two static 32 MiB workspaces. Each iteration: a 100 MiB activation, freed;
    /// a 60 MiB and a 50 MiB one (the peak); then backward frees the 60 MiB one,
    /// makes a 9 MiB gradient and frees the rest.
    fn step_with_workspaces() -> Trace {
        let iteration = |b: u64| {
            [
                ('+', b, 100 * MIB),
                ('-', b, 0),
                ('+', b + 1, 60 * MIB),
                ('+', b + 2, 50 * MIB),
                ('-', b + 1, 0),
                ('+', b + 3, 9 * MIB),
                ('-', b + 2, 0),
                ('-', b + 3, 0),
            ]
        };
        let mut prog = vec![('|', 0, 0)];
        prog.extend(iteration(1));
        prog.push(('|', 0, 0));
        prog.extend(iteration(11));
        prog.push(('|', 0, 0));
        let t = Trace {
            static_blocks: statics(&[6 * MIB, 6 * MIB, 6 * MIB, 32 * MIB, 32 * MIB]),
            events: events(&prog),
            ..Default::default()
        };
        t.validate().unwrap();
        t
    }

    /// Worked by hand from PyTorch's rules (1-10 MiB requests take 20 MiB segments,
    /// larger ones their size rounded to 2 MiB; large blocks split when more than
    /// 1 MiB remains; best fit).
    #[test]
    fn a_workspace_made_in_the_warm_up_takes_an_activation_segment() {
        let t = step_with_workspaces();
        let replay = |at| {
            let cfg = PytorchConfig {
                workspaces: WorkspaceRule {
                    at,
                    ..Default::default()
                },
                // 18 MiB of parameter and state against 64 MiB of workspaces is too
                // little for the inference (`warmup::state_copies`): set it.
                state_copies: 3,
                ..Default::default()
            };
            let opts = ReplayOptions {
                check_every: 1,
                ..Default::default()
            };
            let emu = PytorchEmu::new(SimBackend::h200(), cfg.clone());
            let plan = cfg.warmup_plan(&t).unwrap();
            let r = run_warm(&t, emu, &opts, Some(&plan)).unwrap();
            (r.peak_reserved_bytes / MIB, plan.workspaces)
        };
        // With the parameters: each workspace takes a 32 MiB segment of its own, the
        // parameter and its state a 20 MiB one. The warm-up makes a 100 MiB segment
        // (the 60 MiB activation splits it) and a 50 MiB one, which every recorded
        // iteration reuses: 20 + 64 + 100 + 50 MiB.
        assert_eq!(replay(WorkspaceAt::Before), (234, vec![]));
        // Made in the warm-up: the forward's at the iteration's start (nothing free is
        // that large: a 32 MiB segment); the backward's at the peak (event 5), where
        // the 40 MiB left of the 100 MiB segment is the best fit. That segment can no
        // longer serve the recording's 100 MiB activation, which takes a new one:
        // 20 + 32 + 100 + 50 + 100 MiB.
        assert_eq!(
            replay(WorkspaceAt::StartAndPeak),
            (302, vec![(3, 1), (4, 5)])
        );
    }
}
