//! One way to run a task, shared by every binary and by `compare`: the runner fits the task
//! with a strategy, writes `summary.json`, `run_config.toml` and `report.html` into the run's
//! folder, and prints the summary.
//!
//! A binary is: parse flags → build the [`Task`] (data, model, batcher; see
//! [`crate::tasks`]) → hand it to the [`Runner`] with a strategy (a value:
//! [`CommonArgs::strategy_config`]).

use crate::backend;
use crate::cli::{self, CollectiveKind, CommonArgs, MinibatchSize, TaskCli};
use crate::plot::{Chart, Series, XAxis};
use crate::report::{Report, ReportRun};
use crate::summary::{RunLabels, RunSummary, print_summary};
use crate::tui::{Dashboard, LiveView};
use burn::data::dataloader::batcher::Batcher;
use burn::tensor::Device;
use gym_core::{
    GymError, MinibatchChoice, MinibatchProbeConfig, NodeData, RunReport, StrategyConfig,
    TrainModel, Trainer,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// The error type of the example binaries.
pub type BoxError = Box<dyn std::error::Error>;

/// What an example trains: the model, the data, and how items become batches.
pub struct Task<M, I, B> {
    /// How runs name the model, e.g. `mlp`.
    pub model_name: String,
    /// How runs name the data, e.g. `MNIST`.
    pub dataset: String,
    /// Builds the model on a device (called once per node).
    pub init: Box<dyn Fn(&Device) -> M + Send + Sync>,
    /// Train and validation data.
    pub data: NodeData<I>,
    /// Turns items into the model's batches.
    pub batcher: B,
}

/// What a run measured and where it wrote it.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Everything `fit` measured.
    pub report: RunReport,
    /// The figures of `summary.json`.
    pub summary: RunSummary,
    /// The run's folder.
    pub dir: PathBuf,
}

/// A finished run with its trained model.
pub struct Finished<M> {
    /// The average of the final replicas.
    pub model: M,
    /// What the run measured and where it wrote it.
    pub result: RunResult,
}

/// A [`Task`] whose model type is not known to the caller (`compare`, or a binary that picks
/// the model from a flag).
pub trait TrainTask {
    /// How runs name the model.
    fn model_name(&self) -> &str;

    /// How runs name the data.
    fn dataset(&self) -> &str;

    /// Trains the task with `strategy` and the flags `args`, as [`Runner::fit`] does.
    fn train(
        &self,
        runner: &Runner,
        args: &CommonArgs,
        strategy: &dyn StrategyConfig,
        run_config: &serde_json::Value,
    ) -> Result<RunResult, BoxError>;
}

impl<M, I, B> TrainTask for Task<M, I, B>
where
    M: TrainModel,
    I: Send + 'static,
    B: Batcher<I, M::Batch>,
{
    fn model_name(&self) -> &str {
        &self.model_name
    }

    fn dataset(&self) -> &str {
        &self.dataset
    }

    fn train(
        &self,
        runner: &Runner,
        args: &CommonArgs,
        strategy: &dyn StrategyConfig,
        run_config: &serde_json::Value,
    ) -> Result<RunResult, BoxError> {
        Ok(runner.fit(self, args, strategy, run_config)?.result)
    }
}

/// Runs tasks on this process's device.
pub struct Runner {
    device: Device,
    backend: String,
    process_start: Instant,
    interrupt: Option<Arc<AtomicBool>>,
    /// This process's node of an MPI job (`--collective mpi`), once started.
    mpi: mpi::Node,
}

impl Runner {
    /// A runner on the device [`backend::select`] picks (printed on stderr), for a process
    /// that started at `process_start`.
    pub fn new(process_start: Instant) -> Self {
        let (device, backend) = backend::select();
        eprintln!("backend: {backend}");
        Runner {
            device,
            backend,
            process_start,
            interrupt: None,
            mpi: mpi::Node::new(),
        }
    }

    /// Stops runs at a step boundary, with a checkpoint, when `flag` turns true
    /// ([`Trainer::with_interrupt`]); never, without one.
    pub fn with_interrupt(mut self, flag: Option<Arc<AtomicBool>>) -> Self {
        self.interrupt = flag;
        self
    }

