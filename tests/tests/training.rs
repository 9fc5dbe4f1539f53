//! End-to-end runs: reproducibility from the seed, learning on real MNIST, and the logs.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use gym_core::Dropout;
use gym_core::{GymError, ImageBatch, NodeData, ParamLayout, TrainModel, Trainer, TrainerConfig};
use gym_data::{MnistBatcher, MnistDataset, MnistSplit};
use gym_models::{MlpConfig, cross_entropy};
use gym_strategies::AllReduceConfig;
use tests::{Synthetic, SyntheticBatcher, shared_data};

/// A small network with dropout, so every node draws random masks during training.
#[derive(Module, Debug)]
struct DropoutNet {
    fc1: Linear,
    dropout: Dropout,
    fc2: Linear,
}

impl TrainModel for DropoutNet {
    type Batch = ImageBatch;
    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        let x = relu(self.fc1.forward(batch.images.clone().flatten::<2>(1, 3)));
        cross_entropy(
            self.fc2.forward(self.dropout.forward(x)),
            batch.targets.clone(),
        )
    }
}

fn run(seed: u64) -> (Vec<u32>, Vec<f64>) {
    let data = NodeData::shared(Synthetic::new(512, 16, 4, 3), Synthetic::new(64, 16, 4, 4));
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(15))
        .with_batch_size(8)
        .with_val_size(Some(16))
        .with_val_interval(5)
        .with_seed(seed);
    let init = |d: &Device| DropoutNet {
        fc1: LinearConfig::new(16, 32).init(d),
        dropout: Dropout::new(0.5),
        fc2: LinearConfig::new(32, 4).init(d),
    };
    let out = Trainer::new(config)
        .fit(init, &AllReduceConfig::new(), &data, &SyntheticBatcher)
        .unwrap();
    let flat: Vec<f32> = ParamLayout::trainable(&out.model)
        .flatten(&out.model)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let losses = out.report.train.iter().map(|r| r.train_loss).collect();
    (flat.iter().map(|x| x.to_bits()).collect(), losses)
}

#[test]
fn the_same_seed_gives_the_same_bits_whatever_the_thread_timing() {
    let first = run(11);
    for _ in 0..3 {
        assert_eq!(run(11), first);
    }
    assert_ne!(run(12).1, first.1, "another seed trains differently");
}

/// A linear classifier behind Burn's own dropout, which draws from the backend's
/// process-wide generator.
#[derive(Module, Debug)]
struct BurnDropoutNet {
    dropout: burn::nn::Dropout,
    fc: Linear,
}

impl TrainModel for BurnDropoutNet {
    type Batch = ImageBatch;
    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        let x = self
            .dropout
            .forward(batch.images.clone().flatten::<2>(1, 3));
        cross_entropy(self.fc.forward(x), batch.targets.clone())
    }
}

/// Burn's `Dropout` cannot be reproducible inside `fit` (the nodes share the backend's
/// generator, so its masks follow thread timing): `fit` finds it before any node starts and
/// says what to use. Without randomness (p = 0) the same network runs.
#[test]
fn burn_dropout_is_refused_with_the_layer_to_use_instead() {
    let fit = |prob: f64| {
        let data = NodeData::shared(Synthetic::new(128, 16, 4, 3), Synthetic::new(16, 16, 4, 4));
        let config = TrainerConfig::new(2)
            .with_max_steps(Some(2))
            .with_batch_size(8);
        let init = move |d: &Device| BurnDropoutNet {
            dropout: burn::nn::DropoutConfig::new(prob).init(),
            fc: LinearConfig::new(16, 4).init(d),
        };
        Trainer::new(config).fit(init, &AllReduceConfig::new(), &data, &SyntheticBatcher)
    };
    match fit(0.5) {
        Err(e @ GymError::SharedRandomness) => {
            assert!(e.to_string().contains("gym_core::Dropout"), "{e}")
        }
        Err(e) => panic!("expected SharedRandomness, got {e}"),
        Ok(_) => panic!("Burn's dropout was accepted"),
    }
    assert!(fit(0.0).is_ok());
}

