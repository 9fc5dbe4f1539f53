//! Train on MNIST with K simulated nodes.
//!
//! ```text
//! cargo run --release -p examples --bin mnist -- --strategy allreduce --num-nodes 4 \
//!     --model mlp --max-steps 200 --batch-size 64 --lr 3e-4 --data-dir ../shared/data/mnist
//! ```

use examples::runner;
use examples::tasks;
use std::process::ExitCode;

fn main() -> ExitCode {
    runner::train_main(
        "Train an MNIST classifier on K simulated nodes and report loss, accuracy, speed and \
         bytes communicated",
        tasks::mnist,
    )
}
