//! What a strategy comparison relies on: every strategy starts from the same parameters
//! and reads the same samples in the same order (observed directly, and summarised by the
//! report's fingerprints), and the replica-correlation metric.

use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use gym_core::{
    ImageBatch, NodeData, ParamLayout, RunReport, StrategyConfig, TrainModel, Trainer,
    TrainerConfig,
};
use gym_models::cross_entropy;
use gym_strategies::{
    AllReduceConfig, DeMoConfig, DiLoCoCommunicatorConfig, DiLoCoConfig, FedAvgConfig,
};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tests::{Example, Synthetic, SyntheticBatcher};

#[derive(Module, Debug)]
struct Net {
    fc1: Linear,
    fc2: Linear,
}

impl TrainModel for Net {
    type Batch = ImageBatch;
    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        // The first forward pass of each node sees its initial parameters.
        record_first_params(self);
        let x = relu(self.fc1.forward(batch.images.clone().flatten::<2>(1, 3)));
        cross_entropy(self.fc2.forward(x), batch.targets.clone())
    }
}

fn init(d: &Device) -> Net {
    Net {
        fc1: LinearConfig::new(16, 32).init(d),
        fc2: LinearConfig::new(32, 4).init(d),
    }
}

/// What the nodes of the current run were observed doing, by node thread.
#[derive(Default)]
struct Observed {
    first_params: BTreeMap<String, Vec<u32>>,
    samples: BTreeMap<String, Vec<u64>>,
}

/// Runs are serialised (one observation at a time).
static OBSERVED: Mutex<Option<Observed>> = Mutex::new(None);
static ONE_RUN: Mutex<()> = Mutex::new(());

/// The node threads are named `gym-node-<rank>`. (`fit` also runs one forward pass of a
/// fresh model on the calling thread, to check that the model draws no shared randomness:
/// that one is not a node's.)
fn node() -> Option<String> {
    std::thread::current()
        .name()
        .filter(|n| n.starts_with("gym-node-"))
        .map(String::from)
}

fn record_first_params(net: &Net) {
    let Some(node) = node() else { return };
    let mut guard = OBSERVED.lock().unwrap();
    let obs = guard.as_mut().expect("inside a run");
    obs.first_params.entry(node).or_insert_with(|| {
        ParamLayout::all_float(net)
            .flatten(net)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    });
}

/// The synthetic batcher, noting which examples each node reads (by a hash of features).
struct RecordingBatcher;

impl Batcher<Example, ImageBatch> for RecordingBatcher {
    fn batch(&self, items: Vec<Example>, device: &Device) -> ImageBatch {
        let ids: Vec<u64> = items
            .iter()
            .map(|e| {
                e.features
                    .iter()
                    .fold(0u64, |h, x| h.rotate_left(7) ^ u64::from(x.to_bits()))
            })
            .collect();
        let batch = SyntheticBatcher.batch(items, device);
        // Training batches go to the autodiff device; evaluation batches do not.
        if let (true, Some(node)) = (batch.images.is_autodiff(), node()) {
            let mut guard = OBSERVED.lock().unwrap();
            let obs = guard.as_mut().expect("inside a run");
            obs.samples.entry(node).or_default().extend(ids);
        }
        batch
    }
}

fn config(seed: u64) -> TrainerConfig {
    TrainerConfig::new(3)
        .with_max_steps(Some(6))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_seed(seed)
}

fn observe(strategy: &dyn StrategyConfig, config: TrainerConfig) -> (RunReport, Observed) {
    let _one = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    *OBSERVED.lock().unwrap() = Some(Observed::default());
    let data = NodeData::shared(Synthetic::new(240, 16, 4, 3), Synthetic::new(24, 16, 4, 4));
    let out = Trainer::new(config)
        .fit(init, strategy, &data, &RecordingBatcher)
        .unwrap();
    let obs = OBSERVED.lock().unwrap().take().unwrap();
    (out.report, obs)
}

