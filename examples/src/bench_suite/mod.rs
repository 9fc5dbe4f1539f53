//! The benchmark suite of `bench --suite`: how far K simulated nodes in one process are
//! from the compute limit, how fast the in-process collectives move bytes, how much memory
//! K nodes of the MLP hold, and how long a run takes to start.
//!
//! Every figure goes into one flat map of name → number ([`SuiteResult::figures`]), which
//! `bench --json FILE` writes next to the machine, the date and the load average, so that
//! runs on different days and machines can be set side by side. Each part is also printed
//! as a Markdown table whose caption names the machine, the date, the load average at the
//! start and the command.
//!
//! The parts:
//!
//! 1. **Overhead ratio** ([`SuiteModel`] × K): wall seconds per step of a K-node run ÷ the
//!    compute limit, where the compute limit is one node's seconds per step (the K = 1 run
//!    of the same model and batch) × K ÷ min(K, cores). Timed in-process with
//!    [`Trainer::fit`](gym_core::Trainer::fit) under DiLoCo with H larger than the steps
//!    taken, so the timed steps are each node's forward/backward and inner optimizer only:
//!    what remains above 1 is the interference between node threads, not communication.
//!    Beside it, for K ≥ 2, the same cores' loss with no simulator between the nodes:
//!    min(K, cores) independent one-node trainings at once against one alone
//!    (`independent_runs_ratio_<model>_k<K>`), and the K nodes against those
//!    (`overhead_vs_independent_<model>_k<K>`, the simulator's own share).
//!    The compute limit ([`compute`]): the matmul rate of these cores (`matmul_flops_1t`,
//!    `matmul_flops_all`) and each model's achieved FLOP/s as a fraction of it
//!    (`fraction_of_matmul_<model>`), measured in the same run; and, in a build with
//!    LibTorch, the CNNs against it ([`libtorch`]: `cnn_vs_libtorch`, `cifar_cnn_vs_libtorch`).
//! 2. **Collective bandwidth**: all-reduce (mean), all-gather and broadcast of S bytes over
//!    K ranks of an [`InProcessGroup`](gym_core::InProcessGroup), against a plain memcpy of
//!    S bytes.
//! 3. **Peak memory** of the `mnist` binary training K nodes of the MLP (a child process,
//!    so that the peak is that run's alone).
//! 4. **Start-up**: seconds from the child's start to its first step.
//! 5. **Planner**: DiLoCo on 10,000 nodes for 1,000 outer rounds, planned by the `plan`
//!    binary (target: at most 10 s and 1 GiB).
//! 6. **Cost of a node-step** ([`node_cost`], off unless [`SuiteConfig::node_cost`] names
//!    node counts: `bench --node-cost`): CPU time per node-step of the MLP at K = 16 to
//!    1,024 and the small GPT at K = 16 and 64, against the smallest K.
//!
//! `bench --calibrate` ([`calibrate`]) times the MPI transport, fits the simulated network's
//! latency and bandwidth to it, writes them as a network file and checks the simulator's
//! charge against a job of another size. `bench --real-links` ([`real_links`]) sets the
//! simulated clock against whole MPI training runs across emulated hosts with shaped links.

pub mod args;
mod bandwidth;
pub mod calibrate;
mod children;
pub mod compute;
mod conv;
pub mod libtorch;
pub mod node_cost;
mod overhead;
mod planner;
pub mod real_links;
mod soak;
mod soak_table;

#[cfg(feature = "mpi")]
pub use bandwidth::mpi_worker;
pub use conv::conv_passes;
pub use node_cost::NodeCostConfig;
pub use soak::{
    RSS_GROWTH_LIMIT_PCT, RssSample, SoakConfig, SoakReport, TrafficBalance, rss_growth_pct,
    run_soak,
};
pub use soak_table::soak_result;

use burn::tensor::Device;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::runner::BoxError;

/// Bytes in the "MB" of the collective sizes (MiB: the buffers are powers of two).
const MB: usize = 1 << 20;

/// A model of the overhead part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SuiteModel {
    /// The MNIST MLP (784-256-10), batch 64 per node.
    Mlp,
    /// The original's MNIST CNN (1.87M parameters), batch 64 per node.
    Cnn,
    /// The small GPT (2 layers, 2 heads, 64 dims, context 64) on tiny-shakespeare,
    /// 16 sequences per node.
    Gpt,
}

