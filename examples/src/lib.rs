//! Shared pieces of the example binaries: one flag vocabulary ([`cli`]), the tasks they
//! train ([`tasks`]), one runner that fits a task and reports it ([`runner`], [`summary`]),
//! backend selection, and the comparison of strategies ([`compare`], [`plot`]).

#![warn(missing_docs)]

pub mod backend;
pub mod cli;
pub mod compare;
pub mod plot;
pub mod runner;
pub mod summary;
pub mod tasks;
