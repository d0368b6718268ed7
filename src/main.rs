//! `memcast`: thin CLI over the memcast libraries. It parses, calls and prints.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` for the command's output on stdout. A closed stdout (`memcast ... | head`)
/// is a normal end of the reader's interest, not an error: the first write that fails
/// with a broken pipe ends the process quietly with exit status 0 (what remains would be
/// printed to nobody). Any other write error is reported and fails the command.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout_line(format_args!($($arg)*))
    };
}

mod cmd;

/// Writes one line to stdout for [`out!`].
fn stdout_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

#[derive(Parser)]
#[command(
    name = "memcast",
    version,
    about = "A GPU memory allocator that looks ahead"
)]
struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `memcast_alloc=debug`.
    #[arg(long, global = true, env = "MEMCAST_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Import, inspect, generate, featurize, export and plot traces.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
    /// Replay a trace through an allocator policy and report the metrics.
    Replay(cmd::replay::ReplayArgs),
    /// Import the bundled traces and show what memcast does with them.
    Demo(cmd::demo::DemoArgs),
    /// Train the demand forecaster (LSTM) on traces.
    Train(cmd::train::TrainArgs),
    /// Evaluate a forecaster against simple baselines on traces.
    Eval(cmd::eval::EvalArgs),
    /// Export a trained forecaster's weights (safetensors or burn record).
    Export(cmd::export::ExportArgs),
    /// Print (and plot) forecast against actual demand on a trace.
    Predict(cmd::predict::PredictArgs),
    /// Re-check memcast on one split of a trace corpus, against PyTorch's own figures.
    Corpus(cmd::corpus::CorpusArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match tracing_subscriber::EnvFilter::try_new(&cli.log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: --log {:?}: not a log filter ({e}); e.g. info or memcast_alloc=debug",
                cli.log
            );
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Trace(c) => cmd::trace::run(c),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Train(a) => cmd::train::run(a),
        Command::Eval(a) => cmd::eval::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Predict(a) => cmd::predict::run(a),
        Command::Corpus(a) => cmd::corpus::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "error: {}", error_message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", each cause left out where the message so
/// far already holds its text. The libraries mix two conventions: memcast-trace's and
/// memcast-predictor's errors print their cause in their message and do not return it
/// as `source()`; some of memcast-alloc's do both (the tier manager's: the whole chain,
/// `{:#}`, said "setup: device allocator: no CUDA driver found: device allocator: no
/// CUDA driver found: no CUDA driver found"), and its out-of-memory error returns the
/// backend's cause only as `source()`. Joining here prints every cause once under
/// either, and drops none.
fn error_message(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::error_message;
    use std::fmt;

    /// A library-style error: its message holds its cause's, and `source()` returns it.
    #[derive(Debug)]
    struct Alloc(NoDriver);

    #[derive(Debug)]
    struct NoDriver;

    impl fmt::Display for NoDriver {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("no CUDA driver found")
        }
    }
    impl std::error::Error for NoDriver {}

    impl fmt::Display for Alloc {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "device allocator: {}", self.0)
        }
    }
    impl std::error::Error for Alloc {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_the_message_already_holds_is_said_once() {
        let e = anyhow::Error::new(Alloc(NoDriver)).context("replay of T failed");
        assert_eq!(format!("{e:#}").matches("no CUDA driver found").count(), 2);
        assert_eq!(
            error_message(&e),
            "replay of T failed: device allocator: no CUDA driver found"
        );
        // A cause that adds text is kept.
        let e = anyhow::Error::new(NoDriver).context("replay of T failed");
        assert_eq!(
            error_message(&e),
            "replay of T failed: no CUDA driver found"
        );
    }
}