    /// Whether this process writes a run's files and prints its summary: always, except in
    /// an MPI job (`--collective mpi`), where rank 0 alone does.
    pub fn is_rank_zero(&self) -> bool {
        self.mpi.is_rank_zero()
    }

    /// Fits `task` with `strategy` as `args` describe, writes the run's `summary.json` and
    /// `run_config.toml` (`run_config`: the resolved flags), and prints the summary.
    pub fn fit<M, I, B>(
        &self,
        task: &Task<M, I, B>,
        args: &CommonArgs,
        strategy: &dyn StrategyConfig,
        run_config: &serde_json::Value,
    ) -> Result<Finished<M>, BoxError>
    where
        M: TrainModel,
        I: Send + 'static,
        B: Batcher<I, M::Batch>,
    {
        let devices = match &args.devices {
            Some(list) => backend::parse_devices(list)?,
            None => vec![self.device.clone()],
        };
        let fit_start = Instant::now();
        let mut config = args.trainer_config()?;
        let probe = match args.minibatch_size {
            // A resumed run keeps the size it was saved with (a new probe could choose
            // another, which the checkpoint would refuse).
            Some(MinibatchSize::Auto) if args.resume.is_some() => {
                let path = args.resume.as_deref().expect("checked");
                let (saved, _) = gym_core::checkpoint::Checkpoint::load(path)?;
                let trainer: serde_json::Value = serde_json::from_str(&saved.identity.trainer)?;
                let size = trainer["minibatch_size"].as_u64().map(|n| n as usize);
                eprintln!(
                    "minibatch size    {} (from the checkpoint)",
                    size.map_or("the whole batch".into(), |n| n.to_string())
                );
                config.minibatch_size = size;
                None
            }
            Some(MinibatchSize::Auto) => {
                if args.collective == CollectiveKind::Mpi {
                    return Err("--minibatch-size auto runs in one process: give a number \
                                under --collective mpi"
                        .into());
                }
                let choice = Trainer::new(config.clone())
                    .with_devices(devices.clone())
                    .probe_minibatch(
                        &task.init,
                        strategy,
                        &task.data,
                        &task.batcher,
                        &MinibatchProbeConfig::new()
                            .with_budget_bytes(args.memory_budget)
                            .with_cache_file(
                                MinibatchProbeConfig::default_cache_file()
                                    .map(|f| f.to_string_lossy().into_owned()),
                            ),
                    )?;
                eprintln!("{}", describe_probe(&choice, config.num_nodes));
                config.minibatch_size = Some(choice.minibatch_size);
                Some(choice)
            }
            _ => None,
        };
        let dashboard = args.tui.then(|| {
            let title = format!(
                "{} on {} nodes, {}",
                strategy.name(),
                config.num_nodes,
                task.model_name
            );
            Arc::new(Dashboard::new(
                title,
                config.num_nodes,
                config.max_steps.unwrap_or(0),
            ))
        });
        let view = match &dashboard {
            Some(_) if args.collective == CollectiveKind::Mpi => {
                return Err(
                    "--tui shows one process's run: leave it out under --collective mpi".into(),
                );
            }
            Some(d) => LiveView::open(d.clone(), self.interrupt.clone())?,
            None => None,
        };
        if dashboard.is_some() && view.is_none() {
            eprintln!("--tui: standard output is not a terminal; showing the progress bar");
        }
        let trainer = Trainer::new(config)
            .with_devices(devices)
            .with_hparams(args.hparams(run_config));
        let trainer = match (&dashboard, &view) {
            (Some(d), Some(_)) => trainer.with_logger(d.clone()),
            _ => trainer,
        };
        let backend = args.devices.as_deref().unwrap_or(&self.backend);
        let (fitted, backend) = match args.collective {
            CollectiveKind::InProcess => {
                let trainer = match &self.interrupt {
                    Some(flag) => trainer.with_interrupt(flag.clone()),
                    None => trainer,
                };
                let out = trainer.fit(&task.init, strategy, &task.data, &task.batcher);
                (out.map_err(BoxError::from), backend.to_string())
            }
            CollectiveKind::Mpi => {
                let out = self.mpi.fit(&trainer, task, strategy, args.mpi_timeout);
                let processes = self.mpi.processes();
                (out, format!("{backend}; MPI, {processes} processes"))
            }
        };
        if let Some(view) = view {
            view.close();
        }
        let labels = RunLabels {
            strategy: &strategy.name(),
            model: &task.model_name,
            dataset: &task.dataset,
            backend: &backend,
        };
        let out = match fitted {
            Ok(out) => out,
            Err(e) => {
                // A run stopped by a failure (a checkpoint that could not be written) still
                // leaves the summary of the steps it took, marked with the cause.
                if let Some(GymError::Stopped { source, report, .. }) = e.downcast_ref() {
                    let mut summary = RunSummary::new(
                        report,
                        labels,
                        args.target_loss,
                        self.process_start,
                        fit_start,
                    );
                    summary.stopped_by = Some(source.to_string());
                    let dir = args.run_dir(&report.run_name);
                    if self.is_rank_zero() {
                        write_and_print(&summary, &dir, run_config)?;
                        // The report of the steps taken, marked stopped; the failure that
                        // stopped the run (a full disk, say) is the error to report.
                        if let Err(report_error) = write_report(&summary, report, &dir, run_config)
                        {
                            eprintln!("warning: {report_error}");
                        }
                    }
                }
                return Err(e);
            }
        };
        let mut summary = RunSummary::new(
            &out.report,
            labels,
            args.target_loss,
            self.process_start,
            fit_start,
        );
        summary.minibatch_probe = probe;
        let dir = args.run_dir(&out.report.run_name);
        // Under MPI, rank 0 writes the summary and prints it; the others only trained.
        if self.is_rank_zero() {
            loss_chart(&out.report, args.x_axis, &summary).write_svg(&dir.join("loss.svg"))?;
            gym_core::model::save_for_pytorch(&out.model, &dir.join("model.safetensors"))?;
            write_and_print(&summary, &dir, run_config)?;
            write_report(&summary, &out.report, &dir, run_config)?;
        }
        Ok(Finished {
            model: out.model,
            result: RunResult {
                report: out.report,
                summary,
                dir,
            },
        })
    }
}

