//! `report.html`: one self-contained page per run, and one per comparison or sweep with its
//! runs side by side.
//!
//! The page holds everything it shows: its data as inline JSON, a small chart script of our
//! own (`report/report.js`, compiled into the binary) and its style; it loads nothing (its
//! content security policy forbids any fetch), so it opens offline, from a mail attachment
//! or an archived run folder alike. It shows:
//!
//! - the loss (train: mean over nodes, validation: the averaged model) against the step,
//!   against simulated time (with `--network` or a node speed) and against the bytes each
//!   node sent (log axis), every run's lines overlaid, with hover readouts and drag-to-zoom;
//! - each node's simulated time split into compute, exposed communication, idle and down,
//!   with its compute utilisation;
//! - the first steps' timeline: per node, the compute, idle, communication and down time of
//!   each of the first [`FIRST_STEPS_KEPT`](gym_core::metrics::FIRST_STEPS_KEPT) steps;
//! - the time to `--target-loss`, the summary (the figures of `summary.json`) and the
//!   configuration (the flags of `run_config.toml`: those all runs share, and those that
//!   differ side by side).
//!
//! Once its script ran, the page's `<body>` carries `data-rendered="N plots, M points"`, and
//! every line its `data-points`, which is how the tests check it in headless Chromium.

use crate::summary::{RunSummary, human_bytes, percent, seconds};
use gym_core::{RunReport, SimulatedTime};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The chart script, inlined into every page.
const SCRIPT: &str = include_str!("report/report.js");
/// The page's style, inlined.
const STYLE: &str = include_str!("report/report.css");

/// The most points a line of a report draws: a longer run's train records (and evaluations)
/// are thinned to every k-th (and the last), which the page says.
pub const MAX_POINTS: usize = 2000;

/// The most nodes a timeline or a utilisation chart draws (the first ones, by rank).
pub const MAX_NODES_DRAWN: usize = 64;

/// One run of a report.
#[derive(Debug, Clone, Copy)]
pub struct ReportRun<'a> {
    /// How the report names the run (its name, or a comparison's label).
    pub label: &'a str,
    /// Its summary (`summary.json`).
    pub summary: &'a RunSummary,
    /// Everything it measured.
    pub report: &'a RunReport,
    /// Its resolved flags (`run_config.toml`), as JSON.
    pub config: &'a serde_json::Value,
}

/// A report: one run, or the runs of a comparison or sweep side by side.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// The page's title and heading.
    pub title: String,
    /// The runs, in the order their columns and legends take.
    pub runs: Vec<ReportRun<'a>>,
    /// Sentences shown under the summary table (fingerprints, proxy notes).
    pub notes: Vec<String>,
}

impl<'a> Report<'a> {
    /// The report of one run, titled with its name, strategy, nodes and model.
    pub fn single(run: ReportRun<'a>) -> Self {
        let s = run.summary;
        Report {
            title: format!(
                "{}: {} on {} nodes, {} on {}",
                s.run_name, s.strategy, s.num_nodes, s.model, s.dataset
            ),
            runs: vec![run],
            notes: s.proxy_label().into_iter().collect(),
        }
    }

