//! Shared pieces of the example binaries: one flag vocabulary ([`cli`]), the tasks they
//! train ([`tasks`]), one runner that fits a task and reports it ([`runner`], [`summary`]),
//! the shipped network files ([`networks`]), backend selection, the comparison of strategies
//! ([`compare`], [`plot`]) and grids of runs on a simulated cluster ([`sweep`]), both stopped
//! by Ctrl-C and continued by `--resume` ([`series`]), plans at any size without a model
//! ([`plan`]), the self-contained `report.html` of a run or a series ([`report`]) and a live
//! dashboard ([`tui`]), and an emulated cluster of hosts with shaped links to run MPI jobs
//! across ([`cluster`]).

#![warn(missing_docs)]

pub mod backend;
pub mod bench_suite;
pub mod cli;
pub mod cluster;
pub mod compare;
pub mod config_file;
pub mod networks;
pub mod plan;
pub mod plan_model;
pub mod plan_sweep;
pub mod plot;
pub mod report;
pub mod runner;
pub mod series;
pub mod summary;
pub mod sweep;
pub mod tasks;
pub mod tui;
