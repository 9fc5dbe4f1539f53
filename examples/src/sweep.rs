//! A grid of runs on one task — strategies × node counts × synchronisation intervals ×
//! networks — timed on a simulated cluster: the `sweep` binary.
//!
//! Every cell is one run of the shared runner, so each has its own folder under
//! `runs/`. The output folder gets `results.md` (a table of final loss, simulated time,
//! compute utilisation, goodput, node-steps lost to `--faults` and time to `--target-loss`
//! per cell), `results.csv`, and plots:
//! `time_to_target.svg` and `simulated_time.svg` against the node count (one line per
//! strategy, interval and network), `final_loss.svg` against the node count, `val_loss.svg`
//! (every run's validation loss against the step or, `--x-axis examples`, the examples seen)
//! and `val_loss_vs_time_<network>.svg` (against simulated time), and `report.html`, every
//! cell's curves, utilisation, first steps and flags on one self-contained page
//! ([`crate::report`]).
//!
//! A `--config` file's `[at_nodes.<K>]` table gives flags for the cells of K nodes only:
//! the DiLoCo scaling experiment's learning rate, warmup and dropout per node count.
//!
//! With `--global-batch B`, each node trains on `B / K` examples per step, so every cell sees
//! the same examples per step and in total (equal total tokens).
//!
//! Ctrl-C stops the running cell with a checkpoint (in `runs/<cell>/`), writes the table,
//! CSV and plots of the cells done so far (the stopped one marked `interrupted at step N`,
//! and in `results.csv`'s `status`), and prints the command that continues: the same with
//! `--resume DIR` (see [`crate::series`]).

use crate::cli::{self, CollectiveKind, CommonArgs, StrategyName};
use crate::plot::{Chart, Series};
use crate::report::{Report, ReportRun};
use crate::runner::{BoxError, Runner};
use crate::series::{self, SeriesDir, Status, Stopped};
use crate::summary::{RunSummary, percent, seconds};
use crate::tasks::{self, TaskArgs};
use clap::{CommandFactory, Parser};
use gym_core::RunReport;
use gym_strategies::registry::SyncArgs;
use serde::Serialize;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Run a grid of strategies × node counts × synchronisation intervals × networks on one
/// task, timed on a simulated cluster, and write a table and plots of time to target and
/// final loss.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(version, about, name = "sweep", allow_negative_numbers = true)]
pub struct SweepArgs {
    /// The flags every run shares (`--strategy`, `--num-nodes`, `-H` and `--network` are
    /// set per cell).
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonArgs,
    /// What to train.
    #[command(flatten)]
    #[serde(flatten)]
    pub task: TaskArgs,
    /// Strategies, comma-separated. Every cell meets the same --faults; the quorum flags
    /// (--min-quorum, --grace, --fastest) apply to the strategies that have a quorum and
    /// are skipped for the others.
    #[arg(
        long,
        value_parser = StrategyName::parser(),
        value_delimiter = ',',
        default_value = "allreduce,diloco"
    )]
    pub strategies: Vec<StrategyName>,
    /// Node counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub nodes: Vec<usize>,
    /// Synchronisation intervals (H) of the strategies that have one, comma-separated
    /// (default: each strategy's own).
    #[arg(long, value_delimiter = ',')]
    pub sync_intervals: Vec<usize>,
    /// Networks, comma-separated presets or specs (one link for every node; see --network).
    #[arg(long, value_delimiter = ',', default_value = "datacenter,internet")]
    pub networks: Vec<String>,
    /// Examples per step over all nodes: each of K nodes gets global-batch/K (equal total
    /// tokens across node counts). Default: --batch-size per node.
    #[arg(long)]
    pub global_batch: Option<usize>,
    /// Output folder; each cell's run goes in `runs/<cell>/`, with its checkpoint after
    /// Ctrl-C (see `--resume`).
    #[arg(long, default_value = "sweep")]
    pub out_dir: PathBuf,
}

/// One cell of the grid.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Strategy.
    pub strategy: StrategyName,
    /// Nodes.
    pub nodes: usize,
    /// Synchronisation interval, for the strategies that have one.
    pub sync_interval: Option<usize>,
    /// Network spec.
    pub network: String,
    /// What the run measured.
    pub report: RunReport,
    /// Its summary.
    pub summary: RunSummary,
    /// Whether it finished or Ctrl-C stopped it.
    pub status: Status,
    /// Whether an earlier call ran it (`--resume`; read back, not trained).
    pub skipped: bool,
    /// Its resolved flags (its `run_config.toml`), as JSON.
    pub config: serde_json::Value,
}

