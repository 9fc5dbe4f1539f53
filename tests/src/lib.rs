//! Helpers shared by the workspace integration tests: a synthetic classification task, a
//! small model trained on it, and the location of the shared data sets.

#![warn(missing_docs)]

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, DatasetError};
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use gym_core::{
    FitOutput, ImageBatch, NodeData, NodeInfo, ParamLayout, Strategy, StrategyConfig, Trainer,
    TrainerConfig,
};
use gym_models::{Mlp, MlpConfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use same_run::{assert_same_end, assert_same_run, deterministic};

pub mod same_run;
pub mod trace_file;
pub mod twin;
pub mod twin_strategies;

/// `<repo>/../shared/data/<name>`, or `$GYM_DATA_DIR/<name>`. Panics with a clear message
/// when the folder is missing: these tests must not pass silently without their data.
pub fn shared_data(name: &str) -> PathBuf {
    let root = std::env::var_os("GYM_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    let dir = root.join(name);
    assert!(
        dir.is_dir(),
        "data folder {} not found: set GYM_DATA_DIR to the folder holding `{name}/`",
        dir.display()
    );
    dir
}

/// An empty scratch folder for one test of a suite: `gym-{suite}-{name}-{pid}` in the
/// system's temporary folder, removed first if a previous run left it (not created).
pub fn scratch_dir(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-{suite}-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// Panics with what the command printed on stderr unless it exited successfully.
pub fn assert_succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The flags that point an example binary at the shared MNIST files ([`shared_data`]) and
/// log its runs into `logs`.
pub fn mnist_and_logs(logs: &Path) -> [std::ffi::OsString; 4] {
    [
        "--data-dir".into(),
        shared_data("mnist").into(),
        "--log-dir".into(),
        logs.into(),
    ]
}

/// One synthetic example: `features` and a class from a fixed linear rule.
#[derive(Debug, Clone)]
pub struct Example {
    /// Inputs.
    pub features: Vec<f32>,
    /// Class in `0..classes`.
    pub label: usize,
}

/// A deterministic, learnable classification task: inputs from a hash of the index, class =
/// arg-max of a fixed linear map.
#[derive(Debug, Clone)]
pub struct Synthetic {
    items: Vec<Example>,
}

impl Synthetic {
    /// `len` examples of `features` inputs and `classes` classes.
    pub fn new(len: usize, features: usize, classes: usize, seed: u64) -> Self {
        let value = |i: u64| {
            let x = gym_core::rng::derive_seed(seed, &[i]);
            (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        let items = (0..len)
            .map(|i| {
                let f: Vec<f32> = (0..features)
                    .map(|j| value((i * features + j) as u64))
                    .collect();
                let label = (0..classes)
                    .max_by(|&a, &b| {
                        let s = |c: usize| -> f32 {
                            f.iter()
                                .enumerate()
                                .map(|(j, x)| x * (((c * 7 + j * 3) % 5) as f32 - 2.0))
                                .sum()
                        };
                        s(a).total_cmp(&s(b))
                    })
                    .unwrap_or(0);
                Example { features: f, label }
            })
            .collect();
        Synthetic { items }
    }
}

impl Dataset<Example> for Synthetic {
    fn get(&self, index: usize) -> Result<Example, DatasetError> {
        self.items.get(index).cloned().ok_or_else(|| {
            DatasetError::new(std::io::Error::other(format!("index {index} out of range")))
        })
    }

    fn len(&self) -> usize {
        self.items.len()
    }
}

/// Batches [`Example`]s as `[batch, 1, 1, features]` images.
#[derive(Debug, Clone, Copy)]
pub struct SyntheticBatcher;

impl Batcher<Example, ImageBatch> for SyntheticBatcher {
    fn batch(&self, items: Vec<Example>, device: &Device) -> ImageBatch {
        let n = items.len();
        let f = items.first().map_or(0, |e| e.features.len());
        let x: Vec<f32> = items
            .iter()
            .flat_map(|e| e.features.iter().copied())
            .collect();
        let y: Vec<i64> = items.iter().map(|e| e.label as i64).collect();
        ImageBatch {
            images: Tensor::from_data(TensorData::new(x, [n, 1, 1, f]), device),
            targets: Tensor::<1, Int>::from_data(TensorData::new(y, [n]), device),
        }
    }
}

/// Largest absolute difference between two flat tensors, relative to the largest |b|.
pub fn relative_error(a: Tensor<1>, b: Tensor<1>) -> f64 {
    let a: Vec<f32> = a.into_data().try_to_vec::<f32>().expect("f32 data");
    let b: Vec<f32> = b.into_data().try_to_vec::<f32>().expect("f32 data");
    assert_eq!(a.len(), b.len());
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let scale = b
        .iter()
        .map(|y| y.abs())
        .fold(0.0f32, f32::max)
        .max(f32::MIN_POSITIVE);
    (diff / scale) as f64
}

/// A 16-32-4 MLP: the model of the synthetic task ([`Synthetic::new`]`(_, 16, 4, _)`).
/// Built and its initial values drawn under [`gym_core::rng::lock_backend_rng`], so that a
/// test building one while another test's `fit` runs cannot disturb that fit's randomness
/// checks.
pub fn small_mlp(device: &Device) -> Mlp {
    let _guard = gym_core::rng::lock_backend_rng();
    let model = MlpConfig::new()
        .with_input(16)
        .with_hidden(32)
        .with_classes(4)
        .init(device);
    gym_core::rng::materialize(&model);
    model
}

/// The synthetic task [`small_mlp`] trains on: 1,024 training examples of 16 features in 4
/// classes, and 64 validation examples drawn apart.
pub fn small_mlp_data() -> NodeData<Example> {
    NodeData::shared(Synthetic::new(1024, 16, 4, 1), Synthetic::new(64, 16, 4, 2))
}

/// Trains [`small_mlp`] with `strategy` on `k` nodes for `steps` steps of `batch` examples
/// per node (1,024 synthetic training examples, no intermediate evaluation).
pub fn fit_small_mlp(
    k: usize,
    steps: usize,
    batch: usize,
    seed: u64,
    strategy: &dyn StrategyConfig,
) -> FitOutput<Mlp> {
    let data = small_mlp_data();
    let config = TrainerConfig::new(k)
        .with_max_steps(Some(steps))
        .with_batch_size(batch)
        .with_val_size(Some(0))
        .with_seed(seed);
    Trainer::new(config)
        .fit(small_mlp, strategy, &data, &SyntheticBatcher)
        .expect("trains")
}

/// Builds rank 0's strategy of a `world_size`-node run of `max_steps` steps on `layout`
/// (parameters at 0, equal speeds, no faults), as [`Trainer::fit`] does before any step:
/// what a test of the settings a strategy refuses needs.
pub fn init_rank0(
    config: &dyn StrategyConfig,
    layout: &ParamLayout,
    world_size: usize,
    max_steps: usize,
) -> gym_core::Result<Box<dyn Strategy>> {
    let device = Device::default().autodiff();
    let speeds = vec![1.0; world_size];
    config.init(&NodeInfo {
        rank: 0,
        world_size,
        max_steps,
        seed: 1,
        device: &device,
        layout,
        initial_params: Tensor::zeros([layout.num_elements()], &device.clone().inner()),
        node_speeds: &speeds,
        faults: false,
    })
}

/// The trainable parameters of `model`, flat, on the host.
pub fn flat_params<M: Module>(model: &M) -> Vec<f32> {
    ParamLayout::trainable(model)
        .flatten(model)
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 parameters")
}

/// The largest element-wise difference of two equally long vectors.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vectors of different lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts that two runs trained the same: final models and masters within `tolerance`
/// element-wise, and the same traffic.
pub fn assert_same_training<M: Module>(a: &FitOutput<M>, b: &FitOutput<M>, tolerance: f32) {
    let d = max_abs_diff(&flat_params(&a.model), &flat_params(&b.model));
    assert!(d <= tolerance, "model: max |Δ| = {d:e}");
    match (&a.master, &b.master) {
        (Some(ma), Some(mb)) => {
            let d = max_abs_diff(&flat_params(ma), &flat_params(mb));
            assert!(d <= tolerance, "master: max |Δ| = {d:e}");
        }
        (None, None) => {}
        _ => panic!("only one run kept a master model"),
    }
    assert_eq!(a.report.comm, b.report.comm, "traffic");
}

/// Values of rank `rank` for collective tests: mixed magnitudes, so that the order of
/// additions shows in the bits.
pub fn rank_values(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = ((rank * 7919 + i * 104_729) % 1000) as f32 / 997.0;
            (x - 0.5) * 10f32.powi(((rank + i) % 7) as i32 - 3)
        })
        .collect()
}

/// A 1-D tensor of `values` on the default device.
pub fn vector(values: Vec<f32>) -> Tensor<1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), &Device::default())
}