impl SuiteModel {
    /// Every model, in the order the suite runs them.
    pub const ALL: [SuiteModel; 3] = [SuiteModel::Mlp, SuiteModel::Cnn, SuiteModel::Gpt];

    /// The name used in figure names (`mlp`, `cnn`, `gpt`).
    pub fn name(self) -> &'static str {
        match self {
            SuiteModel::Mlp => "mlp",
            SuiteModel::Cnn => "cnn",
            SuiteModel::Gpt => "gpt",
        }
    }
}

impl std::str::FromStr for SuiteModel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        SuiteModel::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown model `{s}` (mlp, cnn, gpt)"))
    }
}

/// A collective operation of the bandwidth part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuiteCollective {
    /// All-reduce with [`ReduceOp::Mean`](gym_core::ReduceOp::Mean).
    AllReduce,
    /// All-gather: every rank receives every rank's tensor.
    AllGather,
    /// Broadcast from rank 0.
    Broadcast,
}

impl SuiteCollective {
    /// Every operation, in the order the suite runs them.
    pub const ALL: [SuiteCollective; 3] = [
        SuiteCollective::AllReduce,
        SuiteCollective::AllGather,
        SuiteCollective::Broadcast,
    ];

    /// The name used in figure names (`allreduce`, `allgather`, `broadcast`).
    pub fn name(self) -> &'static str {
        match self {
            SuiteCollective::AllReduce => "allreduce",
            SuiteCollective::AllGather => "allgather",
            SuiteCollective::Broadcast => "broadcast",
        }
    }
}

/// What the suite runs, and where its inputs are.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// Overhead part: the models to time (empty: skip the part).
    pub models: Vec<SuiteModel>,
    /// Overhead part: the node counts. K = 1 is always run first: it is the baseline of
    /// every ratio.
    pub ks: Vec<usize>,
    /// Overhead part: the largest K run for any model.
    pub max_k: usize,
    /// Overhead part: the largest K run for the CNN (about 0.25 s of one core per
    /// node-step on CPU, so K = 16 costs about 2 s a step on 2 cores).
    pub cnn_max_k: usize,
    /// Overhead part: steps run and discarded before timing (first-step allocations, lazy
    /// initialisation): each K also runs alone for this many steps, and its loop time is
    /// subtracted.
    pub warmup_steps: usize,
    /// Timings of each model and node count: the overhead figures are their median, so two
    /// disturbed runs do not decide a ratio (5 by default: with 3, one run of the MLP at
    /// K = 8 in four came out at 1.16 against 1.04–1.05 in the others).
    pub repeats: usize,
    /// Precision part: each model's one-node step in f32 and under `--autocast bf16`.
    pub precision: bool,
    /// Compute-limit part ([`compute`]): the sides of the square matrices whose product
    /// rates give `matmul_flops_1t` and `matmul_flops_all` (empty or all 0: skip the part).
    pub matmul_sizes: Vec<usize>,
    /// Compute-limit part: timed steps of the 6-layer, 384-wide GPT on 2 nodes (0: no row).
    pub gpt_6l384_steps: usize,
    /// The CNNs on flex against LibTorch ([`libtorch`]): measured in a build with the `tch`
    /// feature, otherwise a table row that says why.
    pub libtorch: bool,
    /// Overhead part: timed steps of the MLP.
    pub mlp_steps: usize,
    /// Overhead part: timed steps of the CNN.
    pub cnn_steps: usize,
    /// Overhead part: timed steps of the GPT.
    pub gpt_steps: usize,
    /// Bandwidth part: tensor sizes in MiB (none above 0: skip the part).
    pub collective_mb: Vec<usize>,
    /// Bandwidth part: group sizes.
    pub collective_ks: Vec<usize>,
    /// Bandwidth part: timed repetitions per figure (their median), after one warm-up call.
    pub collective_reps: usize,
    /// Memory part: node counts of the `mnist` child runs (none above 0: skip the part).
    pub rss_ks: Vec<usize>,
    /// Start-up part: node count of the `mnist` child run (`None`: skip the part).
    pub startup_k: Option<usize>,
    /// The `mnist` binary the memory and start-up parts run; `None` makes those parts
    /// report an error row instead of figures.
    pub mnist_bin: Option<PathBuf>,
    /// The `bench` binary (built with the `mpi` feature) that `mpirun` starts for the
    /// bandwidth part's MPI rows (`mpi_worker`, with the `mpi` feature); `None`: no MPI rows.
    pub mpi_bench: Option<PathBuf>,
    /// The MNIST IDX files.
    pub mnist_dir: PathBuf,
    /// tiny-shakespeare's `input.txt`.
    pub gpt_dir: PathBuf,
    /// Scratch folder for the child runs' logs (removed at the end).
    pub scratch_dir: PathBuf,
    /// The command line, as the captions quote it.
    pub command: String,
    /// The `plan` binary of the planner's row (10,000 nodes, 1,000 rounds); `None` skips
    /// the row.
    pub plan_bin: Option<PathBuf>,
    /// Cost-of-a-node-step part (no node counts, the default: skip the part; see
    /// [`NodeCostConfig::default`] for its rows).
    pub node_cost: NodeCostConfig,
}