#[test]
fn every_strategy_starts_from_the_same_parameters_and_reads_the_same_samples() {
    let diloco = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(2));
    let runs = [
        observe(&AllReduceConfig::new(), config(7)),
        observe(&diloco, config(7)),
        observe(&FedAvgConfig::new(), config(7)),
        observe(&DeMoConfig::new(), config(7)),
    ];
    let (first_report, first) = &runs[0];
    assert_eq!(first.first_params.len(), 3, "one entry per node");
    assert_eq!(first.samples.len(), 3);
    let nodes: Vec<&Vec<u32>> = first.first_params.values().collect();
    assert!(
        nodes.windows(2).all(|w| w[0] == w[1]),
        "replicas start equal"
    );
    for (report, obs) in &runs[1..] {
        assert_eq!(
            obs.first_params, first.first_params,
            "same initial parameters"
        );
        assert_eq!(obs.samples, first.samples, "same samples in the same order");
        assert_eq!(report.init_fingerprint, first_report.init_fingerprint);
        assert_eq!(report.data_fingerprint, first_report.data_fingerprint);
    }
    for samples in first.samples.values() {
        assert_eq!(samples.len(), 6 * 8, "every step's batch was seen");
    }
    // Another seed: other parameters, other order, and the fingerprints tell.
    let (report, obs) = observe(&AllReduceConfig::new(), config(8));
    assert_ne!(obs.first_params, first.first_params);
    assert_ne!(obs.samples, first.samples);
    assert_ne!(report.init_fingerprint, first_report.init_fingerprint);
    assert_ne!(report.data_fingerprint, first_report.data_fingerprint);
}

fn correlations(strategy: &dyn StrategyConfig, dir: &std::path::Path) -> Vec<(usize, f64)> {
    let config = config(3)
        .with_max_steps(Some(9))
        .with_correlation_interval(Some(1))
        .with_log_dir(Some(dir.to_string_lossy().into_owned()))
        .with_run_name(Some("run".into()));
    let data = NodeData::shared(Synthetic::new(240, 16, 4, 3), Synthetic::new(24, 16, 4, 4));
    let out = Trainer::new(config)
        .fit(init_quiet, strategy, &data, &SyntheticBatcher)
        .unwrap();
    let records: Vec<(usize, f64)> = out
        .report
        .correlation
        .iter()
        .map(|r| (r.step, r.correlation))
        .collect();
    // The same values are in the run's correlation.csv.
    let csv = std::fs::read_to_string(dir.join("run/correlation.csv")).unwrap();
    let from_csv: Vec<(usize, f64)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    assert_eq!(from_csv, records);
    records
}

/// [`Net`] without the observation hook.
#[derive(Module, Debug)]
struct QuietNet {
    fc1: Linear,
    fc2: Linear,
}

impl TrainModel for QuietNet {
    type Batch = ImageBatch;
    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        let x = relu(self.fc1.forward(batch.images.clone().flatten::<2>(1, 3)));
        cross_entropy(self.fc2.forward(x), batch.targets.clone())
    }
}

fn init_quiet(d: &Device) -> QuietNet {
    QuietNet {
        fc1: LinearConfig::new(16, 32).init(d),
        fc2: LinearConfig::new(32, 4).init(d),
    }
}

#[test]
fn correlation_is_one_for_allreduce_and_returns_to_one_at_each_diloco_sync() {
    let tmp = std::env::temp_dir().join(format!("gym-correlation-{}", std::process::id()));
    let all_reduce = correlations(&AllReduceConfig::new(), &tmp.join("allreduce"));
    assert_eq!(
        all_reduce.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=9).collect::<Vec<_>>(),
        "measured after every step"
    );
    assert!(
        all_reduce.iter().all(|&(_, c)| c == 1.0),
        "AllReduce keeps the replicas identical: {all_reduce:?}"
    );

    let diloco = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(3));
    let diloco = correlations(&diloco, &tmp.join("diloco"));
    for &(step, c) in &diloco {
        if step % 3 == 0 {
            assert_eq!(c, 1.0, "replicas equal after the sync at step {step}");
        } else {
            assert!(c < 1.0, "replicas drift between syncs: step {step}: {c}");
            assert!(c > 0.5, "but stay close: step {step}: {c}");
        }
    }
    // Drifting lower within a round, back to one at its end.
    assert!(diloco[1].1 < diloco[0].1, "{diloco:?}");
    assert!(diloco[2].1 > diloco[1].1, "{diloco:?}");
    std::fs::remove_dir_all(&tmp).ok();
}
