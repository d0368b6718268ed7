//! One module per subcommand: each defines its clap arguments and a `run`.

pub mod demo;
pub mod replay;
pub mod trace;
