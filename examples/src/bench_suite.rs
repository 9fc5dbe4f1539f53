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
//!    [`Trainer::fit`] under DiLoCo with H larger than the steps taken, so the timed steps
//!    are each node's forward/backward and inner optimizer only: what remains above 1 is
//!    the interference between node threads, not communication.
//! 2. **Collective bandwidth**: all-reduce (mean), all-gather and broadcast of S bytes over
//!    K ranks of an [`InProcessGroup`], against a plain memcpy of S bytes.
//! 3. **Peak memory** of the `mnist` binary training K nodes of the MLP (a child process,
//!    so that the peak is that run's alone).
//! 4. **Start-up**: seconds from the child's start to its first step.

use burn::data::dataset::Dataset;
use burn::data::dataset::transform::PartialDataset;
use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{InProcessGroup, NodeData, ReduceOp, TrainModel, Trainer, TrainerConfig};
use gym_data::{
    CharCorpus, MnistBatcher, MnistDataset, MnistItem, MnistSplit, TokenBatcher, TokenWindow,
};
use gym_models::{GptConfig, MlpConfig, MnistCnnConfig};
use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::runner::BoxError;
use crate::summary::RunSummary;
use crate::tasks::GptArgs;

/// Bytes in the "MB" of the collective sizes (MiB: the buffers are powers of two).
const MB: usize = 1 << 20;

/// Examples per node per step of the MNIST models (the original's set-up).
const MNIST_BATCH: usize = 64;
/// Sequences per node per step, and their length, of the small GPT (the nanoGPT set-up).
const GPT_BATCH: usize = 16;
const GPT_BLOCK: usize = 64;
/// Validation examples kept for the final evaluation `fit` always runs: a few batches, so
/// that evaluating (the whole MNIST test set would take longer than the CNN's timed steps)
/// does not dominate a benchmark that never reads its result.
const VAL_EXAMPLES: usize = 64;

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
    /// All-reduce with [`ReduceOp::Mean`].
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
    /// Overhead part: the largest K run for the CNN (about 0.5 s of one core per node-step
    /// on CPU, so K = 16 costs several seconds a step).
    pub cnn_max_k: usize,
    /// Overhead part: steps run and discarded before timing (first-step allocations, lazy
    /// initialisation): each K also runs alone for this many steps, and its loop time is
    /// subtracted.
    pub warmup_steps: usize,
    /// Timings of each model and node count: the overhead figures are their median, so one
    /// disturbed run does not decide a ratio.
    pub repeats: usize,
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
}