impl SuiteConfig {
    /// The default suite (about 6 minutes on a 2-core machine): every model at K = 1, 2, 4,
    /// 8, 16; every collective at 1–256 MiB over 2–16 ranks; peak memory at K = 1, 64, 256,
    /// 1024; start-up at K = 16.
    pub fn new(mnist_dir: PathBuf, gpt_dir: PathBuf, mnist_bin: Option<PathBuf>) -> Self {
        SuiteConfig {
            models: SuiteModel::ALL.to_vec(),
            ks: vec![1, 2, 4, 8, 16],
            max_k: 16,
            // K = 16 of the CNN alone would take over a minute on 2 cores.
            cnn_max_k: 16,
            warmup_steps: 1,
            repeats: 5,
            precision: true,
            matmul_sizes: vec![1024, 2048],
            gpt_6l384_steps: 3,
            libtorch: true,
            mlp_steps: 1000,
            cnn_steps: 3,
            gpt_steps: 120,
            collective_mb: vec![1, 4, 16, 64, 256],
            collective_ks: vec![2, 4, 8, 16],
            collective_reps: 3,
            rss_ks: vec![1, 64, 256, 1024],
            startup_k: Some(16),
            mnist_bin,
            mpi_bench: None,
            plan_bin: None,
            node_cost: NodeCostConfig::off(),
            mnist_dir,
            gpt_dir,
            scratch_dir: std::env::temp_dir()
                .join(format!("gym-bench-suite-{}", std::process::id())),
            command: String::new(),
        }
    }

    /// The node counts of `model`'s overhead runs: 1, then the configured ones within its cap.
    pub fn ks_for(&self, model: SuiteModel) -> Vec<usize> {
        let cap = match model {
            SuiteModel::Cnn => self.max_k.min(self.cnn_max_k),
            _ => self.max_k,
        };
        let mut ks: Vec<usize> = std::iter::once(1)
            .chain(self.ks.iter().copied().filter(|&k| k >= 1 && k <= cap))
            .collect();
        ks.sort_unstable();
        ks.dedup();
        ks
    }

    fn steps_for(&self, model: SuiteModel) -> usize {
        match model {
            SuiteModel::Mlp => self.mlp_steps,
            SuiteModel::Cnn => self.cnn_steps,
            SuiteModel::Gpt => self.gpt_steps,
        }
        .max(1)
    }
}

/// Where and when the suite ran: what every caption and the JSON state.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineInfo {
    /// `/proc/cpuinfo`'s model name and the cores this process may use, e.g.
    /// `AMD EPYC 7B13, 2 cores`.
    pub machine: String,
    /// Cores this process may use ([`std::thread::available_parallelism`]).
    pub cores: usize,
    /// UTC date and time at the start, `YYYY-MM-DD HH:MM UTC`.
    pub date: String,
    /// `/proc/loadavg`'s 1, 5 and 15-minute averages at the start.
    pub load_average: String,
}

impl MachineInfo {
    /// This machine, now.
    pub fn now() -> Self {
        let cores = cores();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "unknown".into());
        MachineInfo {
            machine: format!("{cpu}, {cores} cores"),
            cores,
            date: utc_now(),
            load_average,
        }
    }
}

/// One table of the suite: a caption and Markdown rows.
#[derive(Debug, Clone)]
pub struct SuiteTable {
    /// Bold title and caption (machine, date, load, command, definitions).
    pub caption: String,
    /// The table's Markdown lines, header included.
    pub rows: Vec<String>,
}

/// What the suite measured.
#[derive(Debug, Clone)]
pub struct SuiteResult {
    /// Every figure by name (see the module documentation for the names); only finite
    /// values are kept.
    pub figures: BTreeMap<String, f64>,
    /// Where and when.
    pub machine: MachineInfo,
    /// One table per part that ran.
    pub tables: Vec<SuiteTable>,
}

