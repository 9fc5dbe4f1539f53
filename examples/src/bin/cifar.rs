//! Train a small CNN on CIFAR-10 (or the CIFAR-like approximation) with K simulated nodes.
//!
//! ```text
//! # CIFAR-like: the lossy 10,000-image approximation available here
//! cargo run --release -p examples --bin cifar -- --approx \
//!     ../shared/data/cifar10/approx/test_classordered.bin.gz --num-nodes 4 --max-steps 200
//! # CIFAR-10 itself, downloaded into ~/.cache/exogym-rs/cifar10 when absent
//! cargo run --release -p examples --bin cifar -- --num-nodes 4 --max-steps 2000
//! ```

use examples::runner;
use examples::tasks;
use std::process::ExitCode;

fn main() -> ExitCode {
    runner::train_main(
        "Train a CIFAR-10 classifier on K simulated nodes and report loss, accuracy, speed and \
         bytes communicated. `--data-dir` is the `cifar-10-batches-bin` folder (downloaded when \
         absent); `--approx FILE` trains on a CIFAR-like approximation instead",
        |data_dir, cifar| Ok(tasks::cifar(data_dir, cifar)?),
    )
}
