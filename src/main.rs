//! `memcast`: thin CLI over the memcast libraries. It parses, calls and prints.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

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
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
