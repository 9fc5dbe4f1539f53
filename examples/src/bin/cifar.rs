//! Train a small CNN on CIFAR-10 (or the CIFAR-like approximation) with K simulated nodes.
//!
//! ```text
//! # CIFAR-like: the lossy 10,000-image approximation available here
//! cargo run --release -p examples --bin cifar -- --approx \
//!     ../shared/data/cifar10/approx/test_classordered.bin.gz --num-nodes 4 --max-steps 200
//! # CIFAR-10 itself, downloaded into ~/.cache/exogym-rs/cifar10 when absent
//! cargo run --release -p examples --bin cifar -- --num-nodes 4 --max-steps 2000
//! ```

use clap::Parser;
use examples::cli::{self, CommonArgs};
use examples::runner;
use examples::tasks::{self, CifarArgs};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

/// Train a CIFAR-10 classifier on K simulated nodes and report loss, accuracy, speed and
/// bytes communicated. `--data-dir` is the `cifar-10-batches-bin` folder (downloaded when
/// absent); `--approx FILE` trains on a CIFAR-like approximation instead.
#[derive(Debug, Parser, Serialize)]
#[command(version, allow_negative_numbers = true)]
struct Cli {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    #[serde(flatten)]
    cifar: CifarArgs,
}

fn main() -> ExitCode {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let process_start = Instant::now();
    let (cli, _) = cli::parse::<Cli>();
    runner::train_main(process_start, &cli, &cli.common, || {
        Ok(tasks::cifar(cli.common.data_dir.as_deref(), &cli.cifar)?)
    })
}
