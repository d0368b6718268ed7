//! A plan the trace's source chose, executed by the budgeted replay in place of the
//! reactive policies (`memcast replay TRACE --budget B --plan PLAN.json`).
//!
//! A source that decided itself what leaves the device (`memcast_torch.offload`: per
//! block keep, offload, recompute, offload the input) writes its decisions beside the
//! trace, so that the simulator replays the same plan and its predicted step time can be
//! set against the measured one. The document:
//!
//! ```json
//! {"format": "memcast-plan", "version": 1, "directives": [
//!   {"before_event": 12, "action": "spill", "id": 7},
//!   {"before_event": 40, "action": "prefetch", "id": 7},
//!   {"before_event": 13, "action": "drop", "id": 9}]}
//! ```
//!
//! Each directive acts on tensor `id` when the replay reaches trace event
//! `before_event` (after the clock has advanced to that event's time, before the event
//! itself; `before_event` = the number of events: at the end): `spill` starts its copy
//! to the host (the device bytes go when the copy completes), `prefetch` starts its copy
//! back, `drop` frees it to be recomputed at its next access (its `TensorMeta` needs a
//! producer and a `recompute_us`; `tier::replay::producer_inputs` finds the inputs). A
//! prefetch of a tensor whose spill is still in flight is issued once the spill has
//! completed (as the engine's host-to-device stream waits for the spill's event). With a
//! plan the replay's own prefetcher is off and spills start only when an allocation
//! would not fit the budget otherwise (high watermark 100%): what the plan leaves on the
//! device stays there unless the budget forces it.
//!
//! Directives are checked against the trace before the replay starts: an unknown event
//! index or a tensor that is not live at that event is an error naming the directive's
//! index.

use std::collections::HashMap;
use std::path::Path;

use memcast_trace::{EventKind, Trace};
use serde::Deserialize;

use super::handle::{Place, TensorHandle};
use super::manager::TierManager;
use super::TierError;
use crate::backend::DeviceBackend;

/// The `format` field's value.
pub const FORMAT: &str = "memcast-plan";
/// The document version this memcast reads.
pub const VERSION: u32 = 1;

/// What a directive does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Spill,
    Prefetch,
    Drop,
}

/// One decision of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Directive {
    pub before_event: u64,
    pub action: Action,
    pub id: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    format: String,
    version: u32,
    directives: Vec<Directive>,
}

/// A plan: its directives in the order they act (by `before_event`, stable).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub directives: Vec<Directive>,
}

impl Plan {
    pub fn new(mut directives: Vec<Directive>) -> Plan {
        directives.sort_by_key(|d| d.before_event);
        Plan { directives }
    }

    /// Parses a plan document; a malformed one names the line and column.
    pub fn parse(data: &[u8]) -> Result<Plan, String> {
        let doc: Doc = serde_json::from_slice(data).map_err(|e| format!("plan: {e}"))?;
        if doc.format != FORMAT {
            return Err(format!(
                "plan: \"format\" is {:?}, not {FORMAT:?}",
                doc.format
            ));
        }
        if doc.version != VERSION {
            return Err(format!(
                "plan: document version {}; this memcast reads version {VERSION}",
                doc.version
            ));
        }
        Ok(Plan::new(doc.directives))
    }

