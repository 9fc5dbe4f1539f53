//! Train on MNIST with K simulated nodes.
//!
//! ```text
//! cargo run --release -p examples --bin mnist -- --strategy allreduce --num-nodes 4 \
//!     --model mlp --max-steps 200 --batch-size 64 --lr 3e-4 --data-dir ../shared/data/mnist
//! ```

use burn::tensor::Device;
use clap::{Parser, ValueEnum};
use examples::cli::{self, CommonArgs, WithStrategy};
use examples::{backend, report, tasks};
use gym_core::{ImageBatch, NodeData, RunSummary, StrategyConfig, TrainModel, Trainer};
use gym_data::{MnistBatcher, MnistItem};
use gym_models::{MlpConfig, MnistCnnConfig};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

/// Models for MNIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum ModelName {
    /// 784-256-10 perceptron (fast on CPU).
    Mlp,
    /// The original's CNN (1.87M parameters).
    Cnn,
}

/// Train an MNIST classifier on K simulated nodes and report loss, accuracy, speed and
/// bytes communicated.
#[derive(Debug, Parser, Serialize)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonArgs,
    /// Model to train.
    #[arg(long, value_enum, default_value = "mlp")]
    model: ModelName,
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
    let run = Run {
        cli,
        data: tasks::mnist(cli.common.data_dir.as_deref())?,
        device,
        backend,
        process_start,
    };
    cli.common.dispatch(&run)
}

/// Everything a run needs besides the strategy and the model.
struct Run<'a> {
    cli: &'a Cli,
    data: NodeData<MnistItem>,
    device: Device,
    backend: String,
    process_start: Instant,
}

impl WithStrategy for &Run<'_> {
    type Output = Result<(), Box<dyn std::error::Error>>;

    fn run<S: StrategyConfig>(self, strategy: &S) -> Self::Output {
        match self.cli.model {
            ModelName::Mlp => self.fit(|d| MlpConfig::new().init(d), "mlp", strategy),
            ModelName::Cnn => self.fit(|d| MnistCnnConfig::new().init(d), "cnn", strategy),
        }
    }
}

impl Run<'_> {
    fn fit<M, S>(
        &self,
        init: impl Fn(&Device) -> M + Sync,
        model: &str,
        strategy: &S,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        M: TrainModel<Batch = ImageBatch>,
        S: StrategyConfig,
    {
        let common = &self.cli.common;
        let trainer = Trainer::new(common.trainer_config()).with_devices(vec![self.device.clone()]);
        let fit_start = Instant::now();
        let out = trainer.fit(init, strategy, &self.data, &MnistBatcher)?;
        let summary = RunSummary::new(
            &out.report,
            &strategy.name(),
            model,
            &self.backend,
            self.process_start,
            fit_start,
        );
        let dir = common.run_dir(&out.report.run_name);
        let path = summary.write(&dir)?;
        cli::save_run_config(self.cli, &dir)?;
        report::print_summary(&summary);
        println!(
            "logs              {}",
            path.parent().unwrap_or(&path).display()
        );
        Ok(())
    }
}
