//! The plan guard: per input shape, plans that stall more than running without them
//! are held off (see [`Guard`]).

use super::planned::LIBRARY;

/// A plan is advice, and advice that costs more than it saves is not followed. Per
/// input shape (an iteration's signature), the guard keeps, for the last iteration run
/// under a plan with moves and the last run without one, its stall per byte its live
/// bytes rose above the budget (the bytes any policy must move), and while the planned
/// figure is the higher, iterations of that shape run without a plan (the reactive
/// machinery alone). Only iterations of one shape are compared: across shapes a larger
/// one stalls more per byte too, and comparing them turned plans off on dynamic jobs
/// where they helped. An iteration that stays within the budget says nothing and is
/// not recorded, nor is one that ran past the end of the trajectory its iteration plan
/// came from (the plan had nothing to say there; step plans run only there, so the
/// guard neither credits nor blames them). After [`Guard::RETRY`] iterations of a
/// shape without a plan, its plan is tried again (what it costs may have changed). A
/// job's first iteration has no plan (nothing to plan from): for a job that repeats one
/// shape the first comparison is ready after its second. The oracle plans from the first iteration on, so it is
/// never compared.
///
/// Why: on some static training traces a plan, even one made from the true next
/// iteration, doubles the stall of reactive tiers (more bytes moved, more of them by
/// the out-of-memory path; docs/predictive.md, "The plan guard").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Guard {
    /// Per signature, most recent first, at most [`LIBRARY`].
    pub(super) shapes: Vec<(Vec<u64>, ShapeRecord)>,
    /// Iterations the guard ran without a plan.
    pub suppressed: u64,
}

/// What the guard knows of one shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ShapeRecord {
    /// Stall (us) per byte above the budget of the last iteration of this shape run
    /// under a plan with moves, and without.
    pub(super) planned: Option<f64>,
    pub(super) unplanned: Option<f64>,
    /// Iterations of this shape run without a plan since the guard last turned it off.
    pub(super) off_for: u32,
}

impl Guard {
    /// Iterations of a shape without a plan before its plan is tried again.
    pub const RETRY: u32 = 8;

    /// Records the iteration that ended (its signature, its stall in us, `excess`: the
    /// bytes its live bytes rose above the budget; under a plan or not) and says
    /// whether the next one, taken to be of the same shape, may run under a plan.
    /// O(LIBRARY x SIGNATURE).
    pub fn next_may_plan(&mut self, sig: &[u64], planned: bool, stall: f64, excess: u64) -> bool {
        let i = match self.shapes.iter().position(|(s, _)| s == sig) {
            Some(i) => i,
            None => {
                self.shapes
                    .insert(0, (sig.to_vec(), ShapeRecord::default()));
                self.shapes.truncate(LIBRARY);
                0
            }
        };
        let r = &mut self.shapes[i].1;
        if excess > 0 && stall.is_finite() {
            let x = stall / excess as f64;
            if planned {
                r.planned = Some(x);
            } else {
                r.unplanned = Some(x);
            }
        }
        let worse = matches!((r.planned, r.unplanned), (Some(p), Some(u)) if p > u);
        if !worse {
            r.off_for = 0;
            return true;
        }
        r.off_for += 1;
        if r.off_for > Self::RETRY {
            // Try again: the next planned iteration replaces the old figure.
            r.off_for = 0;
            return true;
        }
        self.suppressed += 1;
        false
    }

    /// Whether plans of shape `sig` are held off.
    pub(super) fn holds_off(&self, sig: &[u64]) -> bool {
        self.shapes.iter().any(|(s, r)| s == sig && r.off_for > 0)
    }
}
