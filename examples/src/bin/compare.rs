//! Compare strategies on one task under identical conditions: a table, plots and metrics.
//!
//! ```text
//! cargo run --release -p examples --bin compare -- --task mnist \
//!     --strategies allreduce,diloco,sparta,fedavg,demo --num-nodes 4 --max-steps 200 \
//!     --data-dir ../shared/data/mnist --out-dir compare-mnist
//! ```
//!
//! See [`examples::compare`] for what the folder holds, and `--config` for run
//! configurations in TOML or JSON. Ctrl-C stops the running strategy with a checkpoint,
//! writes the outputs so far and exits with status 130; the same command with
//! `--resume compare-mnist` continues ([`examples::series`]).

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let interrupt = examples::runner::ctrl_c_flag();
    examples::series::exit_code(
        examples::compare::run_with(&argv, Some(interrupt)).map(|c| (c.files, c.stopped)),
    )
}