impl Cell {
    /// The cell's name, e.g. `diloco-H20-k4-internet`, also its run folder.
    pub fn name(&self) -> String {
        cell_name(self.strategy, self.sync_interval, self.nodes, &self.network)
    }

    /// The line a plot draws this cell on: everything but the node count.
    fn series(&self) -> String {
        let h = self
            .sync_interval
            .map_or(String::new(), |h| format!(" H={h}"));
        format!("{}{h} on {}", self.strategy.as_str(), self.network)
    }
}

fn cell_name(strategy: StrategyName, h: Option<usize>, k: usize, network: &str) -> String {
    let h = h.map_or(String::new(), |h| format!("-H{h}"));
    format!("{}{h}-k{k}-{}", strategy.as_str(), file_safe(network))
}

/// `spec` with every character but letters and digits replaced, for file names.
fn file_safe(spec: &str) -> String {
    spec.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// What a sweep produced.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Every cell, in grid order (strategy, interval, network, nodes).
    pub cells: Vec<Cell>,
    /// The files written.
    pub files: Vec<PathBuf>,
    /// Where Ctrl-C stopped the sweep (the cells after it did not start).
    pub stopped: Option<Stopped>,
}

/// Parses `argv` (program name first, `--config` honoured) and runs the sweep, without a
/// Ctrl-C flag ([`run_with`] for one).
pub fn run(argv: &[OsString]) -> Result<Sweep, BoxError> {
    run_with(argv, None)
}

/// [`run`], stopping at a step boundary when `interrupt` turns true (Ctrl-C): the running
/// cell writes its checkpoint, no further one starts, and the outputs hold the cells done
/// so far ([`Sweep::stopped`]).
pub fn run_with(argv: &[OsString], interrupt: Option<Arc<AtomicBool>>) -> Result<Sweep, BoxError> {
    let process_start = Instant::now();
    let command = series::resumable(tasks::with_small_gpt(SweepArgs::command()));
    let (mut args, file) = cli::try_parse_from::<SweepArgs>(&command, argv)?;
    if args.strategies.is_empty() || args.nodes.is_empty() || args.networks.is_empty() {
        return Err("--strategies, --nodes and --networks each need a value".into());
    }
    if let Some(k) = args.nodes.iter().find(|&&k| k == 0) {
        return Err(format!("--nodes: {k} is not a node count").into());
    }
    if args.common.collective == CollectiveKind::Mpi {
        // An MPI job has one node count, its process count; a sweep varies it.
        return Err(
            "sweep runs in-process; under mpirun, use `compare` or a training binary \
                    with --collective mpi"
                .into(),
        );
    }
    if let Some(b) = args.global_batch
        && let Some(k) = args.nodes.iter().find(|&&k| b % k != 0)
    {
        return Err(format!("--global-batch {b} does not split over {k} nodes").into());
    }
    let series = SeriesDir::open(&mut args.out_dir, &args.common)?;
    // Every cell's flags, checked before anything is trained.
    let mut plan = Vec::new();
    for &strategy in &args.strategies {
        // The axis, or the one interval the shared flags give (`-H`, else the default).
        let from_axis = strategy.has_sync_interval() && !args.sync_intervals.is_empty();
        let intervals: Vec<Option<usize>> = if from_axis {
            args.sync_intervals.iter().copied().map(Some).collect()
        } else if strategy.has_sync_interval() {
            vec![args.common.strategy_flags.get::<SyncArgs>()?.sync_interval]
        } else {
            vec![None]
        };
        // A strategy's `[overrides.<strategy>]` table may give it node counts of its own
        // (the scaling experiment runs DDP on one node only).
        let own: SweepArgs =
            cli::parse_with(&command, argv, &file, file.overrides_for(strategy.as_str()))?;
        for &h in &intervals {
            for network in &args.networks {
                for &k in &own.nodes {
                    let name = cell_name(strategy, h, k, network);
                    if k == 0 || args.global_batch.is_some_and(|b| b % k != 0) {
                        return Err(format!(
                            "{name}: {k} nodes cannot share the global batch \
                                            (or run at all)"
                        )
                        .into());
                    }
                    let mut extra = file.overrides_for(strategy.as_str()).to_vec();
                    extra.extend_from_slice(file.at_nodes_for(k));
                    extra.extend(
                        [
                            ["--strategy", strategy.as_str()],
                            ["--num-nodes", &k.to_string()],
                            ["--network", network],
                        ]
                        .iter()
                        .flat_map(|pair| pair.iter().map(|w| w.to_string())),
                    );
                    extra.extend(series.run_flags(&name, &args.common));
                    if let (true, Some(h)) = (from_axis, h) {
                        extra.extend(["-H".into(), h.to_string()]);
                    }
                    if let Some(b) = args.global_batch {
                        extra.extend(["--batch-size".into(), (b / k).to_string()]);
                    }
                    let mut cell_args: SweepArgs = cli::parse_with(&command, argv, &file, &extra)?;
                    cell_args.common.retain_strategy_flags();
                    cell_args
                        .common
                        .trainer_config()
                        .map_err(|e| format!("{name}: {e}"))?;
                    plan.push((strategy, h, network.clone(), k, cell_args));
                }
            }
        }
    }

    series.start(plan.iter().map(|(.., cell_args)| &cell_args.common))?;
    let runner = Runner::new(process_start).with_interrupt(interrupt);
    let task = args.task.build(args.common.data_dir.as_deref())?;
    let mut cells = Vec::new();
    let mut stopped = None;
    for (strategy, h, network, k, mut cell_args) in plan {
        let config = serde_json::to_value(&cell_args)?;
        let strategy_config = cell_args.common.strategy_config()?;
        let done = series.run(
            &runner,
            task.as_ref(),
            &mut cell_args.common,
            strategy_config.as_ref(),
            &config,
        )?;
        stopped = series.stopped(&cell_name(strategy, h, k, &network), &done);
        cells.push(Cell {
            strategy,
            nodes: k,
            sync_interval: h,
            network,
            status: done.status(),
            skipped: done.skipped,
            report: done.report,
            summary: done.summary,
            config,
        });
        if stopped.is_some() {
            break;
        }
    }
    let label = format!("{}, {}", task.dataset(), task.model_name());
    let mut sweep = write_outputs(&args, &label, cells)?;
    sweep.stopped = stopped;
    Ok(sweep)
}