impl SuiteConfig {
    /// The default suite (about 4 minutes on a 2-core machine): every model at K = 1, 2, 4,
    /// 8, 16 (the CNN up to 8); every collective at 1–256 MiB over 2–16 ranks; peak memory at K = 1, 64, 256,
    /// 1024; start-up at K = 16.
    pub fn new(mnist_dir: PathBuf, gpt_dir: PathBuf, mnist_bin: Option<PathBuf>) -> Self {
        SuiteConfig {
            models: SuiteModel::ALL.to_vec(),
            ks: vec![1, 2, 4, 8, 16],
            max_k: 16,
            // K = 16 of the CNN alone would take over a minute on 2 cores.
            cnn_max_k: 8,
            warmup_steps: 1,
            repeats: 3,
            mlp_steps: 50,
            cnn_steps: 3,
            gpt_steps: 15,
            collective_mb: vec![1, 4, 16, 64, 256],
            collective_ks: vec![2, 4, 8, 16],
            collective_reps: 3,
            rss_ks: vec![1, 64, 256, 1024],
            startup_k: Some(16),
            mnist_bin,
            mpi_bench: None,
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
        overhead(config, &mut out)?;
    }
    if config.collective_mb.iter().any(|&s| s > 0) && config.collective_ks.iter().any(|&k| k > 0) {
        bandwidth(config, &mut out)?;
    }
    if config.rss_ks.iter().any(|&k| k > 0) || config.startup_k.is_some() {
        children(config, &mut out);
        std::fs::remove_dir_all(&config.scratch_dir).ok();
    }
    Ok(out)
}

/// The caption every table starts with.
fn caption(title: &str, config: &SuiteConfig, m: &MachineInfo, note: &str) -> String {
    format!(
        "**{title}.** Machine: {}; date: {}; load average at the start: {}; command: `{}`. {note}",
        m.machine, m.date, m.load_average, config.command
    )
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

// ── Part 1: overhead ratio ──────────────────────────────────────────────────────────────

/// The data the overhead runs train on, loaded once.
struct OverheadData {
    mnist: Option<NodeData<MnistItem>>,
    gpt: Option<(NodeData<TokenWindow>, GptConfig)>,
}

fn load_overhead_data(config: &SuiteConfig) -> Result<OverheadData, BoxError> {
    let needs = |m| config.models.contains(&m);
    let mnist = if needs(SuiteModel::Mlp) || needs(SuiteModel::Cnn) {
        let dir = gym_data::resolve_data_dir(Some(&config.mnist_dir), "mnist")?;
        let train = MnistDataset::load_or_download(&dir, MnistSplit::Train)?;
        let test = MnistDataset::load_or_download(&dir, MnistSplit::Test)?;
        let n = VAL_EXAMPLES.min(test.len());
        Some(NodeData::shared(train, PartialDataset::new(test, 0, n)))
    } else {
        None
    };
    let gpt = if needs(SuiteModel::Gpt) {
        let dir = gym_data::resolve_data_dir(Some(&config.gpt_dir), "shakespeare")?;
        let corpus = CharCorpus::load_or_download(&dir)?;
        // The `nanogpt` binary's model for these sizes (bias, no dropout).
        let args = GptArgs {
            text_file: None,
            val_fraction: 0.1,
            block_size: GPT_BLOCK,
            model_size: "small".into(),
            n_layer: Some(2),
            n_head: Some(2),
            n_embd: Some(64),
            dropout: 0.0,
            no_bias: false,
            shard: false,
        };
        let gpt_config = args.model_config(corpus.vocab().len());
        gpt_config.validate()?;
        let (train, val) = corpus.split(GPT_BLOCK, args.val_fraction)?;
        // A shard of the validation windows (side by side) holding about VAL_EXAMPLES / 4.
        let shards = (val.tokens().len() / (GPT_BLOCK * VAL_EXAMPLES / 4)).max(1);
        let val = val.shard(0, shards)?;
        Some((NodeData::shared(train, val), gpt_config))
    } else {
        None
    };
    Ok(OverheadData { mnist, gpt })
}

/// Seconds per step of a K-node run in steady state: (loop seconds of a run of
/// `warmup + steps` steps − loop seconds of a run of `warmup` steps) ÷ `steps`.
///
/// Why two runs rather than the per-step records of one: without synchronisation the node
/// threads drift apart, and a step's record is emitted when its slowest node finishes it,
/// so at the end of the warm-up the faster nodes are already steps ahead and the last
/// records miss their work (16 GPT nodes timed over 5 steps came out at 0.97 of the
/// compute limit, over 20 steps at 1.86). Each run's loop starts every node together and
/// ends when the last one finishes, so the difference holds exactly `steps` steps of every
/// node. Should noise make it non-positive (steps of a few milliseconds), the mean of the
/// last `steps` records stands in.
fn time_steps<M, I, B>(
    k: usize,
    batch_size: usize,
    warmup: usize,
    steps: usize,
    init: impl Fn(&Device) -> M + Sync,
    data: &NodeData<I>,
    batcher: &B,
) -> Result<f64, BoxError>
where
    M: TrainModel,
    I: Send + 'static,
    B: burn::data::dataloader::batcher::Batcher<I, M::Batch>,
{
    let total = warmup + steps;
    let run = |max_steps: usize| {
        // H beyond the last step: no synchronisation in the run, so every timed step is
        // local compute and the inner optimizer, and nodes never wait for each other.
        let strategy = DiLoCoConfig::new()
            .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(total + 1));
        let trainer_config = TrainerConfig::new(k)
            .with_max_steps(Some(max_steps))
            .with_batch_size(batch_size)
            .with_val_size(Some(0));
        Trainer::new(trainer_config).fit(&init, &strategy, data, batcher)
    };
    let warm_s = if warmup > 0 {
        run(warmup)?.report.loop_s
    } else {
        0.0
    };
    let report = run(total)?.report;
    let timed = &report.train[report.train.len().saturating_sub(steps)..];
    if timed.is_empty() {
        return Err(format!("a {k}-node run recorded no steps").into());
    }
    let difference = (report.loop_s - warm_s) / steps as f64;
    Ok(if difference > 0.0 {
        difference
    } else {
        timed.iter().map(|r| r.step_time_s).sum::<f64>() / timed.len() as f64
    })
}

fn overhead(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let data = load_overhead_data(config)?;
    let cores = out.machine.cores;
    let tag = backend_tag();
    let mut rows = vec![
        "| model | K | ms/step (K nodes) | compute limit ms/step | overhead ratio | node-steps/s |"
            .to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    for &model in &config.models {
        let steps = config.steps_for(model);
        let mut base = None;
        for k in config.ks_for(model) {
            eprintln!(
                "overhead: {} on {k} node(s), {steps} timed steps …",
                model.name()
            );
            let w = config.warmup_steps;
            let time_once = || -> Result<f64, BoxError> {
                Ok(match (model, &data) {
                    (
                        SuiteModel::Mlp,
                        OverheadData {
                            mnist: Some(mnist), ..
                        },
                    ) => time_steps(
                        k,
                        MNIST_BATCH,
                        w,
                        steps,
                        |d| MlpConfig::new().init(d),
                        mnist,
                        &MnistBatcher,
                    )?,
                    (
                        SuiteModel::Cnn,
                        OverheadData {
                            mnist: Some(mnist), ..
                        },
                    ) => time_steps(
                        k,
                        MNIST_BATCH,
                        w,
                        steps,
                        |d| MnistCnnConfig::new().init(d),
                        mnist,
                        &MnistBatcher,
                    )?,
                    (
                        SuiteModel::Gpt,
                        OverheadData {
                            gpt: Some((tokens, gpt)),
                            ..
                        },
                    ) => time_steps(
                        k,
                        GPT_BATCH,
                        w,
                        steps,
                        |d| gpt.init(d).expect("validated configuration"),
                        tokens,
                        &TokenBatcher,
                    )?,
                    _ => unreachable!("the data of every configured model is loaded"),
                })
            };
            let mut times = (0..config.repeats.max(1))
                .map(|_| time_once())
                .collect::<Result<Vec<f64>, BoxError>>()?;
            times.sort_by(f64::total_cmp);
            let seconds = times[times.len() / 2];
            // K = 1 comes first (ks_for), so the baseline is known for every K after it.
            let one = *base.get_or_insert(seconds);
            let limit = one * k as f64 / k.min(cores) as f64;
            let ratio = seconds / limit;
            let name = model.name();
            out.figures
                .insert(format!("step_ms_{name}_k{k}"), seconds * 1e3);
            out.figures
                .insert(format!("overhead_ratio_{name}_k{k}"), ratio);
            if k == 1 && model != SuiteModel::Mlp {
                out.figures
                    .insert(format!("{name}_step_ms_{tag}"), seconds * 1e3);
            }
            rows.push(format!(
                "| {name} | {k} | {:.2} | {:.2} | {ratio:.3} | {:.1} |",
                seconds * 1e3,
                limit * 1e3,
                k as f64 / seconds
            ));
        }
    }
    let note = format!(
        "Overhead ratio = wall seconds per step of K nodes ÷ (one node's seconds per step at \
         K = 1 × K ÷ min(K, {cores} cores)); 1.0 is the compute limit. Strategy: DiLoCo with \
         H larger than the steps run, so the timed steps are each node's forward/backward and \
         inner AdamW step only (no communication): the excess over 1 is the interference \
         between node threads. Seconds per step = (loop time of a run of W + N steps − \
         loop time of a run of W steps) ÷ N, N = {} (CNN {}, GPT {}), W = {} warm-up \
         step(s): both runs start every node together and end when the last finishes, so \
         node threads drifting apart do not bias it; the median of {} such timings; CNN up to K = {}; MLP and CNN batch {MNIST_BATCH} per node, GPT 2 layers × 2 heads × 64 dims, \
         context {GPT_BLOCK}, {GPT_BATCH} sequences per node; backend {tag}, one kernel \
         thread per node.",
        config.mlp_steps,
        config.cnn_steps,
        config.gpt_steps,
        config.warmup_steps,
        config.repeats.max(1),
        config.max_k.min(config.cnn_max_k)
    );
    out.tables.push(SuiteTable {
        caption: caption("Overhead ratio", config, &out.machine, &note),
        rows,
    });
    Ok(())
}

// ── Part 2: collective bandwidth ────────────────────────────────────────────────────────

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

/// Median seconds of copying `bytes` bytes into a buffer that is already faulted in: the
/// memory bandwidth a collective of that size is held against.
fn memcpy_seconds(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    // The warm-up touches every page of `dst`, so the timed copies move bytes only.
    dst.copy_from_slice(&src);
    let times = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(times)
}

/// Median seconds, seen by rank 0, of each operation on each size over a group of `k`,
/// in the order `sizes` × [`SuiteCollective::ALL`].
fn collective_seconds(k: usize, sizes: &[usize], reps: usize) -> Result<Vec<f64>, BoxError> {
    let group = InProcessGroup::new(k);
    let results = group.run(|comm| -> Result<Vec<f64>, String> {
        let device = Device::default();
        let rank = comm.rank();
        let mut medians = Vec::new();
        for &mb in sizes {
            let n = mb * MB / 4;
            let host = vec![rank as f32 + 1.0; n];
            let input = Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device);
            for op in SuiteCollective::ALL {
                let mut times = Vec::with_capacity(reps);
                // One warm-up call, then the timed ones.
                for rep in 0..=reps {
                    // An all-reduce consumes and may reuse its input, as a strategy's
                    // gradient would be: it gets a fresh tensor, made before the clock
                    // starts. The others only pass theirs along.
                    let tensor = match op {
                        SuiteCollective::AllReduce => {
                            Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device)
                        }
                        _ => input.clone(),
                    };
                    // Every rank enters the timed call together.
                    comm.barrier().map_err(|e| e.to_string())?;
                    let start = Instant::now();
                    // The clock stops before the result is dropped: freeing is not the call's.
                    let elapsed = match op {
                        SuiteCollective::AllReduce => {
                            let r = comm.all_reduce(tensor, ReduceOp::Mean);
                            let t = start.elapsed();
                            r.map_err(|e| e.to_string())?;
                            t
                        }
                        SuiteCollective::AllGather => {
                            let r = comm.all_gather(tensor);
                            let t = start.elapsed();
                            r.map_err(|e| e.to_string())?;
                            t
                        }
                        SuiteCollective::Broadcast => {
                            let r = comm.broadcast(tensor, 0);
                            let t = start.elapsed();
                            r.map_err(|e| e.to_string())?;
                            t
                        }
                    };
                    if rep > 0 {
                        times.push(elapsed.as_secs_f64());
                    }
                }
                medians.push(median(times));
            }
        }
        Ok(medians)
    })?;
    match results.into_iter().next() {
        Some(Ok(Ok(m))) => Ok(m),
        Some(Ok(Err(e))) | Some(Err(e)) => Err(format!("collectives over {k} ranks: {e}").into()),
        None => Err("an empty group".into()),
    }
}

