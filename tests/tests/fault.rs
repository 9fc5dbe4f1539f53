//! Bad input and failing nodes give typed errors, quickly, with nothing left blocked.
//! `cargo test -- fault` selects these.

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use gym_core::{
    GymError, ImageBatch, NodeData, NodeInfo, NonFinitePolicy, Result, StepContext, Strategy,
    StrategyConfig, TrainModel, Trainer, TrainerConfig,
};
use gym_models::{Mlp, MlpConfig};
use gym_strategies::AllReduceConfig;
use std::cell::Cell;
use std::time::{Duration, Instant};
use tests::{Synthetic, SyntheticBatcher};

thread_local!(static TRAIN_CALLS: Cell<usize> = const { Cell::new(0) });

/// An MLP that misbehaves on one rank at one step: it panics, or returns NaN.
#[derive(Module, Debug)]
struct Faulty {
    mlp: Mlp,
    rank: usize,
    step: usize,
    nan: bool,
    /// With `nan`: a finite loss whose gradient is NaN (`loss + √(loss − loss)`: d√x at 0
    /// is infinite, times 0).
    gradient_only: bool,
}

impl TrainModel for Faulty {
    type Batch = ImageBatch;

    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        let loss = self.mlp.loss(batch);
        if batch.images.is_autodiff() {
            // Training forward passes only; node threads are named `gym-node-<rank>`.
            let step = TRAIN_CALLS.with(|c| c.replace(c.get() + 1));
            let me = std::thread::current().name() == Some(&format!("gym-node-{}", self.rank));
            if me && step == self.step {
                if self.nan && self.gradient_only {
                    return loss.clone() + (loss.clone() - loss).sqrt();
                }
                if self.nan {
                    return loss.mul_scalar(f32::NAN);
                }
                panic!("injected failure");
            }
        }
        loss
    }
}

fn config(k: usize) -> TrainerConfig {
    TrainerConfig::new(k)
        .with_max_steps(Some(20))
        .with_batch_size(4)
        .with_val_size(Some(0))
}

fn data() -> NodeData<tests::Example> {
    NodeData::shared(Synthetic::new(256, 8, 3, 1), Synthetic::new(16, 8, 3, 2))
}

/// The error of a run of `k` nodes training `model` with `strategy`, which must fail.
fn failure(
    k: usize,
    model: impl Fn(&Device) -> Faulty + Sync,
    strategy: &dyn StrategyConfig,
) -> GymError {
    Trainer::new(config(k))
        .fit(model, strategy, &data(), &SyntheticBatcher)
        .err()
        .expect("the run fails")
}

fn faulty(rank: usize, step: usize, nan: bool) -> impl Fn(&Device) -> Faulty + Sync {
    move |d| Faulty {
        mlp: MlpConfig::new()
            .with_input(8)
            .with_hidden(8)
            .with_classes(3)
            .init(d),
        rank,
        step,
        nan,
        gradient_only: false,
    }
}

fn faulty_gradient(rank: usize, step: usize) -> impl Fn(&Device) -> Faulty + Sync {
    move |d| Faulty {
        gradient_only: true,
        ..faulty(rank, step, true)(d)
    }
}

#[test]
fn fault_panic_on_rank_2_at_step_7_of_8_nodes_names_them_within_seconds() {
    let start = Instant::now();
    let err = failure(8, faulty(2, 7, false), &AllReduceConfig::new());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    match &err {
        GymError::NodeFailed {
            rank: 2,
            step: 7,
            source,
        } => {
            assert!(
                matches!(**source, GymError::Panic(ref m) if m.contains("injected failure")),
                "{source}"
            )
        }
        other => panic!("expected rank 2 at step 7, got {other}"),
    }
    assert!(err.to_string().contains("node 2 failed at step 7"), "{err}");
}

#[test]
fn fault_nan_loss_is_a_typed_error_naming_rank_and_step() {
    let err = failure(4, faulty(1, 3, true), &AllReduceConfig::new());
    match err {
        GymError::NodeFailed {
            rank: 1,
            step: 3,
            source,
        } => {
            assert!(matches!(*source, GymError::NonFiniteLoss { loss } if loss.is_nan()))
        }
        other => panic!("expected a NaN loss on rank 1 at step 3, got {other}"),
    }
}

/// A user-written strategy whose step fails on rank 3 at step 5 (and otherwise waits for
/// the others).
struct Failing;

impl StrategyConfig for Failing {
    fn name(&self) -> String {
        "failing".into()
    }
    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        Ok(Box::new(FailingNode(node.rank)))
    }
}

struct FailingNode(usize);