#[test]
fn mnist_mlp_on_four_nodes_learns_and_writes_its_logs() {
    let dir = shared_data("mnist");
    let data = NodeData::shared(
        MnistDataset::load(&dir, MnistSplit::Train).unwrap(),
        MnistDataset::load(&dir, MnistSplit::Test).unwrap(),
    );
    let log_dir = std::env::temp_dir().join(format!("gym-logs-{}", std::process::id()));
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(60))
        .with_batch_size(32)
        .with_val_size(Some(256))
        .with_val_interval(20)
        .with_run_name(Some("mlp-test".into()))
        .with_log_dir(Some(log_dir.to_string_lossy().into_owned()));
    let inner = gym_core::InnerOptimizerConfig::new().with_lr(1e-3);
    let strategy = AllReduceConfig::new().with_inner(inner);
    let out = Trainer::new(config)
        .fit(
            |d| MlpConfig::new().init(d),
            &strategy,
            &data,
            &MnistBatcher,
        )
        .unwrap();
    let report = &out.report;
    let last = report.final_validation().unwrap();
    assert_eq!(last.step, 60);
    assert_eq!(
        last.examples, 10_000,
        "the final evaluation covers the whole test set"
    );
    assert!(last.global_accuracy.unwrap() > 0.85, "{last:?}");
    // Evaluations at 0, 20, 40 and the end; loss fell.
    let steps: Vec<usize> = report.validation.iter().map(|v| v.step).collect();
    assert_eq!(steps, vec![0, 20, 40, 60]);
    assert!(report.validation[0].global_loss > 2.0 * last.global_loss);
    // AllReduce: 60 all-reduces of the gradient, 2·3/4 of its bytes each.
    let n = ParamLayout::trainable(&out.model).num_elements() as u64;
    assert_eq!(report.comm[0].bytes_sent, 60 * (2 * 3 * 4 * n / 4));

    let run_dir = log_dir.join("mlp-test");
    let train_csv = std::fs::read_to_string(run_dir.join("train.csv")).unwrap();
    let mut lines = train_csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "step,examples_seen,train_loss,train_perplexity,lr,step_time_s,its_per_s,compute_s,strategy_s,bytes_sent,bytes_received,sim_time_s,sim_compute_s,sim_comm_s,sim_idle_s"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 60);
    assert!(
        rows[0].ends_with(",,,,"),
        "no simulated time without a network: {}",
        rows[0]
    );
    let val_csv = std::fs::read_to_string(run_dir.join("validation.csv")).unwrap();
    assert_eq!(val_csv.lines().count(), 1 + 4);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["strategy"]["name"], "allreduce");
    assert_eq!(config["trainer"]["num_nodes"], 4);
    std::fs::remove_dir_all(log_dir).ok();
}

#[test]
fn a_per_node_factory_is_called_once_per_node_and_split() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let data = NodeData::per_node(
        move |rank, num_nodes, split| -> gym_core::SharedDataset<tests::Example> {
            counter.fetch_add(1, Ordering::SeqCst);
            assert_eq!(num_nodes, 3);
            let seed = 10 * rank as u64 + u64::from(split == gym_core::Split::Validation);
            Arc::new(Synthetic::new(64, 16, 4, seed))
        },
    );
    let config = TrainerConfig::new(3)
        .with_max_steps(Some(5))
        .with_batch_size(8)
        .with_val_size(Some(16));
    let out = Trainer::new(config)
        .fit(
            |d: &Device| {
                MlpConfig::new()
                    .with_input(16)
                    .with_hidden(8)
                    .with_classes(4)
                    .init(d)
            },
            &AllReduceConfig::new(),
            &data,
            &SyntheticBatcher,
        )
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3 * 2);
    assert_eq!(out.report.train.len(), 5);
}

/// `TrainerConfig::new(4)` with a batch of 128 and nothing else set runs (the unset
/// validation size follows the batch size) and writes nothing.
#[test]
fn a_library_call_with_only_a_batch_size_runs_and_writes_nothing() {
    let data = NodeData::shared(Synthetic::new(1024, 16, 4, 3), Synthetic::new(64, 16, 4, 4));
    let config = TrainerConfig::new(4).with_batch_size(128);
    let before = std::fs::read_dir(".").unwrap().count();
    let out = Trainer::new(config)
        .fit(
            tests::small_mlp,
            &AllReduceConfig::new(),
            &data,
            &SyntheticBatcher,
        )
        .unwrap();
    // One epoch of 256 examples per node: two steps; evaluations at 0 and at the end.
    assert_eq!(out.report.steps, 2);
    assert_eq!(out.report.validation.len(), 2);
    assert_eq!(out.report.log_dir, None);
    assert_eq!(
        std::fs::read_dir(".").unwrap().count(),
        before,
        "no file written"
    );
}

/// Nodes computing right now, and the most at once, for [`CountingNet`].
static COMPUTING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static MOST_COMPUTING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A linear classifier whose loss counts how many nodes are inside it at once.
#[derive(Module, Debug)]
struct CountingNet {
    fc: Linear,
}

impl TrainModel for CountingNet {
    type Batch = ImageBatch;
    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = COMPUTING.fetch_add(1, SeqCst) + 1;
        MOST_COMPUTING.fetch_max(now, SeqCst);
        // Long enough that nodes free to run would overlap here.
        std::thread::sleep(std::time::Duration::from_millis(3));
        let loss = cross_entropy(
            self.fc.forward(batch.images.clone().flatten::<2>(1, 3)),
            batch.targets.clone(),
        );
        COMPUTING.fetch_sub(1, SeqCst);
        loss
    }
}

/// With `concurrent_nodes = 2`, six nodes never compute three at a time, yet two do (a
/// node waiting in the all-reduce hands its permit on, or the run would not finish).
#[test]
fn at_most_concurrent_nodes_compute_at_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let data = NodeData::shared(Synthetic::new(256, 16, 4, 3), Synthetic::new(64, 16, 4, 4));
    let config = TrainerConfig::new(6)
        .with_max_steps(Some(6))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_concurrent_nodes(Some(2));
    let init = |d: &Device| CountingNet {
        fc: LinearConfig::new(16, 4).init(d),
    };
    let out = Trainer::new(config)
        .fit(init, &AllReduceConfig::new(), &data, &SyntheticBatcher)
        .unwrap();
    assert_eq!(out.report.train.len(), 6);
    assert_eq!(MOST_COMPUTING.load(SeqCst), 2, "two permits, both used");
}
