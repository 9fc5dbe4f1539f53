//! Plan a distributed training run at any size: simulated time, compute utilisation and
//! traffic of a strategy on a cluster, from the model's size alone.
//!
//! ```text
//! cargo run --release -p examples --bin plan -- --params 7B --num-nodes 64 \
//!     --strategy diloco -H 500 --network 1gbit:50ms --tokens 100B \
//!     --tokens-per-step 4M --node-tflops h100 --mfu 0.4
//! ```
//!
//! See [`examples::plan`] for the flags, `--json` and `--sweep`.

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match examples::plan::run(&argv) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}", e.trim_end());
            ExitCode::from(2)
        }
    }
}