impl Strategy for FailingNode {
    fn step(&mut self, _: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        if self.0 == 3 && ctx.step == 5 {
            return Err(GymError::Strategy("link down".into()));
        }
        Ok(ctx.collective.barrier()?)
    }
    fn lr(&self) -> f64 {
        0.0
    }
}

#[test]
fn fault_strategy_error_names_rank_and_step() {
    let err = failure(4, faulty(99, 0, false), &Failing);
    assert!(
        matches!(&err, GymError::NodeFailed { rank: 3, step: 5, source } if matches!(**source, GymError::Strategy(_))),
        "{err}"
    );
}

fn mlp(d: &Device) -> Mlp {
    MlpConfig::new()
        .with_input(8)
        .with_hidden(8)
        .with_classes(3)
        .init(d)
}

#[test]
fn fault_bad_configurations_and_data_are_typed_errors() {
    let fit = |config: TrainerConfig, data: NodeData<tests::Example>| {
        Trainer::new(config)
            .fit(mlp, &AllReduceConfig::new(), &data, &SyntheticBatcher)
            .err()
            .expect("rejected")
    };
    assert!(matches!(fit(config(0), data()), GymError::InvalidConfig(_)));
    let tiny = NodeData::shared(Synthetic::new(10, 8, 3, 1), Synthetic::new(16, 8, 3, 2));
    let err = fit(config(4), tiny);
    assert!(
        matches!(&err, GymError::Data(m) if m.contains("less than one batch")),
        "{err}"
    );
    let empty = NodeData::shared(Synthetic::new(0, 8, 3, 1), Synthetic::new(16, 8, 3, 2));
    assert!(matches!(fit(config(2), empty), GymError::Data(m) if m.contains("empty")));
    let no_val = NodeData::shared(Synthetic::new(64, 8, 3, 1), Synthetic::new(0, 8, 3, 2));
    assert!(matches!(fit(config(2), no_val), GymError::Data(m) if m.contains("validation")));
    let unwritable = config(2).with_log_dir(Some("/proc/no-such-dir".into()));
    assert!(matches!(fit(unwritable, data()), GymError::Io { .. }));
}

#[test]
fn fault_a_bad_learning_rate_is_refused_before_any_node_starts() {
    let log_dir = std::env::temp_dir().join(format!("gym-nan-lr-{}", std::process::id()));
    let config = config(4)
        .with_log_dir(Some(log_dir.to_string_lossy().into_owned()))
        .with_run_name(Some("nan".into()));
    for lr in [f64::NAN, -1e-3, 0.0, f64::INFINITY] {
        let strategy =
            AllReduceConfig::new().with_inner(gym_core::InnerOptimizerConfig::new().with_lr(lr));
        let err = Trainer::new(config.clone())
            .fit(mlp, &strategy, &data(), &SyntheticBatcher)
            .err()
            .expect("rejected");
        // A configuration error naming the field, not a node failure at step 0.
        assert!(
            matches!(&err, GymError::InvalidConfig(m) if m.contains("`lr`")),
            "lr {lr}: {err}"
        );
    }
    assert!(
        !log_dir.exists(),
        "no run folder is created for a refused run"
    );
}

#[test]
fn nonfinite_gradient_with_a_finite_loss_stops_the_run_naming_rank_and_step() {
    let err = failure(4, faulty_gradient(2, 5), &AllReduceConfig::new());
    match err {
        GymError::NodeFailed {
            rank: 2,
            step: 5,
            source,
        } => assert!(
            matches!(*source, GymError::NonFiniteGradient { sum } if sum.is_nan()),
            "{source}"
        ),
        other => panic!("expected a NaN gradient on rank 2 at step 5, got {other}"),
    }
}

#[test]
fn nonfinite_skip_skips_the_step_on_every_node_and_goes_on() {
    for (model, what) in [
        (
            Box::new(faulty(1, 3, true)) as Box<dyn Fn(&Device) -> Faulty + Sync>,
            "loss",
        ),
        (Box::new(faulty_gradient(1, 3)), "gradient"),
    ] {
        let out = Trainer::new(config(4).with_on_nonfinite(NonFinitePolicy::Skip))
            .fit(&*model, &AllReduceConfig::new(), &data(), &SyntheticBatcher)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(out.report.steps, 20, "{what}");
        let params = tests::flat_params(&out.model.mlp);
        assert!(
            params.iter().all(|p| p.is_finite()),
            "{what}: parameters stay finite"
        );
        // AllReduce would have spread node 1's NaN gradient to every node: skipped, the
        // step leaves every replica as it was, and it is counted.
        assert_eq!(out.report.skipped_steps(), [3], "{what}");
        // Every node skipped it together: the all-reduce of step 3 never ran.
        assert_eq!(out.report.comm[0].all_reduce_calls, 19, "{what}");
    }
}