    /// Writes `report.html` into `dir` (created if needed) and returns its path.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("report.html");
        std::fs::write(&path, self.html())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(path)
    }

    /// The page.
    pub fn html(&self) -> String {
        let mut h = String::with_capacity(64 * 1024);
        let title = escape(&self.title);
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
             script-src 'unsafe-inline'; style-src 'unsafe-inline'\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n\
             <body data-rendered=\"no\">\n<h1>{title}</h1>\n"
        );
        let _ = writeln!(
            h,
            "<p class=\"sub\">{} run{} · written by the gym's <code>{}</code> {}. \
             Drag across a plot to zoom, double-click to zoom out, click a legend entry \
             to hide its line.</p>",
            self.runs.len(),
            if self.runs.len() == 1 { "" } else { "s" },
            escape(&binary_name()),
            env!("CARGO_PKG_VERSION"),
        );
        for run in &self.runs {
            let status = status(run.summary);
            if status != "finished" {
                let _ = writeln!(
                    h,
                    "<p class=\"warn\"><strong>{}</strong>: {}; its figures are those of \
                     the steps it took.</p>",
                    escape(run.label),
                    escape(&status)
                );
            }
        }
        h.push_str(
            "<noscript><p class=\"warn\">The plots are drawn by the page's own inline \
             script; with scripts off, the tables below still hold the figures.</p>\
             </noscript>\n",
        );
        self.plots(&mut h);
        self.time_to_target(&mut h);
        h.push_str("<h2 id=\"summary\">Summary</h2>\n");
        summary_table(&mut h, &self.runs);
        for note in &self.notes {
            let _ = writeln!(h, "<p class=\"note\">{}</p>", escape(note));
        }
        h.push_str("<h2 id=\"configuration\">Configuration</h2>\n");
        config_tables(&mut h, &self.runs);
        let data: Vec<RunData> = self.runs.iter().map(RunData::new).collect();
        let json = serde_json::to_string(&data).expect("report data serialises");
        // Inside a script element only `</` could end it: JSON may spell `<` as `\u003c`.
        let json = json.replace('<', "\\u003c");
        let _ = write!(
            h,
            "<script type=\"application/json\" id=\"report-data\">{json}</script>\n\
             <script>\n{SCRIPT}</script>\n</body>\n</html>\n"
        );
        h
    }

    /// The plot sections: empty containers the script fills from the data.
    fn plots(&self, h: &mut String) {
        let simulated = self.runs.iter().any(|r| has_time(r.report));
        let proxy = self
            .runs
            .iter()
            .find_map(|r| r.summary.proxy_label())
            .map_or(String::new(), |p| format!(" ({p})"));
        h.push_str("<h2 id=\"loss\">Loss</h2>\n");
        let thinned = self
            .runs
            .iter()
            .any(|r| r.report.train.len() > MAX_POINTS || r.report.validation.len() > MAX_POINTS);
        if thinned {
            let _ = writeln!(
                h,
                "<p class=\"note\">A line of more than {MAX_POINTS} points is drawn through \
                 every k-th of them (and the last); the CSV files hold them all.</p>"
            );
        }
        let plot = |h: &mut String, kind: &str, caption: &str| {
            let _ = writeln!(
                h,
                "<figure class=\"plot\" data-plot=\"{kind}\"><figcaption>{}</figcaption>\
                 </figure>",
                escape(caption)
            );
        };
        plot(
            h,
            "loss-step",
            "Loss against the step: train loss (thin, mean over nodes) and validation loss \
             of the averaged model (thick, with points).",
        );
        if simulated {
            plot(
                h,
                "loss-time",
                &format!(
                    "Loss against simulated time{proxy}; a diamond marks where a run reached \
                     the target loss."
                ),
            );
        }
        plot(
            h,
            "loss-bytes",
            &format!(
                "Loss against the bytes each node had sent (mean over nodes, log axis){proxy}; \
                 points before the first byte are left out."
            ),
        );
        h.push_str("<h2 id=\"utilisation\">Compute utilisation per node</h2>\n");
        if !simulated {
            h.push_str(
                "<p class=\"note\">No simulated time (run with <code>--network</code> or \
                 <code>--node-speed</code>): utilisation and the timeline need it.</p>\n",
            );
            return;
        }
        plot(
            h,
            "utilisation",
            &format!(
                "Each node's simulated time{proxy}: compute, exposed communication, idle \
                 (waiting for others) and down (away after a fault); its compute utilisation \
                 is compute ÷ (compute + communication + idle)."
            ),
        );
        self.real_time(h);
        h.push_str("<h2 id=\"timeline\">The first steps</h2>\n");
        for (i, run) in self.runs.iter().enumerate() {
            if run.report.first_steps.is_empty() {
                continue;
            }
            let _ = writeln!(
                h,
                "<figure class=\"plot\" data-plot=\"timeline\" data-run=\"{i}\"><figcaption>\
                 {}: each node's first {} steps on the simulated clock{proxy} (within a step, \
                 drawn as compute, idle, communication, down; hover a bar for its \
                 seconds).</figcaption></figure>",
                escape(run.label),
                run.report.first_steps.len()
            );
        }
    }

    /// Each node's real time in its loop beside its simulated time, for the runs that
    /// simulate time: what the simulated clock says a cluster would take, against what this
    /// run took here (over real links, under MPI, the two should agree).
    fn real_time(&self, h: &mut String) {
        let runs: Vec<&ReportRun<'_>> = self
            .runs
            .iter()
            .filter(|r| has_time(r.report) && !r.report.real.is_empty())
            .collect();
        if runs.is_empty() {
            return;
        }
        h.push_str("<h2 id=\"real-time\">Real and simulated time per node</h2>\n");
        h.push_str(
            "<p class=\"note\">Real: the wall seconds of each node's training loop here, \
             split into its own work (data, forward and backward passes, the strategy's \
             optimizer and codecs), communication (in the strategy's collectives or waiting \
             for their results) and the simulator's own work (evaluations, checkpoints, \
             reports). Simulated: the node's clock. Run over real links (<code>--collective \
             mpi</code> across hosts) the two measure the same cluster.</p>\n",
        );
        for run in runs {
            let _ = writeln!(
                h,
                "<table class=\"summary\"><caption>{}</caption>\n<tr><th>node</th>\
                 <th>real (s)</th><th>own work</th><th>communication</th><th>simulator</th>\
                 <th>simulated (s)</th><th>compute</th><th>communication</th><th>idle</th>\
                 <th>real ÷ simulated</th></tr>",
                escape(run.label)
            );
            let sim = &run.report.simulated;
            for (rank, real) in run.report.real.iter().enumerate().take(MAX_NODES_DRAWN) {
                let clock = sim.get(rank).copied().unwrap_or_default();
                let ratio = if clock.now_s > 0.0 {
                    format!("{:.3}", real.wall_s / clock.now_s)
                } else {
                    "-".into()
                };
                let _ = writeln!(
                    h,
                    "<tr><td>{rank}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td>\
                     <td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td>\
                     <td>{ratio}</td></tr>",
                    real.wall_s,
                    real.compute_s,
                    real.communication_s,
                    real.simulator_s,
                    clock.now_s,
                    clock.compute_s,
                    clock.comm_s,
                    clock.idle_s,
                );
            }
            h.push_str("</table>\n");
        }
    }

    /// When each run reached `--target-loss`, if any run has one.
    fn time_to_target(&self, h: &mut String) {
        if self.runs.iter().all(|r| r.summary.target_loss.is_none()) {
            return;
        }
        h.push_str("<h2 id=\"target\">Time to target</h2>\n<ul>\n");
        for run in &self.runs {
            let s = run.summary;
            let Some(target) = s.target_loss else {
                let _ = writeln!(h, "<li>{}: no target loss</li>", escape(run.label));
                continue;
            };
            let reached = run
                .report
                .validation
                .iter()
                .find(|v| v.global_loss <= target);
            let text = match (reached, s.time_to_target_s) {
                (Some(v), Some(t)) => format!(
                    "validation loss {target} reached after {} simulated (evaluation at step {})",
                    seconds(t),
                    v.step
                ),
                (Some(v), None) => format!(
                    "validation loss {target} reached at step {} (no simulated time)",
                    v.step
                ),
                (None, _) => format!("validation loss {target} not reached"),
            };
            let _ = writeln!(
                h,
                "<li><strong>{}</strong>: {}</li>",
                escape(run.label),
                escape(&text)
            );
        }
        h.push_str("</ul>\n");
    }
}

