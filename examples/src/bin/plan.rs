//! Plan a distributed training run at any size: simulated time, compute utilisation and
//! traffic of a strategy on a cluster, from the model's size alone, or from its shapes
//! (`--model gpt:LAYERS,HEADS,WIDTH,CONTEXT,VOCAB`, which DeMo and PowerSGD need).
//!
//! ```text
//! cargo run --release -p examples --bin plan -- --params 7B --num-nodes 64 \
//!     --strategy diloco -H 500 --network 1gbit:50ms --tokens 100B \
//!     --tokens-per-step 4M --node-tflops h100 --mfu 0.4
//! ```
//!
//! See [`examples::plan`] for the flags and `--json`, [`examples::plan_sweep`] for
//! `--sweep`.

use clap::Parser;
use examples::plan::PlanArgs;
use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match run(&argv) {
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

/// One plan, printed as text or `--json`, or a sweep's table.
fn run(argv: &[OsString]) -> Result<String, String> {
    let args = PlanArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
    if !args.sweep.is_empty() {
        return examples::plan_sweep::sweep(&args, argv);
    }
    let summary = args.plan()?;
    Ok(if args.json {
        serde_json::to_string(&summary).expect("serialises") + "\n"
    } else {
        summary.text()
    })
}