/// Writes a run's `summary.json` and `run_config.toml` into `dir` and prints the summary:
/// what every run leaves, finished, interrupted or stopped by a failure.
fn write_and_print(
    summary: &RunSummary,
    dir: &std::path::Path,
    run_config: &serde_json::Value,
) -> Result<(), BoxError> {
    summary.write(dir)?;
    cli::save_run_config(run_config, dir)?;
    print_summary(summary);
    println!("logs              {}", dir.display());
    Ok(())
}

/// Writes a run's `report.html` into `dir` ([`crate::report`]): the steps it took, its
/// status saying how it ended.
fn write_report(
    summary: &RunSummary,
    report: &RunReport,
    dir: &std::path::Path,
    run_config: &serde_json::Value,
) -> std::io::Result<PathBuf> {
    Report::single(ReportRun {
        label: &summary.run_name,
        summary,
        report,
        config: run_config,
    })
    .write(dir)
}

/// A run's train loss (mean over nodes) and validation loss (the averaged model) against
/// `axis`.
fn loss_chart(report: &RunReport, axis: XAxis, summary: &RunSummary) -> Chart {
    Chart {
        title: format!(
            "{}: {} on {} nodes, {}",
            summary.run_name, summary.strategy, summary.num_nodes, summary.model
        ),
        x_label: axis.label().into(),
        y_label: "loss".into(),
        log_x: false,
        x_bytes: false,
        series: vec![
            Series {
                label: "train loss (mean over nodes)".into(),
                points: report
                    .train
                    .iter()
                    .map(|r| (axis.value(r.step, r.examples_seen), r.train_loss))
                    .collect(),
            },
            Series {
                label: "validation loss (averaged model)".into(),
                points: report
                    .validation
                    .iter()
                    .map(|v| (axis.value(v.step, v.examples_seen), v.global_loss))
                    .collect(),
            },
        ],
    }
}

/// One line on what the minibatch probe chose: the size, and each size's memory per node.
fn describe_probe(choice: &MinibatchChoice, nodes: usize) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let trials: Vec<String> = choice
        .trials
        .iter()
        .map(|t| {
            let from = if t.cached { ", cached" } else { "" };
            format!("{}: {:.1} MiB{from}", t.minibatch, mib(t.bytes))
        })
        .collect();
    format!(
        "minibatch size    {} (probe per node: {}; budget {:.0} MiB for {nodes} node(s))",
        choice.minibatch_size,
        trials.join(", "),
        mib(choice.budget_bytes)
    )
}

