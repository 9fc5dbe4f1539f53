//! One command, several strategies, identical conditions: the `compare` binary.
//!
//! Every strategy trains the same task from the same seed, so it starts from the same model
//! and reads the same samples in the same order (checked through the runs'
//! fingerprints). The output folder gets:
//!
//! - `results.md`: the table (final losses, accuracy, wall time, it/s, final lr, bytes sent
//!   per node, communication reduction versus AllReduce, goodput and node-steps lost to
//!   `--faults`);
//! - `val_loss.svg` (against steps or examples, `--x-axis`), `val_loss_vs_bytes.svg`
//!   (log-scale bytes) and, with `--correlation-interval`, `correlation.svg`;
//! - `metrics.jsonl` (every record, tagged with its strategy and kind), `train.csv`,
//!   `validation.csv`, `correlation.csv` and `summary.csv`;
//! - `report.html`: one self-contained page with every run's curves overlaid (loss against
//!   the step, simulated time and bytes), each node's utilisation, the first steps'
//!   timelines, and the summaries and flags side by side ([`crate::report`]);
//! - `run_config.toml`, the resolved configuration (readable by `--config`), and
//!   `runs/<strategy>/` with each run's own logs, summary, configuration, `result.msgpack` and,
//!   after Ctrl-C, checkpoint.
//!
//! Ctrl-C stops the running strategy with a checkpoint, writes all of the above with the
//! runs done so far (the stopped one marked `interrupted at step N` in the table and in
//! `summary.csv`'s `status`), and prints the command that continues: the same with
//! `--resume DIR` (see [`crate::series`]).

use crate::cli::{self, CommonArgs, ConfigFile, StrategyName};
pub use crate::plot::XAxis;
use crate::plot::{Chart, Series};
use crate::report::{Report, ReportRun};
use crate::runner::{BoxError, Runner, TrainTask};
use crate::series::{self, SeriesDir, Status, Stopped};
use crate::summary::{RunSummary, human_bytes, percent, proxy_note, seconds};
use crate::tasks::{self, TaskArgs};
use clap::{CommandFactory, Parser};
use gym_core::{CorrelationRecord, RunReport, StrategyConfig, TrainRecord, ValRecord};
use serde::Serialize;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Run several strategies on one task under identical conditions and write a table,
/// plots and metrics into one folder.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(version, about, name = "compare", allow_negative_numbers = true)]
pub struct CompareArgs {
    /// The flags every example shares (`--strategy` is set per run).
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonArgs,
    /// What to train.
    #[command(flatten)]
    #[serde(flatten)]
    pub task: TaskArgs,
    /// Strategies to compare, comma-separated: a strategy's name, or `LABEL=STRATEGY` for a
    /// variant with flags of its own (`allreduce,diloco,diloco-quorum=diloco`). Per-run flags
    /// go in a `--config` file's `[overrides.<label>]` table. Every run meets the same
    /// --faults; the quorum flags (--min-quorum, --grace, --fastest) apply to the
    /// strategies that have a quorum and are skipped for the others.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "allreduce,diloco,sparta,fedavg,demo"
    )]
    pub strategies: Vec<CompareEntry>,
    /// Output folder; each strategy's run goes in `runs/<label>/`, with its checkpoint after
    /// Ctrl-C (see `--resume`).
    #[arg(long, default_value = "compare")]
    pub out_dir: PathBuf,
}

/// One run of a comparison: a strategy under a label (its name, or a variant's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompareEntry {
    /// The run's name in tables, plots and `[overrides.<label>]`.
    pub label: String,
    /// The strategy it runs.
    pub strategy: StrategyName,
}

impl std::str::FromStr for CompareEntry {
    type Err = String;

    /// `STRATEGY` or `LABEL=STRATEGY`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (label, name) = match s.split_once('=') {
            Some((label, name)) => (label.trim(), name.trim()),
            None => (s.trim(), s.trim()),
        };
        let strategy = StrategyName::named(name)?;
        let ok = !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(format!(
                "`{label}`: a label is letters, digits, `-` and `_` (it names a run folder)"
            ));
        }
        Ok(CompareEntry {
            label: label.to_string(),
            strategy,
        })
    }
}

impl std::fmt::Display for CompareEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.label == self.strategy.as_str() {
            write!(f, "{}", self.label)
        } else {
            write!(f, "{}={}", self.label, self.strategy.as_str())
        }
    }
}

