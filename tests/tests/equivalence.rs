//! AllReduce on K nodes with batch b trains exactly as one node with batch K·b on the same
//! samples (PyTorch DDP's guarantee).

use burn::tensor::Device;
use gym_core::{
    FitOutput, InnerOptimizerConfig, NodeData, OptimizerConfig, ParamLayout, Trainer, TrainerConfig,
};
use gym_models::{Mlp, MlpConfig};
use gym_strategies::AllReduceConfig;
use tests::{Synthetic, SyntheticBatcher, relative_error};

const STEPS: usize = 20;
const BATCH: usize = 8;

fn train(num_nodes: usize, batch: usize, inner: &InnerOptimizerConfig) -> FitOutput<Mlp> {
    // Without shuffling, rank r reads items r, r+K, r+2K, …; so at step s the K nodes
    // together read items [s·K·b, (s+1)·K·b), exactly the one-node batch of step s.
    let data = NodeData::shared(
        Synthetic::new(STEPS * 4 * BATCH, 16, 4, 1),
        Synthetic::new(64, 16, 4, 2),
    );
    let config = TrainerConfig::new(num_nodes)
        .with_max_steps(Some(STEPS))
        .with_batch_size(batch)
        .with_shuffle(false)
        .with_val_size(Some(0))
        .with_seed(7);
    let strategy = AllReduceConfig::new().with_inner(inner.clone());
    Trainer::new(config)
        .fit(
            |d: &Device| {
                MlpConfig::new()
                    .with_input(16)
                    .with_hidden(32)
                    .with_classes(4)
                    .init(d)
            },
            &strategy,
            &data,
            &SyntheticBatcher,
        )
        .expect("training runs")
}

fn assert_equivalent(optimizer: OptimizerConfig, lr: f64) {
    let inner = InnerOptimizerConfig::new()
        .with_optimizer(optimizer)
        .with_lr(lr);
    let four = train(4, BATCH, &inner);
    let one = train(1, 4 * BATCH, &inner);
    let flat = |m: &Mlp| ParamLayout::trainable(m).flatten(m);
    let err = relative_error(flat(&four.model), flat(&one.model));
    assert!(err <= 1e-5, "relative error {err:e} with {inner:?}");
    // The mean over nodes of the per-node losses is the one-node loss, step by step, and
    // it fell: the comparison is not vacuous.
    for (a, b) in four.report.train.iter().zip(&one.report.train) {
        assert!(
            (a.train_loss - b.train_loss).abs() < 1e-5,
            "step {}: {} vs {}",
            a.step,
            a.train_loss,
            b.train_loss
        );
    }
    let losses = &one.report.train;
    assert!(
        losses[STEPS - 1].train_loss < 0.9 * losses[0].train_loss,
        "{losses:?}"
    );
}

#[test]
fn allreduce_k4_equals_one_node_with_four_times_the_batch_sgd() {
    assert_equivalent(OptimizerConfig::sgd_momentum(0.9, false), 0.1);
}

#[test]
fn allreduce_k4_equals_one_node_with_four_times_the_batch_adamw() {
    assert_equivalent(OptimizerConfig::adamw(), 1e-2);
}