impl SuiteResult {
    /// Adds the table of `rows` under its caption: `title`, this machine, the `command` that
    /// measured it (the suite's or the soak's) and `note` (definitions).
    fn push_table(&mut self, title: &str, command: &str, note: &str, rows: Vec<String>) {
        let m = &self.machine;
        let caption = format!(
            "**{title}.** Machine: {}; date: {}; load average at the start: {}; command: `{command}`. {note}",
            m.machine, m.date, m.load_average
        );
        self.tables.push(SuiteTable { caption, rows });
    }

    /// The flat JSON object `bench --json` writes: every figure, plus `machine`, `date` and
    /// `load_average` as strings.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        map.insert("machine".into(), self.machine.machine.clone().into());
        map.insert("date".into(), self.machine.date.clone().into());
        map.insert(
            "load_average".into(),
            self.machine.load_average.clone().into(),
        );
        for (name, &v) in &self.figures {
            // Whole numbers (byte counts) as integers, so they read back exactly.
            let number = if v.fract() == 0.0 && (0.0..9.0e15).contains(&v) {
                Some(serde_json::Number::from(v as u64))
            } else {
                serde_json::Number::from_f64(v)
            };
            if let Some(n) = number {
                map.insert(name.clone(), Value::Number(n));
            }
        }
        Value::Object(map)
    }

    /// Writes [`to_json`](Self::to_json) to `path`, pretty-printed.
    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(&self.to_json()).expect("a JSON map serialises");
        std::fs::write(path, text + "\n")
    }

    /// Every table as Markdown, captions first, separated by blank lines.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            let _ = writeln!(out, "{}\n", t.caption);
            for r in &t.rows {
                let _ = writeln!(out, "{r}");
            }
            out.push('\n');
        }
        out
    }
}

/// Runs every part `config` enables and returns the figures and tables. Parts 3 and 4 run
/// `config.mnist_bin`; a child that fails is an error row in its table, not an error of the
/// suite. Progress goes to stderr.
pub fn run_suite(config: &SuiteConfig) -> Result<SuiteResult, BoxError> {
    let machine = MachineInfo::now();
    let mut out = SuiteResult {
        figures: BTreeMap::new(),
        machine,
        tables: Vec::new(),
    };
    if !config.models.is_empty() {
        overhead::overhead(config, &mut out)?;
        if config.precision {
            overhead::precision(config, &mut out)?;
        }
    }
    if config.matmul_sizes.iter().any(|&n| n > 0) {
        compute::compute(config, &mut out)?;
    }
    if config.libtorch {
        libtorch::libtorch(config, &mut out)?;
    }
    if config.collective_mb.iter().any(|&s| s > 0) && config.collective_ks.iter().any(|&k| k > 0) {
        bandwidth::bandwidth(config, &mut out)?;
    }
    if config.rss_ks.iter().any(|&k| k > 0) || config.startup_k.is_some() {
        children::children(config, &mut out);
        std::fs::remove_dir_all(&config.scratch_dir).ok();
    }
    if let Some(plan) = &config.plan_bin {
        planner::planner(plan, config, &mut out)?;
    }
    if config.node_cost.any() {
        node_cost::node_cost(config, &mut out)?;
    }
    Ok(out)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The backend's short name for figure names (`flex`, `tch`, …), from the default device's
/// debug name (e.g. `Device<Flex(Cpu)>`).
fn backend_tag() -> String {
    let name = format!("{:?}", Device::default()).to_lowercase();
    [
        ("flex", "flex"),
        ("libtorch", "tch"),
        ("tch", "tch"),
        ("cuda", "cuda"),
        ("wgpu", "wgpu"),
        ("ndarray", "ndarray"),
    ]
    .into_iter()
    .find(|(needle, _)| name.contains(needle))
    .map_or("backend", |(_, tag)| tag)
    .to_string()
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let t = gym_core::metrics::UtcTime::now();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute
    )
}

/// The median of `v` (the mean of the middle two for an even count; NaN if empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn k_one_is_always_the_first_overhead_run_and_the_cnn_is_capped() {
        let mut c = SuiteConfig::new(PathBuf::new(), PathBuf::new(), None);
        c.ks = vec![16, 4, 2];
        c.cnn_max_k = 4;
        assert_eq!(c.ks_for(SuiteModel::Mlp), vec![1, 2, 4, 16]);
        assert_eq!(c.ks_for(SuiteModel::Cnn), vec![1, 2, 4]);
    }
}
