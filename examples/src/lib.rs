//! Shared pieces of the example binaries: one flag vocabulary, backend selection, and the
//! printed summary.

#![warn(missing_docs)]

pub mod backend;
pub mod cli;
pub mod compare;
pub mod plot;
pub mod report;
pub mod tasks;