/// What the script reads of one run.
#[derive(Serialize)]
struct RunData {
    label: String,
    status: String,
    /// Train records kept: every `every`-th step, and the last.
    train: Curve,
    every: usize,
    /// Evaluations kept, likewise.
    val: Curve,
    /// Per node (the first [`MAX_NODES_DRAWN`]): compute, communication, idle, down seconds.
    nodes: Vec<[f64; 4]>,
    /// The nodes of the run (`nodes` may hold fewer).
    num_nodes: usize,
    /// The step of `first[0]`.
    first_step: usize,
    /// Per step, per node: compute, communication, idle, down seconds, the clock after.
    first: Vec<Vec<[f64; 5]>>,
    target: Option<f64>,
    time_to_target: Option<f64>,
}

/// One line's x candidates and y.
#[derive(Serialize, Default)]
struct Curve {
    step: Vec<usize>,
    /// Simulated seconds (`null` without).
    time: Vec<Option<f64>>,
    /// Bytes each node had sent (mean over nodes).
    bytes: Vec<f64>,
    loss: Vec<f64>,
}

impl RunData {
    fn new(run: &ReportRun<'_>) -> Self {
        let r = run.report;
        let every = r.train.len().div_ceil(MAX_POINTS).max(1);
        let mut train = Curve::default();
        for (i, t) in r.train.iter().enumerate() {
            if i % every == 0 || i + 1 == r.train.len() {
                train.step.push(t.step);
                train.time.push(t.sim_time_s.map(round));
                train.bytes.push(t.bytes_sent as f64);
                train.loss.push(round(t.train_loss));
            }
        }
        let mut val = Curve::default();
        let val_every = r.validation.len().div_ceil(MAX_POINTS).max(1);
        for (i, v) in r.validation.iter().enumerate() {
            if i % val_every != 0 && i + 1 != r.validation.len() {
                continue;
            }
            val.step.push(v.step);
            val.time.push(v.sim_time_s.map(round));
            let before = v.step.checked_sub(1).and_then(|s| r.train.get(s));
            val.bytes.push(before.map_or(0.0, |t| t.bytes_sent as f64));
            val.loss.push(round(v.global_loss));
        }
        let four = |t: &SimulatedTime| [t.compute_s, t.comm_s, t.idle_s, t.down_s].map(round);
        RunData {
            label: run.label.to_string(),
            status: status(run.summary),
            train,
            every,
            val,
            nodes: r.simulated.iter().take(MAX_NODES_DRAWN).map(four).collect(),
            num_nodes: r.num_nodes,
            first_step: r.start_step,
            first: r
                .first_steps
                .iter()
                .map(|step| {
                    let nodes = step.iter().take(MAX_NODES_DRAWN);
                    nodes
                        .map(|t| {
                            let [c, m, i, d] = four(t);
                            [c, m, i, d, round(t.now_s)]
                        })
                        .collect()
                })
                .collect(),
            target: run.summary.target_loss,
            time_to_target: run.summary.time_to_target_s,
        }
    }
}

