//! Train a small CNN on CIFAR-10 (or the CIFAR-like approximation) with K simulated nodes.
//!
//! ```text
//! # CIFAR-like: the lossy 10,000-image approximation available here
//! cargo run --release -p examples --bin cifar -- --approx \
//!     ../shared/data/cifar10/approx/test_classordered.bin.gz --num-nodes 4 --max-steps 200
//! # CIFAR-10 itself, downloaded into ~/.cache/exogym-rs/cifar10 when absent
//! cargo run --release -p examples --bin cifar -- --num-nodes 4 --max-steps 2000
//! ```

use burn::tensor::Device;
use clap::Parser;
use examples::cifar::{CifarArgs, MODEL_NAME, cifar_data, cifar_model, write_summary};
use examples::cli::{self, CommonArgs, WithStrategy};
use examples::{backend, report};
use gym_core::{NodeData, RunSummary, StrategyConfig, Trainer};
use gym_data::{CifarBatcher, CifarItem};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

/// Train a CIFAR-10 classifier on K simulated nodes and report loss, accuracy, speed and
/// bytes communicated. `--data-dir` is the `cifar-10-batches-bin` folder (downloaded when
/// absent); `--approx FILE` trains on a CIFAR-like approximation instead.
#[derive(Debug, Parser, Serialize)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    #[serde(flatten)]
    cifar: CifarArgs,
}

fn main() -> ExitCode {
    let process_start = Instant::now();
    let (cli, _) = cli::parse::<Cli>();
    match run(&cli, process_start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli, process_start: Instant) -> Result<(), Box<dyn std::error::Error>> {
    let (device, backend) = backend::select();
    eprintln!("backend: {backend}");
    let data = cifar_data(cli.common.data_dir.as_deref(), &cli.cifar)?;
    eprintln!(
        "data: {} ({} train, {} validation images)",
        data.dataset, data.train_len, data.val_len
    );
    let run = Run {
        cli,
        dataset: data.dataset,
        data: data.data,
        device,
        backend,
        process_start,
    };
    cli.common.dispatch(&run)
}

/// Everything a run needs besides the strategy.
struct Run<'a> {
    cli: &'a Cli,
    dataset: &'static str,
    data: NodeData<CifarItem>,
    device: Device,
    backend: String,
    process_start: Instant,
}

impl WithStrategy for &Run<'_> {
    type Output = Result<(), Box<dyn std::error::Error>>;

    fn run<S: StrategyConfig>(self, strategy: &S) -> Self::Output {
        let common = &self.cli.common;
        let trainer = Trainer::new(common.trainer_config()).with_devices(vec![self.device.clone()]);
        let fit_start = Instant::now();
        let out = trainer.fit(cifar_model, strategy, &self.data, &CifarBatcher)?;
        let summary = RunSummary::new(
            &out.report,
            &strategy.name(),
            MODEL_NAME,
            &self.backend,
            self.process_start,
            fit_start,
        );
        let dir = common.run_dir(&out.report.run_name);
        let path = write_summary(&summary, self.dataset, &dir)?;
        cli::save_run_config(self.cli, &dir)?;
        report::print_summary(&summary);
        println!("dataset           {}", self.dataset);
        println!(
            "logs              {}",
            path.parent().unwrap_or(&path).display()
        );
        Ok(())
    }
}