/// A 1-D tensor's values on the host.
pub fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// The runs that must come out the same whether every node is a thread of one `fit` or
/// the nodes are spread over several processes (threads standing in for them, or an MPI
/// job): AllReduce, DiLoCo (H = 3, so the replicas differ at step 20) on a simulated
/// network, DeMo, and Streaming DiLoCo (H = 4, τ = 1) and eager DiLoCo (H = 3), whose
/// means are taken steps after they start, on a simulated network; by name.
pub fn spread_cases() -> Vec<(&'static str, Box<dyn StrategyConfig>, bool)> {
    use gym_strategies::{
        AllReduceConfig, DeMoConfig, DiLoCoCommunicatorConfig, DiLoCoConfig,
        EagerDiLoCoCommunicatorConfig, EagerDiLoCoConfig, StreamingDiLoCoConfig,
    };
    vec![
        ("allreduce", Box::new(AllReduceConfig::new()), false),
        (
            "diloco",
            Box::new(
                DiLoCoConfig::new()
                    .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(3)),
            ),
            true,
        ),
        ("demo", Box::new(DeMoConfig::new()), false),
        // Means taken steps after they were started: across processes, their data moves
        // while the nodes compute.
        (
            "streaming-diloco",
            Box::new(
                StreamingDiLoCoConfig::new()
                    .with_sync_interval(4)
                    .with_overlap(1),
            ),
            true,
        ),
        (
            "eager-diloco",
            Box::new(
                EagerDiLoCoConfig::new()
                    .with_communicator(EagerDiLoCoCommunicatorConfig::new().with_sync_interval(3)),
            ),
            true,
        ),
    ]
}