/// Sets the allocator for a run of `nodes` node threads, each with a kernel pool of
/// `kernel_threads` (see [`gym_core::allocator::fit_to_threads`]): for many threads, starts
/// the program again without glibc's per-thread caches, and says so on stderr.
pub fn fit_allocator_to_nodes(nodes: usize, kernel_threads: usize) {
    use gym_core::allocator::{ThreadCaches, fit_to_threads, many_threads_tunables};
    let threads = nodes.saturating_mul(1 + kernel_threads);
    match fit_to_threads(threads) {
        Ok(ThreadCaches::Off) => eprintln!(
            "allocator: glibc's per-thread caches off for {threads} node threads \
             (GLIBC_TUNABLES={})",
            many_threads_tunables()
        ),
        Ok(_) => {}
        Err(e) => eprintln!(
            "allocator: could not restart without glibc's per-thread caches ({e}); \
             going on with them"
        ),
    }
}

/// The whole of a binary that trains one task: parses its command line ([`TaskCli`] of the
/// task's flags `T`, its help headed by `about`), builds the task with `task` (from
/// `--data-dir` and `T`), trains it with the strategy the flags name, and returns the exit
/// status (printing the error, if any). Every flag is saved as the run's `run_config.toml`.
///
/// Ctrl-C (SIGINT, or SIGTERM) stops the run at the next step boundary of every node, writes a
/// checkpoint, the logs and `summary.json` (with `interrupted_at_step`), prints the command
/// that resumes it, and exits with status 130; a second Ctrl-C exits at once. Flags the
/// strategy does not take (a quorum without DiLoCo) exit with status 2, as clap's errors.
/// A run of many nodes starts the program again first ([`fit_allocator_to_nodes`]).
pub fn train_main<T: clap::Args + serde::Serialize>(
    about: &'static str,
    task: impl FnOnce(Option<&Path>, &T) -> Result<Box<dyn TrainTask>, BoxError>,
) -> ExitCode {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let process_start = Instant::now();
    let (cli, _) = cli::parse_command::<TaskCli<T>>(&TaskCli::<T>::command_about(about));
    let common = &cli.common;
    fit_allocator_to_nodes(common.num_nodes, common.kernel_threads_per_node);
    // A flag the strategy does not take is a bad command line, refused before any data
    // is loaded.
    cli::exit_on_strategy_flag_error(common);
    let interrupt = ctrl_c_flag();
    let run = || -> Result<RunResult, BoxError> {
        // An output folder that cannot be written is refused before any data is read.
        common.check_run_folders()?;
        let runner = Runner::new(process_start).with_interrupt(Some(interrupt.clone()));
        let task = task(common.data_dir.as_deref(), &cli.task)?;
        let strategy = common.strategy_config()?;
        task.train(
            &runner,
            common,
            strategy.as_ref(),
            &serde_json::to_value(&cli)?,
        )
    };
    match run() {
        Ok(result) => match (result.report.interrupted_at, &result.report.checkpoint) {
            (Some(step), checkpoint) => {
                eprintln!("interrupted before step {step}");
                match checkpoint {
                    Some(file) => eprintln!(
                        "checkpoint        {}\nresume with       {}",
                        file.display(),
                        resume_command(std::env::args().collect(), file)
                    ),
                    None => eprintln!("no step was taken: nothing to resume"),
                }
                ExitCode::from(130)
            }
            (None, _) => ExitCode::SUCCESS,
        },
        Err(e) => exit_code(Err(e)),
    }
}

/// A flag that Ctrl-C (SIGINT) or SIGTERM sets, for [`Runner::with_interrupt`]: the run
/// stops at the next step boundary with a checkpoint. A second signal, finding the flag
/// set, exits at once with status 130.
pub fn ctrl_c_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered in this order, a second signal finds the flag set and exits.
        let handled = signal_hook::flag::register_conditional_shutdown(signal, 130, flag.clone())
            .and_then(|_| signal_hook::flag::register(signal, flag.clone()));
        if let Err(e) = handled {
            eprintln!("warning: signal {signal} will end the run without a checkpoint ({e})");
        }
    }
    flag
}