/// The largest copy timed as "memcpy of the K buffers": beyond it the figure is left out
/// rather than allocating twice that much.
const MEMCPY_ALL_MAX: usize = 1024 * MB;

fn bandwidth(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let reps = config.collective_reps.max(1);
    let mut sizes = config.collective_mb.clone();
    sizes.retain(|&s| s > 0);
    sizes.sort_unstable();
    sizes.dedup();
    let mut ks = config.collective_ks.clone();
    ks.retain(|&k| k >= 1);
    ks.sort_unstable();
    ks.dedup();
    // A copy is cheap: more repetitions steady its median.
    let copy_reps = reps.max(9);
    let mut memcpy = BTreeMap::new();
    for &mb in &sizes {
        for &k in std::iter::once(&1).chain(&ks) {
            if k * mb * MB <= MEMCPY_ALL_MAX && !memcpy.contains_key(&(mb * k)) {
                memcpy.insert(mb * k, memcpy_seconds(mb * k * MB, copy_reps));
            }
        }
    }
    let mut rows = vec![
        "| op | size (MiB) | K | ms/call | memcpy of one buffer (ms) | one buffer ÷ call | \
         memcpy of the K buffers (ms) | K buffers ÷ call |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut cells = BTreeMap::new();
    for &k in &ks {
        eprintln!("bandwidth: {k} ranks, {sizes:?} MiB …");
        let secs = collective_seconds(k, &sizes, reps)?;
        for (i, &mb) in sizes.iter().enumerate() {
            for j in 0..SuiteCollective::ALL.len() {
                let s = secs[i * SuiteCollective::ALL.len() + j];
                cells.insert((j, mb, k), s);
            }
        }
    }
    let mut headline: Option<f64> = None;
    for ((j, mb, k), s) in cells {
        let op = SuiteCollective::ALL[j];
        let name = op.name();
        let one = memcpy[&mb];
        out.figures
            .insert(format!("{name}_vs_memcpy_{mb}mb_k{k}"), one / s);
        let all = memcpy.get(&(mb * k)).copied();
        let all_cells = match all {
            Some(all) if op == SuiteCollective::AllReduce => {
                out.figures
                    .insert(format!("{name}_vs_memcpy_all_{mb}mb_k{k}"), all / s);
                if mb == 16 && k >= 2 {
                    headline = Some(headline.map_or(all / s, |h| h.min(all / s)));
                }
                format!("{:.3} | {:.3}", all * 1e3, all / s)
            }
            _ => "- | -".to_string(),
        };
        rows.push(format!(
            "| {name} | {mb} | {k} | {:.3} | {:.3} | {:.3} | {all_cells} |",
            s * 1e3,
            one * 1e3,
            one / s
        ));
    }
    if let Some(h) = headline {
        out.figures.insert("allreduce_vs_memcpy_16mb".into(), h);
    }
    if let Some(exe) = &config.mpi_bench {
        for &k in ks.iter().filter(|&&k| k >= 2) {
            eprintln!("bandwidth: MPI, {k} processes, {sizes:?} MiB …");
            match mpi_seconds(exe, k, &sizes, reps) {
                Ok(secs) => {
                    for (&mb, s) in sizes.iter().zip(secs) {
                        let one = memcpy[&mb];
                        let all = memcpy.get(&(mb * k)).copied();
                        out.figures
                            .insert(format!("mpi_allreduce_vs_memcpy_{mb}mb_k{k}"), one / s);
                        let all_cells = match all {
                            Some(all) => {
                                out.figures.insert(
                                    format!("mpi_allreduce_vs_memcpy_all_{mb}mb_k{k}"),
                                    all / s,
                                );
                                format!("{:.3} | {:.3}", all * 1e3, all / s)
                            }
                            None => "- | -".to_string(),
                        };
                        rows.push(format!(
                            "| allreduce (MPI, {k} processes) | {mb} | {k} | {:.3} | {:.3} | {:.3} | {all_cells} |",
                            s * 1e3,
                            one * 1e3,
                            one / s
                        ));
                    }
                }
                Err(e) => rows.push(format!(
                    "| allreduce (MPI) | - | {k} | error: {e} | | | | |"
                )),
            }
        }
    }
    let note = format!(
        "Each rank of an in-process group of K holds an f32 tensor of the size given; \
         ms/call is rank 0's median over {reps} call(s) after a warm-up, each starting \
         after a barrier (all-reduce: mean, of a fresh tensor; broadcast: from rank 0). \
         memcpy: median `copy_from_slice` into a buffer already faulted in, of one rank's \
         buffer and of all K ranks' buffers at once. An all-reduce must read every rank's \
         buffer: \"K buffers ÷ call\" ≥ 1 means it finishes sooner than copying them once. \
         The headline `allreduce_vs_memcpy_16mb` is the smallest \"K buffers ÷ call\" of \
         the 16 MiB all-reduces over K ≥ 2{}. All-gather and broadcast hand every rank the \
         senders' buffers themselves (shared, copy-on-write: no byte is copied), so their \
         figures measure the rendezvous only. MPI rows (a `bench` built with the `mpi` \
         feature): K processes on this host under `mpirun`, shared memory, the same \
         rank-ordered reduce-scatter and all-gather the MPI collective always uses.",
        if sizes.contains(&16) && ks.iter().any(|&k| k >= 2) {
            ""
        } else {
            " (not measured in this run)"
        }
    );
    out.tables.push(SuiteTable {
        caption: caption("Collective bandwidth", config, &out.machine, &note),
        rows,
    });
    Ok(())
}

/// Seconds (rank 0's median) of an MPI all-reduce of each size over `k` processes started
/// by `mpirun` on this host, each running `exe --mpi-bandwidth-worker K`.
fn mpi_seconds(exe: &Path, k: usize, sizes: &[usize], reps: usize) -> Result<Vec<f64>, String> {
    let sizes_arg = sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &k.to_string(),
        ])
        .arg(exe)
        .args([
            "--mpi-bandwidth-worker",
            &k.to_string(),
            "--suite-mb",
            &sizes_arg,
        ])
        .args(["--suite-reps", &reps.to_string()])
        .output()
        .map_err(|e| format!("mpirun: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mpirun exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("mpi-allreduce-seconds "))
        .ok_or("no timings from rank 0")?;
    let secs: Vec<f64> = line
        .split(',')
        .map(|x| x.trim().parse::<f64>().map_err(|e| format!("{x:?}: {e}")))
        .collect::<Result<_, _>>()?;
    if secs.len() != sizes.len() {
        return Err(format!("{} timings for {} sizes", secs.len(), sizes.len()));
    }
    Ok(secs)
}

/// One process of the MPI rows (run by `mpirun`): times the all-reduce (mean) of a fresh
/// f32 tensor of each size in MiB, `reps` times after a warm-up, each call after a
/// barrier; rank 0 prints `mpi-allreduce-seconds S1,S2,…` (the medians).
#[cfg(feature = "mpi")]
pub fn mpi_worker(nodes: usize, sizes: &[usize], reps: usize) -> Result<(), BoxError> {
    use gym_core::{Collective, MpiTransport, ReduceOp, Transport};
    let transport = std::sync::Arc::new(MpiTransport::init(nodes)?);
    let rank = transport.local_ranks().start;
    let comm = Collective::new(transport, rank, None);
    let device = Device::default();
    let mut medians = Vec::new();
    for &mb in sizes {
        let n = mb * MB / 4;
        let host = vec![comm.rank() as f32 + 1.0; n];
        let mut times = Vec::new();
        for rep in 0..=reps.max(1) {
            let tensor = Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device);
            comm.barrier()?;
            let start = Instant::now();
            let r = comm.all_reduce(tensor, ReduceOp::Mean);
            let t = start.elapsed().as_secs_f64();
            r?;
            if rep > 0 {
                times.push(t);
            }
        }
        medians.push(median(times));
    }
    if comm.rank() == 0 {
        let line: Vec<String> = medians.iter().map(|s| format!("{s:e}")).collect();
        println!("mpi-allreduce-seconds {}", line.join(","));
    }
    Ok(())
}

