//! KV-cached greedy generation: per request (one iteration), a prefill forward over
//! the prompt, then one forward per new token whose key/value caches grow by one
//! position each (`torch.cat` makes a new cache and frees the old one), as Hugging Face's
//! `DynamicCache` does. Batch, prompt length and number of new tokens are drawn per
//! request from the seeded generator, like the real `gpt2_generate_dynamic` trace.

use serde::{Deserialize, Serialize};

use super::expand::Expander;
use super::families::transformer::{build_decode, GptDims};
use super::graph::{DType, Role};
use super::program::Step;
use super::schedule::SplitMix64;
use crate::error::TraceError;

/// The choices a generation request is drawn from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenSpec {
    pub batches: Vec<u64>,
    pub prompts: Vec<u64>,
    pub new_tokens: Vec<u64>,
}

impl Default for GenSpec {
    /// The real `gpt2_generate_dynamic` recording's choices.
    fn default() -> Self {
        GenSpec {
            batches: vec![1, 4, 8, 16],
            prompts: vec![32, 128, 384],
            new_tokens: vec![32, 64, 128],
        }
    }
}

/// A drawn request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub batch: u64,
    pub prompt: u64,
    pub new_tokens: u64,
}

impl GenSpec {
    /// Draws `n` requests.
    pub fn draw(&self, n: usize, rng: &mut SplitMix64) -> Result<Vec<Request>, TraceError> {
        for (what, xs) in [
            ("batches", &self.batches),
            ("prompts", &self.prompts),
            ("new tokens", &self.new_tokens),
        ] {
            if xs.is_empty() || xs.contains(&0) {
                return Err(TraceError::Param(format!(
                    "generation {what} must be a non-empty list of positive numbers"
                )));
            }
        }
        Ok((0..n)
            .map(|_| Request {
                batch: rng.pick(&self.batches),
                prompt: rng.pick(&self.prompts),
                new_tokens: rng.pick(&self.new_tokens),
            })
            .collect())
    }
}

/// Expands one request: boundary, prefill, `new_tokens - 1` decode steps, release.
pub fn request(
    ex: &mut Expander,
    d: GptDims,
    autocast: Option<DType>,
    r: Request,
) -> Result<(), TraceError> {
    ex.p.boundary();
    let mut caches = Vec::new();
    let mut last_holds = Vec::new();
    let mut past = 0;
    let mut new = r.prompt;
    for _ in 0..r.new_tokens.max(1) {
        let g = build_decode(d, r.batch, past, new, autocast)?;
        let externals: Vec<_> = g.with_role(Role::External).collect();
        if externals.len() != caches.len() && past > 0 {
            return Err(TraceError::Param("generation: cache count mismatch".into()));
        }
        let bound: Vec<_> = externals.into_iter().zip(caches.iter().copied()).collect();
        let (mem, _) = ex.forward(&g, &bound)?;
        let n_cache = 2 * d.depth as usize;
        caches = g.held[..n_cache]
            .iter()
            .filter_map(|&v| mem[g.values[v].storage])
            .collect();
        last_holds = ex.iteration_holds(&g, &mem);
        // The stopping check (`unfinished_sequences.max() == 0`) waits for the device;
        // the rest of the loop is host time.
        ex.p.push(Step {
            name: "generation.loop".into(),
            sync: true,
            host_us: ex.cost.host_us_per_token,
            ..Default::default()
        });
        past += new;
        new = 1;
    }
    ex.release("generation.done", last_holds);
    Ok(())
}
