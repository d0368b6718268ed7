//! A device budget (`--budget`): bytes, or a share of a trace's peak requested bytes.

use serde::Serialize;

use crate::config::parse_bytes;

/// A device budget: absolute bytes or a fraction of the trace's peak requested bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Budget {
    Bytes(u64),
    Fraction(f64),
}

/// How a budget is written (the one parser of `--budget`, in every command).
pub const BUDGET_SYNTAX: &str = "a share of the trace's peak requested bytes (60%, or 0.6: a number with a point, at most 1) or bytes (12G, 512M, 123456)";

impl std::str::FromStr for Budget {
    type Err = String;
    /// `60%` and `0.6` are shares of the peak (in (0, 100%]); `12G`, `1.5G` and
    /// `123456` are bytes. A number with a point and no unit is a share, so it must be at
    /// most 1: `1.5` is an error, not 2 bytes.
    fn from_str(s: &str) -> Result<Self, String> {
        Budget::parse_as(s, "budget")
    }
}

impl Budget {
    /// As `str::parse`, with errors that call the value `what` (`budget`, `pinned pool`).
    pub fn parse_as(s: &str, what: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = |why: String| format!("{what} {s:?}: {why}; write {BUDGET_SYNTAX}");
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| bad("not a percentage".into()))?;
            return Budget::fraction(v / 100.0).map_err(bad);
        }
        if t.contains('.') && !t.contains(|c: char| c.is_ascii_alphabetic()) {
            let v: f64 = t.parse().map_err(|_| bad("not a number".into()))?;
            return Budget::fraction(v).map_err(bad);
        }
        let b = parse_bytes(t).map_err(|e| match e {
            crate::AllocError::Config(m) => bad(m),
            other => bad(other.to_string()),
        })?;
        if b == 0 {
            return Err(bad("zero bytes".into()));
        }
        within_max(b).map_err(bad)?;
        Ok(Budget::Bytes(b))
    }
}

/// The largest budget in bytes: a device of more would need an address range beyond
/// the 2^64 bytes a segment's offsets count (a growable segment reserves twice the
/// device's capacity, rounded up to a power of two).
pub const MAX_BUDGET_BYTES: u64 = 1 << 62;

/// `Err` naming the bound where `bytes` is above [`MAX_BUDGET_BYTES`].
pub(crate) fn within_max(bytes: u64) -> Result<(), String> {
    if bytes > MAX_BUDGET_BYTES {
        return Err(format!(
            "{bytes} bytes is beyond the largest budget memcast models, 2^62 bytes (4 EiB)"
        ));
    }
    Ok(())
}

/// `--budget` where only a share of each trace's peak is meaningful (commands that
/// replay several traces of different sizes, `why` says which): the share, or an
/// error that says what to write.
pub fn parse_share(s: &str, why: &str) -> Result<f64, String> {
    let share = "a share of each trace's peak, above 0 and at most 100% (60%, or 0.6)";
    match s.parse::<Budget>() {
        Ok(Budget::Fraction(f)) => Ok(f),
        Ok(Budget::Bytes(_)) => Err(format!(
            "budget {s:?}: {why}, so it takes {share}, not bytes"
        )),
        Err(_) => Err(format!("budget {s:?}: not {share}")),
    }
}

impl Budget {
    fn fraction(v: f64) -> Result<Budget, String> {
        if v > 0.0 && v <= 1.0 {
            Ok(Budget::Fraction(v))
        } else {
            Err(format!(
                "a share of the peak must be above 0 and at most 100% (it is {}%); more than the peak is written in bytes",
                v * 100.0
            ))
        }
    }
    /// Bytes for a trace whose peak requested bytes are `peak`.
    pub fn bytes(&self, peak: u64) -> u64 {
        match *self {
            Budget::Bytes(b) => b,
            Budget::Fraction(f) => ((peak as f64 * f) as u64).max(1),
        }
    }
}