// ── Parts 3 and 4: peak memory and start-up of the `mnist` binary ───────────────────────

/// How long a child may run before it is killed (a hang must not stall the suite).
const CHILD_TIMEOUT: Duration = Duration::from_secs(600);

/// What a child run of `mnist` reported.
struct ChildRun {
    summary: RunSummary,
    wall_s: f64,
}

/// The arguments of a child run with `k` nodes, after the binary.
fn child_args(config: &SuiteConfig, k: usize, run_name: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--num-nodes",
        &k.to_string(),
        "--max-steps",
        "2",
        "--batch-size",
        "32",
        "--val-size",
        "0",
        "--no-progress",
        "--run-name",
        run_name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push("--data-dir".into());
    args.push(config.mnist_dir.display().to_string());
    args.push("--log-dir".into());
    args.push(config.scratch_dir.display().to_string());
    args
}

/// Runs `mnist` with `k` nodes and reads its `summary.json`; the error is one line.
fn run_child(config: &SuiteConfig, k: usize, run_name: &str) -> Result<ChildRun, String> {
    let bin = config
        .mnist_bin
        .as_ref()
        .ok_or("the `mnist` binary was not found next to `bench`")?;
    std::fs::create_dir_all(&config.scratch_dir).map_err(|e| e.to_string())?;
    let stderr_path = config.scratch_dir.join(format!("{run_name}.stderr"));
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
    let start = Instant::now();
    // stderr to a file, not a pipe: a child that writes much would block on a full pipe.
    let mut child = Command::new(bin)
        .args(child_args(config, k, run_name))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break status,
            None if start.elapsed() > CHILD_TIMEOUT => {
                child.kill().ok();
                child.wait().ok();
                return Err(format!("killed after {} s", CHILD_TIMEOUT.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let wall_s = start.elapsed().as_secs_f64();
    if !status.success() {
        let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        return Err(format!("{status}: {}", last.trim()));
    }
    let path = config.scratch_dir.join(run_name).join("summary.json");
    let summary = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|s| serde_json::from_str(&s).map_err(|e| format!("{}: {e}", path.display())))?;
    Ok(ChildRun { summary, wall_s })
}

/// A Markdown cell: `|` would end it.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn children(config: &SuiteConfig, out: &mut SuiteResult) {
    let child_cmd = |k: usize| {
        let bin = config
            .mnist_bin
            .as_ref()
            .map_or("mnist".into(), |b| b.display().to_string());
        format!("{bin} {}", child_args(config, k, "…").join(" "))
    };
    if config.rss_ks.iter().any(|&k| k > 0) {
        let mut rows = vec![
            "| K | peak RSS (MiB) | per node (MiB) | start-up (s) | wall (s) | error |".to_string(),
            "|---|---|---|---|---|---|".to_string(),
        ];
        let mut ks = config.rss_ks.clone();
        ks.retain(|&k| k > 0);
        ks.sort_unstable();
        ks.dedup();
        for k in ks {
            eprintln!("memory: mnist with {k} node(s) …");
            match run_child(config, k, &format!("suite-rss-k{k}")) {
                Ok(run) => {
                    let rss = run.summary.peak_rss_bytes;
                    if let Some(b) = rss {
                        out.figures
                            .insert(format!("peak_rss_mlp_k{k}_bytes"), b as f64);
                    }
                    let mib = |b: u64| b as f64 / MB as f64;
                    rows.push(format!(
                        "| {k} | {} | {} | {:.2} | {:.2} | {} |",
                        rss.map_or("-".into(), |b| format!("{:.0}", mib(b))),
                        rss.map_or("-".into(), |b| format!("{:.2}", mib(b) / k as f64)),
                        run.summary.startup_s,
                        run.wall_s,
                        if rss.is_none() {
                            "no peak RSS reported"
                        } else {
                            ""
                        }
                    ));
                }
                Err(e) => rows.push(format!("| {k} | - | - | - | - | {} |", cell(&e))),
            }
        }
        let note = format!(
            "Peak resident memory (VmHWM, from the run's summary.json) of a separate `mnist` \
             process training K nodes of the MLP (AllReduce, 2 steps, batch 32, one MNIST \
             copy shared by all nodes): `{}` with K varied.",
            child_cmd(1).replace("--num-nodes 1", "--num-nodes K")
        );
        out.tables.push(SuiteTable {
            caption: caption("Peak memory", config, &out.machine, &note),
            rows,
        });
    }
    if let Some(k) = config.startup_k {
        eprintln!("start-up: mnist with {k} nodes …");
        let mut rows = vec![
            "| K | start-up (s) | wall (s) | error |".to_string(),
            "|---|---|---|---|".to_string(),
        ];
        match run_child(config, k, &format!("suite-startup-k{k}")) {
            Ok(run) => {
                out.figures
                    .insert(format!("startup_s_k{k}"), run.summary.startup_s);
                rows.push(format!(
                    "| {k} | {:.3} | {:.2} | |",
                    run.summary.startup_s, run.wall_s
                ));
            }
            Err(e) => rows.push(format!("| {k} | - | - | {} |", cell(&e))),
        }
        let note = format!(
            "Seconds from the process's start to its first training step (summary.json's \
             `startup_s`: flags, MNIST loaded and checked, {k} replicas and strategies built), \
             of `{}`.",
            child_cmd(k)
        );
        out.tables.push(SuiteTable {
            caption: caption("Start-up", config, &out.machine, &note),
            rows,
        });
    }
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let t = gym_core::metrics::UtcTime::now();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute
    )
}

