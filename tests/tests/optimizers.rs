//! Burn's optimizers as every strategy's inner optimizer: per-parameter groups routed as
//! stated (checked against each optimizer applied to its parameters on its own), Muon for
//! the weight matrices under DiLoCo and Lion under AllReduce learning, and the settings
//! Burn would only refuse by panicking in a step refused before any node starts.

use burn::optim::{AdamWConfig, LionConfig, MuonConfig, Optimizer};
use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{
    FitOutput, GymError, InnerOptimizerConfig, ModelReplica, NodeData, OptimizerConfig,
    OptimizerGroup, ParamLayout, ParamSelection, Replica, StrategyConfig, Trainer, TrainerConfig,
};
use gym_models::Mlp;
use gym_strategies::{AllReduceConfig, DiLoCoCommunicatorConfig, DiLoCoConfig};
use tests::{Synthetic, SyntheticBatcher, fit_small_mlp, flat_params, small_mlp};

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Muon for the matrices at lr 0.05, AdamW (PyTorch's defaults) for the biases at lr 0.01.
fn muon_and_adamw() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new().with_lr(0.01).with_group(
        OptimizerGroup::new(ParamSelection::matrices(), MuonConfig::new().into())
            .with_lr(Some(0.05)),
    )
}

/// Two grouped steps on a replica equal Burn's Muon stepping each weight matrix on its own
/// at the group's lr and Burn's AdamW stepping each bias at the base lr, state included.
#[test]
fn a_grouped_step_routes_each_parameter_to_its_optimizer_and_lr() {
    let device = Device::default().autodiff();
    // Seeded: the same weights in every run, so that a failure reproduces.
    let model = gym_core::rng::init_seeded(&device, 0, small_mlp);
    let layout = ParamLayout::trainable(&model);
    let initial = values(layout.flatten(&model));
    let mut optimizer = muon_and_adamw().init(&layout, 10).unwrap();
    let mut replica = ModelReplica::new(model, layout.clone());
    let n = layout.num_elements();
    let grad = |step: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + step * 13) % 17) as f32 / 17.0 - 0.4)
            .collect()
    };
    let host = device.clone().inner();
    let flat = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [n]), &host);
    for step in 0..2 {
        optimizer.step(&mut replica, flat(grad(step)));
    }
    let got = values(replica.params());

    let muon = MuonConfig::new().build();
    let adamw = match OptimizerConfig::adamw() {
        OptimizerConfig::AdamW(c) => c.build(),
        _ => unreachable!(),
    };
    let mut matrices = 0;
    for e in layout.entries() {
        let slice = |v: &[f32]| v[e.offset..e.offset + e.numel].to_vec();
        let expected: Vec<f32> = if e.shape.len() == 2 {
            matrices += 1;
            let shape = [e.shape[0], e.shape[1]];
            let t = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, shape), &host);
            let (mut x, mut state) = (t(slice(&initial)), None);
            for step in 0..2 {
                (x, state) = muon.step(0.05, x, t(slice(&grad(step))), state);
            }
            values(x.reshape([e.numel]))
        } else {
            let t = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [e.numel]), &host);
            let (mut x, mut state) = (t(slice(&initial)), None);
            for step in 0..2 {
                (x, state) = adamw.step(0.01, x, t(slice(&grad(step))), state);
            }
            values(x)
        };
        let diff = slice(&got)
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff <= 1e-6, "{}: max |Δ| = {diff:e}", e.path);
        assert_ne!(expected, slice(&initial), "{} moved", e.path);
    }
    assert_eq!(matrices, 2, "fc1.weight and fc2.weight are Muon's");
}

fn fit(steps: usize, strategy: &dyn StrategyConfig) -> FitOutput<Mlp> {
    fit_small_mlp(4, steps, 16, 3, strategy)
}

