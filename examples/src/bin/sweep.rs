//! A grid of runs — strategies × node counts × synchronisation intervals × networks — on
//! one task, timed on a simulated cluster: a table and plots of time to target and final
//! loss.
//!
//! ```text
//! cargo run --release -p examples --bin sweep -- --task shakespeare \
//!     --strategies allreduce,diloco --nodes 1,2,4,8 --sync-intervals 30 --networks datacenter,internet \
//!     --global-batch 16 --max-steps 300 --target-loss 2.6 --data-dir ../shared/data/shakespeare
//! ```
//!
//! See [`examples::sweep`] for what the folder holds. Ctrl-C stops the running cell with a
//! checkpoint, writes the outputs so far and exits with status 130; the same command with
//! `--resume sweep` continues ([`examples::series`]).

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let interrupt = examples::runner::ctrl_c_flag();
    examples::series::exit_code(
        examples::sweep::run_with(&argv, Some(interrupt)).map(|s| (s.files, s.stopped)),
    )
}
