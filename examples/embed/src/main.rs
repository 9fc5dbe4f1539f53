//! Your own Burn project, trained by the simulator: your module, your data and batcher,
//! DiLoCo on 8 simulated nodes. Run it with
//! `cargo run --release --manifest-path examples/embed/Cargo.toml`.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Int, Tensor, TensorData};
use gym_core::{EvalMetrics, InnerOptimizerConfig, NodeData, TrainModel, Trainer, TrainerConfig};
use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};

/// Your model: any Burn module.
#[derive(Module, Debug)]
struct SpiralNet {
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

impl SpiralNet {
    fn new(device: &Device) -> Self {
        SpiralNet {
            fc1: LinearConfig::new(2, 64).init(device),
            fc2: LinearConfig::new(64, 64).init(device),
            fc3: LinearConfig::new(64, ARMS).init(device),
        }
    }

    fn forward(&self, xy: Tensor<2>) -> Tensor<2> {
        let x = relu(self.fc1.forward(xy));
        self.fc3.forward(relu(self.fc2.forward(x)))
    }
}

/// Your data: points on one of three interleaved spiral arms.
#[derive(Debug, Clone)]
struct Point {
    xy: [f32; 2],
    arm: usize,
}

const ARMS: usize = 3;

/// `n` noisy points, spread evenly over the arms, from `seed`.
fn spirals(n: usize, seed: u64) -> Vec<Point> {
    let mut state = seed;
    let mut uniform = move || {
        // SplitMix64: a few lines, no dependency.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f32 / (1u64 << 53) as f32
    };
    (0..n)
        .map(|i| {
            let arm = i % ARMS;
            let r = uniform();
            let angle = 3.5 * r + arm as f32 * std::f32::consts::TAU / ARMS as f32;
            let noise = 0.08 * (uniform() - 0.5);
            Point {
                xy: [(r + noise) * angle.cos(), (r + noise) * angle.sin()],
                arm,
            }
        })
        .collect()
}

/// A batch of points and their arms.
struct Points {
    xy: Tensor<2>,
    arm: Tensor<1, Int>,
}

/// Your batcher: items in, one batch out, on the device it is given.
#[derive(Debug, Clone)]
struct PointBatcher;

impl Batcher<Point, Points> for PointBatcher {
    fn batch(&self, items: Vec<Point>, device: &Device) -> Points {
        let n = items.len();
        let xy: Vec<f32> = items.iter().flat_map(|p| p.xy).collect();
        let arm: Vec<i64> = items.iter().map(|p| p.arm as i64).collect();
        Points {
            xy: Tensor::from_data(TensorData::new(xy, [n, 2]), device),
            arm: Tensor::from_data(TensorData::new(arm, [n]), device),
        }
    }
}

/// What the simulator asks of your model: a batch in, a scalar loss out (and, optionally,
/// richer evaluation metrics).
impl TrainModel for SpiralNet {
    type Batch = Points;

    fn loss(&self, batch: &Points) -> Tensor<1> {
        let logits = self.forward(batch.xy.clone());
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, batch.arm.clone())
    }

    fn evaluate(&self, batch: &Points) -> EvalMetrics {
        let logits = self.forward(batch.xy.clone());
        let n = batch.arm.dims()[0];
        let correct = logits
            .clone()
            .argmax(1)
            .flatten::<1>(0, 1)
            .equal(batch.arm.clone())
            .int()
            .sum()
            .into_scalar::<i64>();
        EvalMetrics {
            loss: self.loss(batch).into_scalar::<f64>(),
            accuracy: Some(correct as f64 / n as f64),
        }
    }
}

fn main() -> Result<(), gym_core::GymError> {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let data = NodeData::shared(
        InMemDataset::new(spirals(8192, 1)),
        InMemDataset::new(spirals(768, 2)),
    );
    let config = TrainerConfig::new(8)
        .with_max_steps(Some(300))
        .with_batch_size(32);
    let diloco = DiLoCoConfig::new()
        .with_inner(InnerOptimizerConfig::new().with_lr(3e-3))
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(25));
    let out = Trainer::new(config).fit(SpiralNet::new, &diloco, &data, &PointBatcher)?;

    let report = &out.report;
    let last = report
        .final_validation()
        .expect("fit ends with an evaluation");
    println!("val loss {:.4}", last.global_loss);
    println!(
        "val accuracy {:.1}%",
        100.0 * last.global_accuracy.unwrap_or(f64::NAN)
    );
    println!(
        "{} steps on {} nodes in {:.1} s, {:.2} MiB sent per node",
        report.steps,
        report.num_nodes,
        report.wall_s,
        report.bytes_sent_per_node() / (1 << 20) as f64
    );
    Ok(())
}
