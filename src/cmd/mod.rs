//! One module per subcommand: each defines its clap arguments and a `run`.

pub mod demo;
pub mod eval;
pub mod export;
pub mod features_csv;
pub mod gen;
pub mod plot;
pub mod predict;
pub mod replay;
pub mod trace;
pub mod train;
