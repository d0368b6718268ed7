//! Progress on a terminal for long work: a spinner with the elapsed time on stderr, drawn
//! only when stderr is a terminal (nothing in pipes, logs or tests).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner that says what is being done; cleared when dropped.
pub struct Busy(ProgressBar);

impl Busy {
    pub fn new(what: impl Into<String>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Busy(ProgressBar::hidden());
        }
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("static template"),
        );
        pb.set_message(what.into());
        pb.enable_steady_tick(Duration::from_millis(200));
        Busy(pb)
    }

    /// Says what is being done now.
    pub fn set(&self, what: impl Into<String>) {
        self.0.set_message(what.into());
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