    /// Reads a plan document; errors name the file.
    pub fn load(path: &Path) -> Result<Plan, String> {
        let data =
            memcast_trace::io::read_bounded(path, memcast_trace::limits::MAX_TEXT_FILE_BYTES)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        Plan::parse(&data).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Whether any directive drops a tensor (the replay then runs recomputes).
    pub fn drops(&self) -> bool {
        self.directives.iter().any(|d| d.action == Action::Drop)
    }

    /// Checks every directive against `trace`: its event exists (or is the end) and
    /// its tensor is live there (allocated before that event, not yet freed); a drop's
    /// tensor has a recompute cost. Errors name the directive (its index in the order
    /// of `before_event`) and the event.
    pub fn check(&self, trace: &Trace) -> Result<(), String> {
        let n = trace.events.len() as u64;
        let mut live: std::collections::HashSet<u64> =
            trace.static_blocks.iter().map(|b| b.id).collect();
        let costed: std::collections::HashSet<u64> = trace
            .tensors
            .iter()
            .filter(|t| t.recompute_us.is_some_and(|r| r > 0) && t.producer.is_some())
            .map(|t| t.id)
            .collect();
        let mut next = 0usize;
        for (k, d) in self.directives.iter().enumerate() {
            if d.before_event > n {
                return Err(format!(
                    "plan directive {k}: event {} is past the trace's end ({n} events)",
                    d.before_event
                ));
            }
            while (next as u64) < d.before_event {
                match trace.events[next].kind {
                    EventKind::Alloc { id, .. } => {
                        live.insert(id);
                    }
                    EventKind::Free { id } => {
                        live.remove(&id);
                    }
                    _ => {}
                }
                next += 1;
            }
            if !live.contains(&d.id) {
                return Err(format!(
                    "plan directive {k}: tensor {} is not live before trace event {}",
                    d.id, d.before_event
                ));
            }
            if d.action == Action::Drop && !costed.contains(&d.id) {
                return Err(format!(
                    "plan directive {k}: tensor {} is dropped but its TensorMeta gives no producer and recompute cost",
                    d.id
                ));
            }
        }
        Ok(())
    }
}

/// What the replay did with the plan (in the report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlanRun {
    /// Directives in the plan, and those carried out (a prefetch issued after its spill
    /// completed counts once issued).
    pub directives: u64,
    pub issued: u64,
    /// Directives the manager refused: the tensor was not where the action needs it
    /// (a prefetch of a tensor on the device, a drop of one not recomputable), or a
    /// prefetch found no room without spilling.
    pub refused: u64,
    /// Prefetches that waited for their tensor's spill to complete.
    pub deferred: u64,
    /// Accesses that found their tensor's spill still in flight: they waited for it and
    /// for the copy back ([`before_access`]).
    pub waited_spills: u64,
}

/// Carries out the directives due before trace event `event` (from `*pc` on), and the
/// prefetches deferred until their spill completed. `live`: the replay's tensors by
/// trace id. An `Err` is the manager's (out of memory on a recompute, a transfer that
/// failed); a refused directive is counted, not an error.
pub(crate) fn run_due<B: DeviceBackend>(
    m: &mut TierManager<B>,
    directives: &[Directive],
    pc: &mut usize,
    event: u64,
    live: &HashMap<u64, TensorHandle>,
    deferred: &mut Vec<TensorHandle>,
    stats: &mut PlanRun,
) -> Result<(), TierError> {
    if !deferred.is_empty() {
        m.poll()?;
        let mut still = Vec::new();
        for h in std::mem::take(deferred) {
            match m.place(h) {
                Ok(Place::SpillingOut { .. }) => still.push(h),
                Ok(_) => {
                    if m.prefetch(h)? {
                        stats.issued += 1;
                    } else {
                        stats.refused += 1;
                    }
                }
                // Freed meanwhile: nothing to bring back.
                Err(_) => stats.refused += 1,
            }
        }
        *deferred = still;
    }
    while let Some(d) = directives.get(*pc).filter(|d| d.before_event <= event) {
        *pc += 1;
        let Some(&h) = live.get(&d.id) else {
            // Zero-byte tensors are not registered (`Plan::check` saw the rest live).
            stats.refused += 1;
            continue;
        };
        let done = match d.action {
            Action::Spill => m.spill(h)?,
            Action::Drop => m.drop_tensor(h)?,
            Action::Prefetch => {
                // A spill that completed by now is seen completed (place() alone does
                // not poll the transfers).
                m.poll()?;
                if matches!(m.place(h)?, Place::SpillingOut { .. }) {
                    stats.deferred += 1;
                    deferred.push(h);
                    continue;
                }
                m.prefetch(h)?
            }
        };
        if done {
            stats.issued += 1;
        } else {
            stats.refused += 1;
        }
    }
    Ok(())
}

/// Before the replay accesses `h` under a plan: a tensor whose spill is still in
/// flight is used from its host copy, as the engine does (its host-to-device copy waits
/// for the spill's event, the compute stream for that copy): the replay waits for the
/// spill, then fetches it back (the access waits for that copy). Without this the
/// manager would cancel the spill and use the device copy at no cost, which the engine
/// never does.
pub(crate) fn before_access<B: DeviceBackend>(
    m: &mut TierManager<B>,
    h: TensorHandle,
    deferred: &mut Vec<TensorHandle>,
    stats: &mut PlanRun,
) -> Result<(), TierError> {
    m.poll()?;
    let Place::SpillingOut { transfer, .. } = m.place(h)? else {
        return Ok(());
    };
    stats.waited_spills += 1;
    m.wait_for(transfer)?;
    if let Some(k) = deferred.iter().position(|&x| x == h) {
        deferred.swap_remove(k);
        stats.issued += 1;
    }
    m.prefetch(h)?;
    Ok(())
}

#[cfg(test)]
#[path = "directives_tests.rs"]
mod tests;