impl Serialize for CompareEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One strategy's run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The run's label (the strategy's name, or a variant's label).
    pub label: String,
    /// The strategy, as named on the command line.
    pub strategy: StrategyName,
    /// The arguments it ran with (overrides applied).
    pub args: CompareArgs,
    /// What it measured.
    pub report: RunReport,
    /// Its summary (also in `runs/<strategy>/summary.json`).
    pub summary: RunSummary,
    /// Whether it finished or Ctrl-C stopped it.
    pub status: Status,
    /// Whether an earlier call ran it (`--resume`; read back, not trained).
    pub skipped: bool,
}

/// What a comparison produced.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The runs, in the order of `--strategies`.
    pub outcomes: Vec<Outcome>,
    /// The files written.
    pub files: Vec<PathBuf>,
    /// Whether every run started from the same parameters and read the same samples.
    pub identical_conditions: bool,
    /// Where Ctrl-C stopped the comparison (the runs after it did not start).
    pub stopped: Option<Stopped>,
}

/// One strategy of a comparison: its value, and the flags it runs with.
struct Planned {
    entry: CompareEntry,
    args: CompareArgs,
    strategy: Box<dyn StrategyConfig>,
}

/// Parses `argv` (program name first, `--config` honoured) and runs the comparison,
/// without a Ctrl-C flag ([`run_with`] for one).
pub fn run(argv: &[OsString]) -> Result<Comparison, BoxError> {
    run_with(argv, None)
}

/// [`run`], stopping at a step boundary when `interrupt` turns true (Ctrl-C): the running
/// strategy writes its checkpoint, no further one starts, and the outputs hold the runs
/// done so far ([`Comparison::stopped`]).
pub fn run_with(
    argv: &[OsString],
    interrupt: Option<Arc<AtomicBool>>,
) -> Result<Comparison, BoxError> {
    let process_start = Instant::now();
    let command = series::resumable(tasks::with_small_gpt(CompareArgs::command()));
    let (mut args, file): (CompareArgs, ConfigFile) = cli::try_parse_from(&command, argv)?;
    if args.strategies.is_empty() {
        return Err("--strategies names no strategy".into());
    }
    let mut seen: Vec<&str> = args.strategies.iter().map(|e| e.label.as_str()).collect();
    seen.sort();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err("--strategies names a strategy twice (label variants `LABEL=STRATEGY`)".into());
    }
    let series = SeriesDir::open(&mut args.out_dir, &args.common)?;
    // Every strategy as a value, with its overrides and the fixed places of its logs,
    // before anything is loaded or trained.
    let plan = args
        .strategies
        .iter()
        .map(|entry| {
            let (label, name) = (entry.label.as_str(), entry.strategy);
            let mut extra = file.overrides_for(label).to_vec();
            extra.extend(["--strategy".into(), name.as_str().into()]);
            extra.extend(series.run_flags(label, &args.common));
            let mut args: CompareArgs = cli::parse_with(&command, argv, &file, &extra)?;
            args.common.retain_strategy_flags();
            // Every run's flags are checked (faults against the nodes, say) before the first
            // one trains.
            args.common
                .trainer_config()
                .map_err(|e| format!("{label}: {e}"))?;
            let strategy = args
                .common
                .strategy_config()
                .map_err(|e| format!("{label}: {e}"))?;
            Ok(Planned {
                entry: entry.clone(),
                args,
                strategy,
            })
        })
        .collect::<Result<Vec<_>, BoxError>>()?;

    series.start(plan.iter().map(|p| &p.args.common))?;
    let runner = Runner::new(process_start).with_interrupt(interrupt);
    let task = args.task.build(args.common.data_dir.as_deref())?;
    let mut outcomes = Vec::new();
    let mut stopped = None;
    for mut run in plan {
        let config = serde_json::to_value(&run.args)?;
        let strategy = run.strategy.as_ref();
        let done = series.run(
            &runner,
            task.as_ref(),
            &mut run.args.common,
            strategy,
            &config,
        )?;
        stopped = series.stopped(&run.entry.label, &done);
        outcomes.push(Outcome {
            label: run.entry.label,
            strategy: run.entry.strategy,
            args: run.args,
            status: done.status(),
            skipped: done.skipped,
            report: done.report,
            summary: done.summary,
        });
        if stopped.is_some() {
            break;
        }
    }
    let mut comparison = write_outputs(&args, task.as_ref(), outcomes, runner.is_rank_zero())?;
    comparison.stopped = stopped;
    Ok(comparison)
}

