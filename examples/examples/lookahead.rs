//! A strategy of one's own, written against the public API only: DiLoCo with a Lookahead
//! outer step. Every H steps the replicas are averaged, a slow copy φ moves toward the
//! average, `φ ← φ + α(mean − φ)`, and every replica restarts from φ. Trained here on the
//! MNIST MLP over 4 nodes. The book's "Writing your own strategy" includes this file.
//!
//! `cargo run --release -p examples --example lookahead -- ../shared/data/mnist`

use gym_core::TrainerConfig;
use gym_core::{InnerOptimizerConfig, NodeData, ReduceOp, StrategyConfig, Trainer};
use gym_data::{MnistBatcher, MnistDataset, MnistSplit};
use gym_models::MlpConfig;
use gym_strategies::{CommunicateOptimizeConfig, round_fn};

// ANCHOR: strategy
/// AdamW at `lr` on each node; at the end of every round of `h` steps, the slow weights φ
/// (starting where the replicas start) move toward the replicas' mean by `alpha`, and every
/// replica restarts from φ.
fn lookahead(h: usize, alpha: f64, lr: f64) -> CommunicateOptimizeConfig {
    let inner = InnerOptimizerConfig::new().with_lr(lr);
    let outer = round_fn(
        "lookahead",
        h,
        |node| node.initial_params.clone(),
        move |slow, ctx| {
            let mean = ctx
                .collective
                .all_reduce(ctx.replica.params(), ReduceOp::Mean)?;
            *slow = slow.clone() + (mean - slow.clone()).mul_scalar(alpha);
            ctx.replica.set_params(slow.clone());
            Ok(())
        },
    );
    CommunicateOptimizeConfig::new("lookahead-diloco", inner).with_module(outer)
}
// ANCHOR_END: strategy

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir: std::path::PathBuf = std::env::args()
        .nth(1)
        .unwrap_or("../shared/data/mnist".into())
        .into();
    let data = NodeData::shared(
        MnistDataset::load(&dir, MnistSplit::Train)?,
        MnistDataset::load(&dir, MnistSplit::Test)?,
    );
    let strategy = lookahead(20, 0.5, 1e-3);
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(400))
        .with_batch_size(64);
    let mlp = |device: &burn::tensor::Device| MlpConfig::new().init(device);
    let out = Trainer::new(config).fit(mlp, &strategy, &data, &MnistBatcher)?;
    // The final evaluation scores the average of the replicas; at step 400 (a multiple of
    // H) every replica is φ, so it scores φ.
    let last = out
        .report
        .final_validation()
        .expect("fit ends with an evaluation");
    println!(
        "{}: val loss {:.4}, accuracy {:.1}%",
        strategy.name(),
        last.global_loss,
        100.0 * last.global_accuracy.unwrap_or(f64::NAN)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gym_core::OptimizerConfig;
    use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};

    /// Lookahead across nodes is DiLoCo whose outer step is plain SGD at lr α:
    /// `φ − α(φ − mean) = φ + α(mean − φ)`. The two train the same curve on 4 nodes.
    #[test]
    fn lookahead_trains_as_diloco_with_a_plain_sgd_outer_step() {
        let dir = ::tests::shared_data("mnist");
        let data = NodeData::shared(
            MnistDataset::load(&dir, MnistSplit::Train).unwrap(),
            MnistDataset::load(&dir, MnistSplit::Test).unwrap(),
        );
        let config = TrainerConfig::new(4)
            .with_max_steps(Some(20))
            .with_batch_size(16)
            .with_val_size(Some(64))
            .with_val_interval(10);
        let mlp = |device: &burn::tensor::Device| MlpConfig::new().init(device);
        let fit = |strategy: &dyn StrategyConfig| {
            Trainer::new(config.clone())
                .fit(mlp, strategy, &data, &MnistBatcher)
                .unwrap()
                .report
        };
        let ours = fit(&lookahead(5, 0.5, 1e-3));
        let diloco = DiLoCoConfig::new()
            .with_inner(InnerOptimizerConfig::new().with_lr(1e-3))
            .with_communicator(
                DiLoCoCommunicatorConfig::new()
                    .with_sync_interval(5)
                    .with_outer_lr(0.5)
                    .with_outer_optimizer(OptimizerConfig::sgd()),
            );
        let reference = fit(&diloco);
        assert_eq!(ours.train.len(), 20);
        for (a, b) in ours.train.iter().zip(&reference.train) {
            let (x, y) = (a.train_loss, b.train_loss);
            assert!(
                (x - y).abs() <= 1e-5 * y.abs(),
                "step {}: {x} against {y}",
                a.step
            );
        }
        let (x, y) = (
            ours.final_validation().unwrap().global_loss,
            reference.final_validation().unwrap().global_loss,
        );
        assert!((x - y).abs() <= 1e-5 * y.abs(), "{x} against {y}");
        // Not vacuous: the outer step moved the replicas (α = 1 would be plain averaging).
        let plain = fit(&lookahead(5, 1.0, 1e-3));
        let z = plain.final_validation().unwrap().global_loss;
        assert!(
            (x - z).abs() > 1e-4 * z.abs(),
            "{x} against plain averaging's {z}"
        );
    }
}
