//! Model families: each builds the forward graph of one iteration for a given shape.

pub mod bert;
pub mod cnn;
pub mod mlp;
pub mod mobilenet;
pub mod transformer;