/// Writes the table, plots and metrics of `outcomes` into `args.out_dir`, and prints the
/// table, if `writes` (under MPI, rank 0 writes; the others only trained).
fn write_outputs(
    args: &CompareArgs,
    task: &dyn TrainTask,
    outcomes: Vec<Outcome>,
    writes: bool,
) -> Result<Comparison, BoxError> {
    let first = &outcomes[0].report;
    // An interrupted run (the last) drew a prefix of the samples: its data fingerprint
    // differs until it finishes.
    let identical_conditions = outcomes.iter().all(|o| {
        o.report.init_fingerprint == first.init_fingerprint
            && (o.status != Status::Finished || o.report.data_fingerprint == first.data_fingerprint)
    });
    let mut files = Vec::new();
    if !writes {
        return Ok(Comparison {
            outcomes,
            files,
            identical_conditions,
            stopped: None,
        });
    }
    let dir = &args.out_dir;
    std::fs::create_dir_all(dir)?;

    let label = task_label(task);
    let table = results_table(args, &label, &outcomes, identical_conditions);
    files.push(write(dir, "results.md", &table)?);
    files.push(cli::save_run_config(args, dir)?);
    files.extend(write_metrics(dir, &outcomes)?);

    let axis = args.common.x_axis;
    let (x_label, x_of) = (axis.label(), |step, examples| axis.value(step, examples));
    let val_series = |x: &dyn Fn(&Outcome, &ValRecord) -> f64| -> Vec<Series> {
        outcomes
            .iter()
            .map(|o| Series {
                label: o.label.clone(),
                points: o
                    .report
                    .validation
                    .iter()
                    .map(|v| (x(o, v), v.global_loss))
                    .collect(),
            })
            .collect()
    };
    let task = &label;
    let mut charts = vec![
        (
            "val_loss.svg",
            Chart {
                title: format!("{task}: validation loss of the averaged model"),
                x_label: x_label.into(),
                y_label: "validation loss".into(),
                log_x: false,
                x_bytes: false,
                series: val_series(&|_, v| x_of(v.step, v.examples_seen)),
            },
        ),
        (
            "val_loss_vs_bytes.svg",
            Chart {
                title: format!("{task}: validation loss against communication"),
                x_label: "bytes sent per node (log scale)".into(),
                y_label: "validation loss".into(),
                log_x: true,
                x_bytes: true,
                series: val_series(&|o, v| bytes_before(&o.report, v.step) as f64),
            },
        ),
    ];
    if outcomes
        .iter()
        .any(|o| o.summary.simulated_time_s.is_some())
    {
        charts.push((
            "val_loss_vs_time.svg",
            Chart {
                title: format!(
                    "{task}: validation loss against simulated time{}",
                    outcomes[0]
                        .summary
                        .proxy_label()
                        .map_or(String::new(), |p| format!(" ({p})"))
                ),
                x_label: "simulated seconds (log scale)".into(),
                y_label: "validation loss".into(),
                log_x: true,
                x_bytes: false,
                series: val_series(&|_, v| v.sim_time_s.unwrap_or(f64::NAN)),
            },
        ));
    }
    for (name, chart) in charts {
        let path = dir.join(name);
        chart.write_svg(&path)?;
        files.push(path);
    }
    files.push(write_report(dir, &label, &outcomes, identical_conditions)?);
    if outcomes.iter().any(|o| !o.report.correlation.is_empty()) {
        let path = dir.join("correlation.svg");
        Chart {
            title: format!("{task}: mean pairwise correlation of the replicas"),
            x_label: x_label.into(),
            y_label: "Pearson correlation".into(),
            log_x: false,
            x_bytes: false,
            series: outcomes
                .iter()
                .map(|o| Series {
                    label: o.label.clone(),
                    points: o
                        .report
                        .correlation
                        .iter()
                        .map(|c| (x_of(c.step, c.examples_seen), c.correlation))
                        .collect(),
                })
                .collect(),
        }
        .write_svg(&path)?;
        files.push(path);
    }
    println!("{table}");
    if !identical_conditions {
        eprintln!("warning: the runs did not start from the same model or data order");
    }
    Ok(Comparison {
        outcomes,
        files,
        identical_conditions,
        stopped: None,
    })
}