/// The MNIST CNN's 3×3 convolutions (batch 64; the layers of `MnistCnn` after the first),
/// each pass timed on one kernel thread (best of three after a warm-up) on `device`, beside a
/// matrix product of the same FLOPs: a Markdown table of milliseconds and GFLOP/s. The weight
/// gradient is computed both as Burn's autodiff computes it by default
/// (`conv2d_weight_backward`: a convolution of the input, batch and channels swapped, with the
/// output gradient as its kernel) and as `gym_models::conv` computes it (one batched GEMM over
/// the im2col of the input). The last two columns time a whole forward and backward pass of
/// the layer through autodiff with each.
pub fn conv_passes(device: &Device) -> String {
    use burn::backend::Dispatch;
    use burn::tensor::Distribution;
    use burn::tensor::module::{conv_transpose2d, conv2d};
    use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};
    use gym_models::conv::conv2d_weight_gemm;
    let best_ms = |f: &mut dyn FnMut() -> TensorData| {
        f();
        (0..3)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min)
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let mut table = String::from(
        "| layer (batch 64) | forward | input gradient | weight gradient (Burn's default) | \
         weight gradient (GEMM) | matmul of the same FLOPs | forward + backward, Burn's \
         `conv2d` | forward + backward, `gym_models::conv::conv2d` |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    pool.install(|| {
        for (c_in, c_out, side) in [(64, 64, 28), (64, 128, 14), (128, 128, 14)] {
            let b = 64;
            let x = Tensor::<4>::random([b, c_in, side, side], Distribution::Default, device);
            let w = Tensor::<4>::random([c_out, c_in, 3, 3], Distribution::Default, device);
            let g = Tensor::<4>::random([b, c_out, side, side], Distribution::Default, device);
            let same = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
            let forward =
                best_ms(&mut || conv2d(x.clone(), w.clone(), None, same.clone()).into_data());
            let input_grad = best_ms(&mut || {
                let options = ConvTransposeOptions::new([1, 1], [1, 1], [0, 0], [1, 1], 1);
                conv_transpose2d(g.clone(), w.clone(), None, options).into_data()
            });
            let weight_grad = best_ms(&mut || {
                let (xs, gs) = (x.clone().swap_dims(0, 1), g.clone().swap_dims(0, 1));
                conv2d(xs, gs, None, same.clone()).into_data()
            });
            // Timed only where the extension runs (elsewhere `conv::conv2d` is Burn's own).
            let weight_gemm = gym_models::conv::gemm_supported(device).then(|| {
                best_ms(&mut || {
                    Tensor::<4>::from_dispatch(conv2d_weight_gemm::<Dispatch>(
                        x.clone().into_dispatch(),
                        g.clone().into_dispatch(),
                        w.shape(),
                        &same,
                    ))
                    .into_data()
                })
            });
            let autodiff = device.clone().autodiff();
            let train =
                |conv: fn(Tensor<4>, Tensor<4>, Option<Tensor<1>>, ConvOptions<2>) -> Tensor<4>| {
                    let x = Tensor::<4>::from_data(x.to_data(), &autodiff).require_grad();
                    let w = Tensor::<4>::from_data(w.to_data(), &autodiff).require_grad();
                    let probe = Tensor::<4>::from_data(g.to_data(), &autodiff);
                    let same = same.clone();
                    move || {
                        let out = conv(x.clone(), w.clone(), None, same.clone());
                        let grads = (out * probe.clone()).sum().backward();
                        w.grad(&grads).expect("a weight gradient").into_data()
                    }
                };
            let burns = best_ms(&mut train(conv2d));
            let ours = best_ms(&mut train(gym_models::conv::conv2d));
            // The weight gradient as one product: [c_out, B·L] × [B·L, c_in·9].
            let lhs = Tensor::<2>::random([c_out, b * side * side], Distribution::Default, device);
            let rhs =
                Tensor::<2>::random([b * side * side, c_in * 9], Distribution::Default, device);
            let matmul = best_ms(&mut || lhs.clone().matmul(rhs.clone()).into_data());
            let gflop = 2.0 * (b * c_out * c_in * 9 * side * side) as f64 / 1e9;
            let cell = |ms: f64| format!("{ms:.1} ms ({:.0} GFLOP/s)", gflop / ms * 1e3);
            let _ = writeln!(
                table,
                "| {c_in}→{c_out}, {side}×{side} | {} | {} | {} | {} | {} | {burns:.1} ms | \
                 {ours:.1} ms |",
                cell(forward),
                cell(input_grad),
                cell(weight_grad),
                weight_gemm.map_or("-".into(), cell),
                cell(matmul)
            );
        }
    });
    table
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
