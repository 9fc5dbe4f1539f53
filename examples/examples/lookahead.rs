//! A strategy of one's own, written against the public API only: DiLoCo with a Lookahead
//! outer step. Every H steps the replicas are averaged, a slow copy φ moves toward the
//! average, `φ ← φ + α(mean − φ)`, and every replica restarts from φ. Trained here on the
//! MNIST MLP over 4 nodes. The book's "Writing your own strategy" includes this file.
//!
//! `cargo run --release -p examples --example lookahead -- ../shared/data/mnist`

use burn::tensor::Tensor;
use gym_core::{InnerOptimizer, InnerOptimizerConfig, NodeData, NodeInfo, ReduceOp, Replica};
use gym_core::{StepContext, Strategy, StrategyConfig, Trainer, TrainerConfig};
use gym_data::{MnistBatcher, MnistDataset, MnistSplit};
use gym_models::MlpConfig;

// ANCHOR: strategy
/// The settings: synchronise every `h` steps, move the slow weights by `alpha`.
struct Lookahead {
    h: usize,
    alpha: f64,
    inner: InnerOptimizerConfig,
}

/// What each node keeps: its optimizer, the settings, and the slow weights φ.
struct LookaheadNode {
    optim: InnerOptimizer,
    h: usize,
    alpha: f64,
    slow: Option<Tensor<1>>,
}

impl StrategyConfig for Lookahead {
    fn name(&self) -> String {
        "lookahead-diloco".into()
    }

    fn init(&self, node: &NodeInfo<'_>) -> gym_core::Result<Box<dyn Strategy>> {
        let optim = self.inner.init(node.layout, node.max_steps)?;
        let (h, alpha) = (self.h, self.alpha);
        Ok(Box::new(LookaheadNode {
            optim,
            h,
            alpha,
            slow: None,
        }))
    }
}

impl Strategy for LookaheadNode {
    fn step(
        &mut self,
        replica: &mut dyn Replica,
        grads: Tensor<1>,
        ctx: &mut StepContext<'_>,
    ) -> gym_core::Result<()> {
        // φ starts as the replica did (the same on every node: one seed).
        let slow = self.slow.get_or_insert_with(|| replica.params());
        self.optim.step(replica, grads);
        if ctx.ends_round(self.h) {
            let mean = ctx
                .collective
                .all_reduce(replica.params(), ReduceOp::Mean)?;
            *slow = slow.clone() + (mean - slow.clone()).mul_scalar(self.alpha);
            replica.set_params(slow.clone());
        }
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }
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
    let strategy = Lookahead {
        h: 20,
        alpha: 0.5,
        inner: InnerOptimizerConfig::new().with_lr(1e-3),
    };
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