/// `report.html`: every run side by side, with its flags.
fn write_report(
    dir: &Path,
    task: &str,
    outcomes: &[Outcome],
    identical: bool,
) -> Result<PathBuf, BoxError> {
    let configs = outcomes
        .iter()
        .map(|o| serde_json::to_value(&o.args))
        .collect::<Result<Vec<_>, _>>()?;
    let first = &outcomes[0].report;
    let mut notes = vec![if identical {
        format!(
            "Every run started from the same parameters (fingerprint {:016x}) and read the \
             same samples in the same order ({:016x}).",
            first.init_fingerprint, first.data_fingerprint
        )
    } else {
        "WARNING: the runs did not all start from the same parameters and data order.".into()
    }];
    let summaries: Vec<&RunSummary> = outcomes.iter().map(|o| &o.summary).collect();
    notes.extend(proxy_note(&summaries));
    let report = Report {
        title: format!("{task}: {} strategies compared", outcomes.len()),
        runs: outcomes
            .iter()
            .zip(&configs)
            .map(|(o, config)| ReportRun {
                label: &o.label,
                summary: &o.summary,
                report: &o.report,
                config,
            })
            .collect(),
        notes,
    };
    Ok(report.write(dir)?)
}

/// Bytes each node had sent (mean) before `steps` steps.
fn bytes_before(report: &RunReport, steps: usize) -> u64 {
    match steps {
        0 => 0,
        s => report.train.get(s - 1).map_or(0, |r| r.bytes_sent),
    }
}

/// How plots and the table name the task, e.g. `MNIST, mlp`.
fn task_label(task: &dyn TrainTask) -> String {
    format!("{}, {}", task.dataset(), task.model_name())
}

/// The Markdown table of the comparison.
pub fn results_table(
    args: &CompareArgs,
    task_label: &str,
    outcomes: &[Outcome],
    identical: bool,
) -> String {
    let c = &args.common;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# {task_label}: {} nodes, batch {} per node, {} steps, seed {}\n",
        c.num_nodes, c.batch_size, outcomes[0].report.steps, c.seed
    );
    let baseline = outcomes
        .iter()
        .find(|o| o.strategy.as_str() == "allreduce")
        .map(|o| o.summary.bytes_sent_per_node);
    let simulated = outcomes
        .iter()
        .any(|o| o.summary.simulated_time_s.is_some());
    let target = c.target_loss;
    t.push_str("| Strategy | Final train loss | Final val loss | Val accuracy | Wall time | it/s | Final LR | Goodput | Lost node-steps | Sent per node | Reduction vs AllReduce |");
    let mut rule = String::from(
        "| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    );
    if simulated {
        t.push_str(" Simulated time | Compute utilisation |");
        rule.push_str(" ---: | ---: |");
        if let Some(x) = target {
            let _ = write!(t, " Time to loss {x} |");
            rule.push_str(" ---: |");
        }
    }
    let _ = writeln!(t, "\n{rule}");
    for o in outcomes {
        let s = &o.summary;
        let opt = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.4}"));
        let reduction = match baseline {
            Some(b) if s.bytes_sent_per_node > 0.0 => format!("{:.1}×", b / s.bytes_sent_per_node),
            Some(_) => "∞".into(),
            None => "-".into(),
        };
        let status = o.status.table_suffix();
        let _ = write!(
            t,
            "| **{}**{status} | {} | {} | {} | {} | {:.2} | {:.6} | {} | {} | {} | {} |",
            o.label,
            opt(s.final_train_loss),
            opt(s.final_val_loss),
            s.val_accuracy
                .map_or("-".into(), |a| format!("{:.2}%", a * 100.0)),
            seconds(s.fit_time_s),
            s.loop_its_per_s,
            o.report.train.last().map_or(0.0, |r| r.lr),
            percent(s.goodput),
            s.node_steps_lost,
            human_bytes(s.bytes_sent_per_node),
            reduction,
        );
        if simulated {
            let _ = write!(
                t,
                " {} | {} |",
                s.simulated_time_s.map_or("-".into(), seconds),
                percent(s.compute_utilisation),
            );
            if target.is_some() {
                let _ = write!(
                    t,
                    " {} |",
                    s.time_to_target_s.map_or("not reached".into(), seconds)
                );
            }
        }
        t.push('\n');
    }
    let _ = writeln!(
        t,
        "\nVal loss and accuracy: the averaged model on the whole validation set. {}",
        if identical {
            format!(
                "Every run started from the same parameters (fingerprint {:016x}) and read the same samples in the same order ({:016x}).",
                outcomes[0].report.init_fingerprint, outcomes[0].report.data_fingerprint
            )
        } else {
            "WARNING: the runs did not all start from the same parameters and data order.".into()
        }
    );
    let _ = writeln!(
        t,
        "\nGoodput: simulated compute that went into the model ÷ (nodes × simulated time). Lost node-steps: steps nodes were away plus steps whose work was dropped.{}",
        match &c.faults {
            Some(faults) => format!(" Every run met the faults `{faults}`."),
            None => String::new(),
        }
    );
    let summaries: Vec<&RunSummary> = outcomes.iter().map(|o| &o.summary).collect();
    if let Some(note) = proxy_note(&summaries) {
        let _ = writeln!(t, "\n{note}");
    }
    if outcomes.iter().any(|o| o.status != Status::Finished) {
        let _ = writeln!(
            t,
            "\nInterrupted (Ctrl-C): a run's figures are those of the steps it took, and the strategies after it did not run; `--resume {}` continues.",
            args.out_dir.display()
        );
    }
    t
}

