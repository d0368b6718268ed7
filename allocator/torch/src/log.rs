//! Where memcast's log goes inside a PyTorch process.
//!
//! The library is loaded into Python, where no Rust code installs a `tracing`
//! subscriber: without one, the allocator's warnings (advice that could not be
//! followed, a model that could not be loaded) and its debug events (each piece of
//! predictive advice, each growth of a segment) would go nowhere. The first device to
//! start installs one that writes to stderr, filtered by `MEMCAST_LOG`: a `tracing`
//! filter such as `debug` or `memcast_alloc=debug` (`RUST_LOG` syntax), `off` for
//! silence, `warn` when unset. A filter that does not parse is reported on stderr and
//! `warn` is used. A subscriber the process already has is kept.

use std::io::Write;
use std::sync::Once;

use tracing_subscriber::EnvFilter;

/// The environment variable that filters the log.
pub const LOG_ENV: &str = "MEMCAST_LOG";

/// The filter for `value` (the environment variable's, if set): `warn` when unset, and
/// `Err` with the reason when it does not parse.
pub fn filter(value: Option<&str>) -> Result<EnvFilter, String> {
    let v = value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .unwrap_or("warn");
    EnvFilter::try_new(v)
        .map_err(|e| format!("{LOG_ENV}={v:?} is not a log filter ({e}): using warn"))
}

/// Installs the stderr subscriber once per process (later calls do nothing).
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let value = std::env::var(LOG_ENV).ok();
        let f = filter(value.as_deref()).unwrap_or_else(|e| {
            // Not `eprintln!`: a closed stderr must not panic here (and poison this).
            let _ = writeln!(std::io::stderr(), "memcast: {e}");
            EnvFilter::new("warn")
        });
        // `try_init`: a subscriber the process already set is kept.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(f)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_defaults_to_warn_and_names_a_bad_value() {
        assert_eq!(filter(None).unwrap().to_string(), "warn");
        assert_eq!(filter(Some("  ")).unwrap().to_string(), "warn");
        assert_eq!(
            filter(Some("memcast_alloc=debug")).unwrap().to_string(),
            "memcast_alloc=debug"
        );
        let e = filter(Some("memcast_alloc=loud")).unwrap_err();
        assert!(e.contains("MEMCAST_LOG=\"memcast_alloc=loud\""), "{e}");
    }
}
