//! Shared pieces of the example binaries: one flag vocabulary, backend selection, the
//! printed summary, and the tasks more than one binary trains on ([`cifar`]).

#![warn(missing_docs)]

pub mod backend;
pub mod cifar;
pub mod cli;
pub mod compare;
pub mod plot;
pub mod report;
pub mod tasks;