/// The command line `argv` with `--resume checkpoint` in place of any `--resume` it had,
/// quoted for a POSIX shell.
pub fn resume_command(argv: Vec<String>, checkpoint: &std::path::Path) -> String {
    let mut words = Vec::with_capacity(argv.len() + 2);
    let mut args = argv.into_iter();
    while let Some(a) = args.next() {
        if a == "--resume" {
            args.next();
        } else if !a.starts_with("--resume=") {
            words.push(a);
        }
    }
    words.push("--resume".into());
    words.push(checkpoint.to_string_lossy().into_owned());
    words
        .iter()
        .map(|w| {
            if !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The exit status of a binary whose work returned `result`, printing the error if any.
pub fn exit_code(result: Result<(), BoxError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a command that writes files (`compare`, `sweep`): lists them, or
/// prints the error (clap's own errors, `--help` included, as clap prints them).
pub fn files_exit_code(result: Result<Vec<PathBuf>, BoxError>) -> ExitCode {
    match result {
        Ok(files) => {
            println!("written:");
            for f in &files {
                println!("  {}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => match e.downcast::<clap::Error>() {
            Ok(clap_error) => clap_error.exit(),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `--collective mpi`: the nodes spread over the processes of an MPI job; refused in a
/// build without the `mpi` feature.
mod mpi {
    use super::{BoxError, Task};
    use burn::data::dataloader::batcher::Batcher;
    use gym_core::{FitOutput, StrategyConfig, TrainModel, Trainer};

    /// This process's share of the job, started on first use (MPI starts once per process)
    /// and finalised when dropped.
    pub struct Node {
        #[cfg(feature = "mpi")]
        transport: std::sync::OnceLock<std::sync::Arc<gym_core::MpiTransport>>,
    }

    impl Node {
        /// Not started yet.
        pub fn new() -> Self {
            Node {
                #[cfg(feature = "mpi")]
                transport: std::sync::OnceLock::new(),
            }
        }

        /// The job's transport, started on first use.
        #[cfg(feature = "mpi")]
        fn transport(
            &self,
            num_nodes: usize,
            timeout_s: f64,
        ) -> Result<&std::sync::Arc<gym_core::MpiTransport>, BoxError> {
            if let Some(transport) = self.transport.get() {
                return Ok(transport);
            }
            let timeout = std::time::Duration::try_from_secs_f64(timeout_s)
                .map_err(|e| format!("--mpi-timeout {timeout_s}: {e}"))?;
            let transport = gym_core::MpiTransport::init(num_nodes)?.with_timeout(timeout);
            Ok(self
                .transport
                .get_or_init(|| std::sync::Arc::new(transport)))
        }

        /// Whether this process writes and prints: the process of rank 0, or not in a job.
        pub fn is_rank_zero(&self) -> bool {
            #[cfg(feature = "mpi")]
            return self.transport.get().is_none_or(|t| t.process() == 0);
            #[cfg(not(feature = "mpi"))]
            true
        }

        /// The processes of the job (1 before it started).
        pub fn processes(&self) -> usize {
            #[cfg(feature = "mpi")]
            return self.transport.get().map_or(1, |t| t.processes());
            #[cfg(not(feature = "mpi"))]
            1
        }

        /// Fits this process's nodes. A node that fails ends the whole job (`MPI_Abort`),
        /// since the others are waiting for it in a collective.
        #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
        pub fn fit<M, I, B>(
            &self,
            trainer: &Trainer,
            task: &Task<M, I, B>,
            strategy: &dyn StrategyConfig,
            timeout_s: f64,
        ) -> Result<FitOutput<M>, BoxError>
        where
            M: TrainModel,
            I: Send + 'static,
            B: Batcher<I, M::Batch>,
        {
            #[cfg(feature = "mpi")]
            {
                let transport = self.transport(trainer.config().num_nodes, timeout_s)?;
                let (init, data, batcher) = (&task.init, &task.data, &task.batcher);
                trainer
                    .fit_with(transport.clone(), init, strategy, data, batcher)
                    .or_else(|e| {
                        eprintln!("error: process {}: {e}", transport.process());
                        transport.abort_job(1)
                    })
            }
            #[cfg(not(feature = "mpi"))]
            Err("--collective mpi needs a build with the `mpi` feature \
                 (cargo build --release -p examples --features mpi; Open MPI and libclang \
                 installed)"
                .into())
        }
    }
}