fn write(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// `metrics.jsonl` (every record) and one CSV per kind, each row tagged with its strategy.
fn write_metrics(dir: &Path, outcomes: &[Outcome]) -> Result<Vec<PathBuf>, BoxError> {
    let mut jsonl = String::new();
    let mut train = format!("strategy,{}\n", TrainRecord::CSV_HEADER);
    let mut val = format!("strategy,bytes_sent,{}\n", ValRecord::CSV_HEADER);
    let mut corr = format!("strategy,{}\n", CorrelationRecord::CSV_HEADER);
    let mut summary = String::from(
        "strategy,final_train_loss,final_val_loss,val_accuracy,fit_time_s,loop_its_per_s,bytes_sent_per_node,bytes_received_per_node,simulated_time_s,compute_utilisation,time_to_target_s,goodput,node_steps_lost,status\n",
    );
    let opt = |x: Option<f64>| x.map_or(String::new(), |v| v.to_string());
    for o in outcomes {
        let name = o.label.as_str();
        let mut line = |kind: &str, record: serde_json::Value| {
            let mut obj = serde_json::json!({ "strategy": name, "kind": kind });
            if let (Some(o), serde_json::Value::Object(r)) = (obj.as_object_mut(), record) {
                o.extend(r);
            }
            jsonl.push_str(&obj.to_string());
            jsonl.push('\n');
        };
        for r in &o.report.train {
            line("train", serde_json::to_value(r)?);
            let _ = writeln!(train, "{name},{}", r.csv_row());
        }
        for v in &o.report.validation {
            let mut value = serde_json::to_value(v)?;
            let bytes = bytes_before(&o.report, v.step);
            if let Some(m) = value.as_object_mut() {
                m.insert("bytes_sent".into(), bytes.into());
            }
            line("validation", value);
            let _ = writeln!(val, "{name},{bytes},{}", v.csv_row());
        }
        for c in &o.report.correlation {
            line("correlation", serde_json::to_value(c)?);
            let _ = writeln!(corr, "{name},{}", c.csv_row());
        }
        let s = &o.summary;
        line("summary", serde_json::to_value(s)?);
        let _ = writeln!(
            summary,
            "{name},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            opt(s.final_train_loss),
            opt(s.final_val_loss),
            opt(s.val_accuracy),
            s.fit_time_s,
            s.loop_its_per_s,
            s.bytes_sent_per_node,
            s.bytes_received_per_node,
            opt(s.simulated_time_s),
            opt(s.compute_utilisation),
            opt(s.time_to_target_s),
            opt(s.goodput),
            s.node_steps_lost,
            o.status,
        );
    }
    let mut files = vec![
        write(dir, "metrics.jsonl", &jsonl)?,
        write(dir, "train.csv", &train)?,
        write(dir, "validation.csv", &val)?,
        write(dir, "summary.csv", &summary)?,
    ];
    if outcomes.iter().any(|o| !o.report.correlation.is_empty()) {
        files.push(write(dir, "correlation.csv", &corr)?);
    }
    Ok(files)
}