/// Writes the table, the CSV and the plots of `cells` into `args.out_dir`.
fn write_outputs(args: &SweepArgs, label: &str, cells: Vec<Cell>) -> Result<Sweep, BoxError> {
    let dir = &args.out_dir;
    std::fs::create_dir_all(dir)?;
    let target = args.common.target_loss;
    let mut files = Vec::new();

    let mut table = String::new();
    let batch = match args.global_batch {
        Some(b) => format!("{b} examples per step over all nodes"),
        None => format!("{} examples per node per step", args.common.batch_size),
    };
    let _ = writeln!(
        table,
        "# {label}: {batch}, {} steps, seed {}\n",
        cells[0].report.steps, args.common.seed
    );
    let target_column = target.map_or(String::new(), |t| format!(" Time to loss {t} |"));
    let _ = writeln!(
        table,
        "| Strategy | H | Nodes | Network | Final val loss | Simulated time | Compute utilisation | Goodput | Lost node-steps | Sent per node |{target_column}"
    );
    let _ = writeln!(
        table,
        "| :--- | ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: |{}",
        if target.is_some() { " ---: |" } else { "" }
    );
    let mut csv = String::from(
        "strategy,sync_interval,nodes,network,final_val_loss,simulated_time_s,compute_utilisation,bytes_sent_per_node,time_to_target_s,goodput,node_steps_lost,status\n",
    );
    let opt = |x: Option<f64>| x.map_or(String::new(), |v| v.to_string());
    for c in &cells {
        let s = &c.summary;
        let status = c.status.table_suffix();
        let _ = write!(
            table,
            "| {}{status} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.strategy.as_str(),
            c.sync_interval.map_or("-".into(), |h| h.to_string()),
            c.nodes,
            c.network,
            s.final_val_loss.map_or("-".into(), |l| format!("{l:.4}")),
            s.simulated_time_s.map_or("-".into(), seconds),
            percent(s.compute_utilisation),
            percent(s.goodput),
            s.node_steps_lost,
            crate::summary::human_bytes(s.bytes_sent_per_node),
        );
        if target.is_some() {
            let _ = write!(
                table,
                " {} |",
                s.time_to_target_s.map_or("not reached".into(), seconds)
            );
        }
        table.push('\n');
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            c.strategy.as_str(),
            c.sync_interval.map_or(String::new(), |h| h.to_string()),
            c.nodes,
            c.network,
            opt(s.final_val_loss),
            opt(s.simulated_time_s),
            opt(s.compute_utilisation),
            s.bytes_sent_per_node,
            opt(s.time_to_target_s),
            opt(s.goodput),
            s.node_steps_lost,
            c.status,
        );
    }
    let summaries: Vec<&crate::summary::RunSummary> = cells.iter().map(|c| &c.summary).collect();
    if let Some(note) = crate::summary::proxy_note(&summaries) {
        let _ = writeln!(table, "\n{note}");
    }
    if cells.iter().any(|c| c.status != Status::Finished) {
        let _ = writeln!(
            table,
            "\nInterrupted (Ctrl-C): a cell's figures are those of the steps it took, and the cells after it did not run; `--resume {}` continues.",
            dir.display()
        );
    }
    for (name, text) in [("results.md", &table), ("results.csv", &csv)] {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        files.push(path);
    }
    files.push(cli::save_run_config(args, dir)?);

    // A proxy's times are the charged model's: every chart of them says so.
    let proxy = cells
        .iter()
        .find_map(|c| c.summary.proxy_label())
        .map_or(String::new(), |p| format!(" ({p})"));
    // One line per (strategy, interval, network) against the node count.
    let by_nodes = |value: &dyn Fn(&Cell) -> Option<f64>| -> Vec<Series> {
        let mut series: Vec<Series> = Vec::new();
        for c in &cells {
            let Some(y) = value(c) else { continue };
            let label = c.series();
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.points.push((c.nodes as f64, y)),
                None => series.push(Series {
                    label,
                    points: vec![(c.nodes as f64, y)],
                }),
            }
        }
        series
    };
    let mut charts = vec![
        (
            "simulated_time.svg".to_string(),
            Chart {
                title: format!("{label}: simulated time of the run{proxy}"),
                x_label: "nodes".into(),
                y_label: "simulated seconds".into(),
                log_x: false,
                x_bytes: false,
                series: by_nodes(&|c| c.summary.simulated_time_s),
            },
        ),
        (
            "final_loss.svg".to_string(),
            Chart {
                title: format!("{label}: final validation loss"),
                x_label: "nodes".into(),
                y_label: "validation loss".into(),
                log_x: false,
                x_bytes: false,
                series: by_nodes(&|c| c.summary.final_val_loss),
            },
        ),
    ];
    if let Some(t) = target {
        let series = by_nodes(&|c| c.summary.time_to_target_s);
        if !series.is_empty() {
            charts.push((
                "time_to_target.svg".to_string(),
                Chart {
                    title: format!("{label}: simulated time to validation loss {t}{proxy}"),
                    x_label: "nodes".into(),
                    y_label: "simulated seconds".into(),
                    log_x: false,
                    x_bytes: false,
                    series,
                },
            ));
        }
    }
    let axis = args.common.x_axis;
    charts.push((
        "val_loss.svg".to_string(),
        Chart {
            title: format!("{label}: validation loss"),
            x_label: axis.label().into(),
            y_label: "validation loss".into(),
            log_x: false,
            x_bytes: false,
            series: cells
                .iter()
                .map(|c| Series {
                    label: c.name(),
                    points: c
                        .report
                        .validation
                        .iter()
                        .map(|v| (axis.value(v.step, v.examples_seen), v.global_loss))
                        .collect(),
                })
                .collect(),
        },
    ));
    for network in &args.networks {
        let series: Vec<Series> = cells
            .iter()
            .filter(|c| &c.network == network)
            .map(|c| Series {
                label: format!(
                    "{} k={}",
                    c.series().split(" on ").next().unwrap_or(""),
                    c.nodes
                ),
                points: c
                    .report
                    .validation
                    .iter()
                    .filter_map(|v| Some((v.sim_time_s?, v.global_loss)))
                    .collect(),
            })
            .collect();
        charts.push((
            format!("val_loss_vs_time_{}.svg", file_safe(network)),
            Chart {
                title: format!(
                    "{label}: validation loss against simulated time on {network}{proxy}"
                ),
                x_label: "simulated seconds (log scale)".into(),
                y_label: "validation loss".into(),
                log_x: true,
                x_bytes: false,
                series,
            },
        ));
    }
    for (name, chart) in charts {
        let path = dir.join(name);
        chart.write_svg(&path)?;
        files.push(path);
    }
    let names: Vec<String> = cells.iter().map(Cell::name).collect();
    let report = Report {
        title: format!("{label}: a sweep of {} runs", cells.len()),
        runs: cells
            .iter()
            .zip(&names)
            .map(|(c, name)| ReportRun {
                label: name,
                summary: &c.summary,
                report: &c.report,
                config: &c.config,
            })
            .collect(),
        notes: crate::summary::proxy_note(&summaries).into_iter().collect(),
    };
    files.push(report.write(dir)?);
    println!("{table}");
    Ok(Sweep {
        cells,
        files,
        stopped: None,
    })
}