/// The configuration of [`spread_cases`]: `k` nodes, `steps` steps of
/// `batch` examples, an evaluation every 10 steps over `val` examples, and when
/// `simulated` a cluster on the `internet` link preset whose nodes' step times vary by
/// ±20% (so that they reach each collective at different times).
pub fn spread_config(
    k: usize,
    steps: usize,
    batch: usize,
    val: usize,
    simulated: bool,
) -> TrainerConfig {
    let network = gym_core::Network::switch(gym_core::Link::preset("internet").expect("preset"));
    TrainerConfig::new(k)
        .with_max_steps(Some(steps))
        .with_batch_size(batch)
        .with_val_size(Some(val))
        .with_val_interval(10)
        .with_seed(11)
        .with_simulation(
            simulated.then(|| gym_core::SimulationConfig::new(network).with_jitter(0.2)),
        )
}

/// Everything two runs must agree on, bit for bit, as JSON: the final model and master,
/// every node's traffic and simulated clock, the losses of every step and evaluation, and
/// the data and initialisation fingerprints. Timings (wall seconds) are left out.
pub fn run_digest<M: Module>(out: &FitOutput<M>) -> serde_json::Value {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    let r = &out.report;
    serde_json::json!({
        "model": bits(flat_params(&out.model)),
        "master": out.master.as_ref().map(|m| bits(flat_params(m))),
        "comm": r.comm,
        "simulated": r.simulated.iter().map(|t| [t.now_s, t.compute_s, t.comm_s, t.idle_s]
            .map(f64::to_bits)).collect::<Vec<_>>(),
        "train": r.train.iter().map(|t| (t.train_loss.to_bits(), t.examples_seen,
            t.bytes_sent, t.sim_time_s.map(f64::to_bits))).collect::<Vec<_>>(),
        "validation": r.validation.iter().map(|v| (v.step, v.local_loss.to_bits(),
            v.global_loss.to_bits(), v.examples, v.examples_seen,
            v.sim_time_s.map(f64::to_bits))).collect::<Vec<_>>(),
        "data_fingerprint": r.data_fingerprint,
        "init_fingerprint": r.init_fingerprint,
        "num_nodes": r.num_nodes,
    })
}

/// One process's share of a [`ThreadTransport`](gym_core::ThreadTransport): it runs the
/// ranks `local` and reaches the others through the shared transport, as a process of an
/// MPI job reaches the other processes. Threads standing in for processes, so that a run
/// spread over several processes is tested without MPI.
pub struct ProcessShare {
    /// The transport every share goes through.
    pub inner: std::sync::Arc<gym_core::ThreadTransport>,
    /// The ranks this share runs.
    pub local: std::ops::Range<usize>,
}

impl gym_core::Transport for ProcessShare {
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn local_ranks(&self) -> std::ops::Range<usize> {
        self.local.clone()
    }

    fn exchange(
        &self,
        rank: usize,
        group: &gym_core::Group,
        header: gym_core::comm::transport::Header,
        contribution: gym_core::comm::transport::Contribution,
    ) -> Result<gym_core::comm::transport::Exchanged, gym_core::CollectiveError> {
        self.inner.exchange(rank, group, header, contribution)
    }

    fn abort(&self, rank: usize, reason: String) {
        self.inner.abort(rank, reason);
    }

    fn abort_info(&self) -> Option<(usize, String)> {
        self.inner.abort_info()
    }

    fn leave(&self, rank: usize) {
        self.inner.leave(rank);
    }
}

/// A Python (`$EXOGYM_PYTHON`, else `python3`) that imports `modules` (`"safetensors,
/// numpy"`), if there is one: the tests that read the product's files with an independent
/// Python reader skip without it.
pub fn python_with(modules: &str) -> Option<String> {
    let candidates = std::env::var("EXOGYM_PYTHON")
        .into_iter()
        .chain(["python3".to_string()]);
    candidates.into_iter().find(|py| {
        std::process::Command::new(py)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The data rows of a run's `train.csv` (0 before it exists): the steps a running run has
/// logged, each flushed as it is written.
pub fn steps_logged(train_csv: &Path) -> usize {
    std::fs::read_to_string(train_csv).map_or(0, |t| t.lines().count().saturating_sub(1))
}

/// Waits until the run writing `train_csv` has logged `steps` steps: a known point inside
/// that run, whatever the machine's speed. Panics after 300 s.
pub fn wait_for_steps(train_csv: &Path, steps: usize) {
    let start = Instant::now();
    while steps_logged(train_csv) < steps {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{} never held {steps} steps",
            train_csv.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