/// The mean train loss of the first and of the last five steps; the learning tests below
/// ask it to fall at least threefold in 60 steps.
fn first_and_last(out: &FitOutput<Mlp>) -> (f64, f64) {
    let losses: Vec<f64> = out.report.train.iter().map(|r| r.train_loss).collect();
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    (mean(&losses[..5]), mean(&losses[losses.len() - 5..]))
}

#[test]
fn diloco_with_muon_for_the_matrices_and_adamw_for_the_rest_learns() {
    let diloco = |inner: InnerOptimizerConfig| {
        DiLoCoConfig::new()
            .with_inner(inner)
            .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(10))
    };
    let muon = fit(60, &diloco(muon_and_adamw()));
    let (first, last) = first_and_last(&muon);
    // Measured here: 1.368 → 0.263.
    assert!(last < first / 3.0, "loss {first:.3} → {last:.3}");
    // Muon did act: AdamW alone at the same lr trains other parameters.
    let adamw = fit(60, &diloco(InnerOptimizerConfig::new().with_lr(0.01)));
    assert_ne!(flat_params(&muon.model), flat_params(&adamw.model));
}

#[test]
fn allreduce_with_lion_learns() {
    let lion = AllReduceConfig::new().with_inner(
        InnerOptimizerConfig::new()
            .with_optimizer(LionConfig::new().into())
            .with_lr(1e-2),
    );
    let out = fit(60, &lion);
    let (first, last) = first_and_last(&out);
    // Measured here: 1.369 → 0.118.
    assert!(last < first / 3.0, "loss {first:.3} → {last:.3}");
}

fn refusal(inner: InnerOptimizerConfig) -> String {
    let data = NodeData::shared(Synthetic::new(64, 16, 4, 1), Synthetic::new(8, 16, 4, 2));
    let config = TrainerConfig::new(2)
        .with_max_steps(Some(1))
        .with_batch_size(4);
    match Trainer::new(config).fit(
        small_mlp,
        &AllReduceConfig::new().with_inner(inner),
        &data,
        &SyntheticBatcher,
    ) {
        Err(GymError::InvalidConfig(why)) => why,
        Err(e) => panic!("expected InvalidConfig, got {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn muon_on_a_vector_and_an_empty_group_are_refused_before_any_node_starts() {
    // Burn's Muon asserts 2-D tensors in its step; here the run is refused up front.
    let muon_everywhere = InnerOptimizerConfig::new().with_optimizer(MuonConfig::new().into());
    let why = refusal(muon_everywhere);
    assert!(why.contains("fc1.bias") && why.contains("Muon"), "{why}");
    let nothing = InnerOptimizerConfig::new().with_group(OptimizerGroup::new(
        ParamSelection::new().with_rank(Some(3)),
        AdamWConfig::new().into(),
    ));
    assert!(refusal(nothing).contains("groups[0]"));
}

/// A Burn `grad_clipping` inside DiLoCo's outer optimizer would be ignored (the outer step
/// clips nothing): it is refused as the inner one is, naming the setting.
#[test]
fn a_clipped_outer_optimizer_is_refused_before_any_node_starts() {
    let outer: OptimizerConfig = burn::optim::SgdConfig::new()
        .with_gradient_clipping(Some(
            burn::optim::grad_clipping::GradientClippingConfig::Norm(1.0),
        ))
        .into();
    let diloco = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_outer_optimizer(outer));
    let data = NodeData::shared(Synthetic::new(64, 16, 4, 1), Synthetic::new(8, 16, 4, 2));
    let config = TrainerConfig::new(2)
        .with_max_steps(Some(1))
        .with_batch_size(4);
    match Trainer::new(config).fit(small_mlp, &diloco, &data, &SyntheticBatcher) {
        Err(GymError::InvalidConfig(why)) => assert!(why.contains("`outer_optimizer`"), "{why}"),
        Err(e) => panic!("expected InvalidConfig, got {e}"),
        Ok(_) => panic!("accepted"),
    }
}