/// Whether a run's records hold simulated time.
fn has_time(report: &RunReport) -> bool {
    report.train.iter().any(|t| t.sim_time_s.is_some())
}

/// `v` to 7 significant digits (what a plot and its readout need; the CSV files keep all).
fn round(v: f64) -> f64 {
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    format!("{v:.6e}").parse().unwrap_or(v)
}

/// How a run ended, in words.
fn status(s: &RunSummary) -> String {
    match (s.interrupted_at_step, &s.stopped_by) {
        (Some(at), Some(why)) => format!("stopped before step {at}: {why}"),
        (Some(at), None) => format!("interrupted before step {at}"),
        (None, _) => "finished".into(),
    }
}

/// `text` with the characters HTML gives a meaning to escaped (for text and attributes).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The name of the running binary (`mnist`, `compare`, …).
fn binary_name() -> String {
    std::env::args()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "gym".into())
}

/// One row of the summary table: its label and each run's cell.
type Row = (&'static str, fn(&RunSummary) -> String);

/// The summary table's rows: the figures of `summary.json`.
const SUMMARY_ROWS: &[Row] = &[
    ("strategy", |s| s.strategy.clone()),
    ("model", |s| match s.proxy_label() {
        Some(p) => format!("{} ({p})", s.model),
        None => s.model.clone(),
    }),
    ("parameters", |s| s.params.to_string()),
    ("data", |s| s.dataset.clone()),
    ("backend", |s| s.backend.clone()),
    ("nodes", |s| s.num_nodes.to_string()),
    ("status", status),
    ("steps", |s| match s.interrupted_at_step {
        Some(at) => format!("{at} of {}", s.steps_planned),
        None => s.steps.to_string(),
    }),
    ("skipped steps", |s| s.skipped_steps.to_string()),
    ("final train loss", |s| opt(s.final_train_loss, 4)),
    ("final val loss (averaged model)", |s| {
        opt(s.final_val_loss, 4)
    }),
    ("final val loss (rank 0's replica)", |s| {
        opt(s.final_local_val_loss, 4)
    }),
    ("val accuracy", |s| {
        s.val_accuracy
            .map_or("-".into(), |a| format!("{:.2}%", a * 100.0))
    }),
    ("bytes sent per node", |s| {
        human_bytes(s.bytes_sent_per_node)
    }),
    ("bytes received per node", |s| {
        human_bytes(s.bytes_received_per_node)
    }),
    ("simulated time", |s| {
        s.simulated_time_s.map_or("-".into(), seconds)
    }),
    ("simulated compute per node", |s| {
        s.simulated_compute_s.map_or("-".into(), seconds)
    }),
    ("simulated communication per node", |s| {
        s.simulated_comm_s.map_or("-".into(), seconds)
    }),
    ("simulated idle per node", |s| {
        s.simulated_idle_s.map_or("-".into(), seconds)
    }),
    ("compute utilisation", |s| percent(s.compute_utilisation)),
    ("goodput", |s| percent(s.goodput)),
    ("node-steps lost", |s| s.node_steps_lost.to_string()),
    ("faults", |s| s.elastic.faults.len().to_string()),
    ("target loss", |s| opt(s.target_loss, 4)),
    ("time to target (simulated)", |s| match s.target_loss {
        None => "-".into(),
        Some(_) => s.time_to_target_s.map_or("not reached".into(), seconds),
    }),
    ("wall time", |s| seconds(s.wall_time_s)),
    ("start-up", |s| seconds(s.startup_s)),
    ("loop speed", |s| format!("{:.1} it/s", s.loop_its_per_s)),
    ("forward/backward per step", |s| {
        format!("{:.1} ms", s.compute_ms_per_step)
    }),
    ("strategy per step", |s| {
        format!("{:.1} ms", s.strategy_ms_per_step)
    }),
    ("peak RSS", |s| {
        s.peak_rss_bytes
            .map_or("-".into(), |b| human_bytes(b as f64))
    }),
    ("init fingerprint", |s| s.init_fingerprint.clone()),
    ("data fingerprint", |s| s.data_fingerprint.clone()),
];

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The summary: one row per figure, one column per run.
fn summary_table(h: &mut String, runs: &[ReportRun<'_>]) {
    h.push_str("<div class=\"scroll\"><table class=\"summary\">\n<thead><tr><th></th>");
    for run in runs {
        let _ = write!(h, "<th>{}</th>", escape(run.label));
    }
    h.push_str("</tr></thead>\n<tbody>\n");
    for (label, cell) in SUMMARY_ROWS {
        let _ = write!(h, "<tr><th>{}</th>", escape(label));
        for run in runs {
            let _ = write!(h, "<td>{}</td>", escape(&cell(run.summary)));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody></table></div>\n");
}

/// The flags: those every run shares in one table, those that differ side by side.
fn config_tables(h: &mut String, runs: &[ReportRun<'_>]) {
    let flags = |run: &ReportRun<'_>| -> Vec<(String, String)> {
        match run.config {
            serde_json::Value::Object(map) => map
                .iter()
                .map(|(k, v)| (k.replace('_', "-"), flag_value(v)))
                .collect(),
            other => vec![("flags".into(), flag_value(other))],
        }
    };
    let all: Vec<Vec<(String, String)>> = runs.iter().map(flags).collect();
    let mut names: Vec<&String> = all.iter().flatten().map(|(k, _)| k).collect();
    names.sort();
    names.dedup();
    let value = |run: &[(String, String)], name: &str| {
        run.iter()
            .find(|(k, _)| k == name)
            .map_or("-".to_string(), |(_, v)| v.clone())
    };
    let (mut shared, mut differ) = (Vec::new(), Vec::new());
    for name in names {
        let values: Vec<String> = all.iter().map(|run| value(run, name)).collect();
        if values.windows(2).all(|w| w[0] == w[1]) {
            shared.push((name, values[0].clone()));
        } else {
            differ.push((name, values));
        }
    }
    if !differ.is_empty() {
        h.push_str(
            "<h3>Flags that differ</h3>\n<div class=\"scroll\"><table class=\"config\">\n\
             <thead><tr><th>flag</th>",
        );
        for run in runs {
            let _ = write!(h, "<th>{}</th>", escape(run.label));
        }
        h.push_str("</tr></thead>\n<tbody>\n");
        for (name, values) in &differ {
            let _ = write!(h, "<tr><th>--{}</th>", escape(name));
            for v in values {
                let _ = write!(h, "<td>{}</td>", escape(v));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</tbody></table></div>\n");
    }
    let heading = if runs.len() > 1 {
        "Flags every run shares"
    } else {
        "Flags (run_config.toml)"
    };
    let _ = write!(
        h,
        "<h3>{heading}</h3>\n<div class=\"scroll\"><table class=\"config\">\n<tbody>\n"
    );
    for (name, v) in &shared {
        let _ = writeln!(
            h,
            "<tr><th>--{}</th><td>{}</td></tr>",
            escape(name),
            escape(v)
        );
    }
    h.push_str("</tbody></table></div>\n");
}

/// A flag's value as the command line would write it (`-` for none).
fn flag_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => {
            items.iter().map(flag_value).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "report/tests.rs"]
mod tests;
