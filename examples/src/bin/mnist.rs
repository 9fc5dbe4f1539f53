//! Train on MNIST with K simulated nodes.
//!
//! ```text
//! cargo run --release -p examples --bin mnist -- --strategy allreduce --num-nodes 4 \
//!     --model mlp --max-steps 200 --batch-size 64 --lr 3e-4 --data-dir ../shared/data/mnist
//! ```

use clap::Parser;
use examples::cli::{self, CommonArgs};
use examples::runner;
use examples::tasks::{self, MnistArgs};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

/// Train an MNIST classifier on K simulated nodes and report loss, accuracy, speed and
/// bytes communicated.
#[derive(Debug, Parser, Serialize)]
#[command(version, allow_negative_numbers = true)]
struct Cli {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    #[serde(flatten)]
    mnist: MnistArgs,
}

fn main() -> ExitCode {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let process_start = Instant::now();
    let (cli, _) = cli::parse::<Cli>();
    runner::train_main(process_start, &cli, &cli.common, || {
        tasks::mnist(cli.common.data_dir.as_deref(), &cli.mnist)
    })
}
