//! tutti: collective communication for CPU processes.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod algo;
pub mod error;
pub mod reduce;

pub use error::{Error, Result};
pub use reduce::{DataType, Element, ReduceOp};
