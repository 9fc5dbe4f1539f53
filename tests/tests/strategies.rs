//! The communication-efficient strategies against independent references.

use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{
    FitOutput, InProcessGroup, InnerOptimizerConfig, ModelReplica, NodeInfo, OptimizerConfig,
    ParamLayout, Replica, StepContext, StrategyConfig,
};
use gym_models::Mlp;
use gym_strategies::communicate::CommunicationModuleConfig;
use gym_strategies::{
    AllReduceConfig, AveragingCommunicatorConfig, DiLoCoCommunicatorConfig, DiLoCoConfig,
    FedAvgConfig, IslandPartition, SparseCommunicatorConfig, SpartaConfig, SpartaDiLoCoConfig,
};
use tests::{fit_small_mlp, flat_params, max_abs_diff, small_mlp};

fn fit(k: usize, steps: usize, strategy: &dyn StrategyConfig) -> FitOutput<Mlp> {
    fit_small_mlp(k, steps, 8, 5, strategy)
}

fn flat(m: &Mlp) -> Vec<f32> {
    flat_params(m)
}

fn adamw() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new().with_lr(3e-3)
}

/// Plain SGD with lr 1 as DiLoCo's outer step: the master becomes the average.
fn plain_outer(module: DiLoCoCommunicatorConfig) -> DiLoCoCommunicatorConfig {
    module
        .with_outer_optimizer(OptimizerConfig::sgd())
        .with_outer_lr(1.0)
}

#[test]
fn diloco_with_outer_sgd_lr_1_and_no_momentum_equals_fedavg() {
    let h = 5;
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(plain_outer(
            DiLoCoCommunicatorConfig::new().with_sync_interval(h),
        ));
    let fedavg = FedAvgConfig::new()
        .with_inner(adamw())
        .with_communicator(AveragingCommunicatorConfig::new().with_sync_interval(h));
    let (a, b) = (fit(4, 23, &diloco), fit(4, 23, &fedavg));
    let d = max_abs_diff(&flat(&a.model), &flat(&b.model));
    assert!(d <= 1e-6, "max |Δ| = {d:e}");
    // Both synchronised 4 times (after steps 4, 9, 14, 19): the same traffic.
    assert_eq!(a.report.comm, b.report.comm);
    assert_eq!(a.report.comm[0].all_reduce_calls, 4);
    // Only DiLoCo keeps a master model.
    assert!(a.master.is_some() && b.master.is_none());
}

#[test]
fn diloco_on_one_node_with_h_1_equals_plain_inner_training() {
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(plain_outer(
            DiLoCoCommunicatorConfig::new().with_sync_interval(1),
        ));
    let plain = AllReduceConfig::new().with_inner(adamw());
    let (a, b) = (fit(1, 20, &diloco), fit(1, 20, &plain));
    let d = max_abs_diff(&flat(&a.model), &flat(&b.model));
    assert!(d <= 1e-6, "max |Δ| = {d:e}");
}

#[test]
fn diloco_on_one_node_applies_the_outer_step() {
    // With the default outer Nesterov (lr 0.7, momentum 0.9) a K = 1 run differs from plain
    // training: the outer step is not skipped as in the original.
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(2));
    let plain = AllReduceConfig::new().with_inner(adamw());
    let d = max_abs_diff(
        &flat(&fit(1, 10, &diloco).model),
        &flat(&fit(1, 10, &plain).model),
    );
    assert!(d > 1e-4, "{d}");
}

/// A one-layer model whose `n` weights are the flat parameters.
fn linear(n: usize, device: &Device) -> Linear {
    let _guard = gym_core::rng::lock_backend_rng();
    let model = LinearConfig::new(n, 1).with_bias(false).init(device);
    gym_core::rng::materialize(&model);
    model
}

fn host(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [v.len()]),
        &device.clone().inner(),
    )
}

/// Drives one node's module through a synchronisation per replica value (one node, so the
/// average is the replica itself) and returns what it writes back.
fn drive(
    module: &dyn CommunicationModuleConfig,
    initial: Vec<f32>,
    replicas: &[Vec<f32>],
    every: usize,
) -> Vec<Vec<f32>> {
    let device = Device::default().autodiff();
    let model = linear(initial.len(), &device);
    let layout = ParamLayout::trainable(&model);
    let mut replica = ModelReplica::new(model, layout.clone());
    let group = InProcessGroup::new(1);
    let comm = group.handle(0);
    let mut m = module
        .init(&NodeInfo {
            rank: 0,
            world_size: 1,
            max_steps: 100,
            seed: 1,
            device: &device,
            layout: &layout,
            initial_params: host(&initial, &device),
            node_speeds: &[1.0],
            faults: false,
        })
        .unwrap();
    replicas
        .iter()
        .enumerate()
        .map(|(i, theta)| {
            let mut ctx = StepContext {
                rank: 0,
                world_size: 1,
                step: (i + 1) * every - 1,
                max_steps: 100,
                replica: &mut replica,
                collective: &comm,
                layout: &layout,
            };
            ctx.replica.set_params(host(theta, &device));
            m.communicate(&mut ctx).unwrap();
            replica.params().into_data().try_to_vec::<f32>().unwrap()
        })
        .collect()
}

#[test]
fn outer_nesterov_matches_a_hand_computed_three_step_sequence() {
    let (lr, mu) = (0.7f64, 0.9f64);
    let module = DiLoCoCommunicatorConfig::new()
        .with_sync_interval(3)
        .with_outer_optimizer(OptimizerConfig::sgd_momentum(mu, true))
        .with_outer_lr(lr);
    let initial = vec![1.0f32, -2.0, 0.5];
    let replicas = vec![
        vec![0.9f32, -1.8, 0.5],
        vec![0.7, -1.5, 0.6],
        vec![0.8, -1.0, 0.2],
    ];
    let got = drive(&module, initial.clone(), &replicas, 3);
    // PyTorch SGD-Nesterov, dampening 0: b ← Δ (first), b ← μb + Δ; θ ← θ − lr(Δ + μb).
    let mut master: Vec<f64> = initial.iter().map(|&x| x as f64).collect();
    let mut b = [0.0f64; 3];
    for (s, replica) in replicas.iter().enumerate() {
        for i in 0..3 {
            let delta = master[i] - replica[i] as f64;
            b[i] = if s == 0 { delta } else { mu * b[i] + delta };
            master[i] -= lr * (delta + mu * b[i]);
        }
        for i in 0..3 {
            assert!(
                (got[s][i] as f64 - master[i]).abs() < 1e-6,
                "sync {s} elem {i}: {} vs {}",
                got[s][i],
                master[i]
            );
        }
    }
}

#[test]
fn sparta_with_p_1_equals_fedavg_every_step() {
    let sparta = SpartaConfig::new()
        .with_inner(adamw())
        .with_communicator(SparseCommunicatorConfig::new().with_p(1.0));
    let fedavg = FedAvgConfig::new().with_inner(adamw());
    let (a, b) = (fit(4, 12, &sparta), fit(4, 12, &fedavg));
    let d = max_abs_diff(&flat(&a.model), &flat(&b.model));
    assert!(d <= 1e-6, "max |Δ| = {d:e}");
}

#[test]
fn sparta_with_p_0_never_communicates() {
    let sparta = SpartaConfig::new().with_communicator(SparseCommunicatorConfig::new().with_p(0.0));
    let out = fit(4, 10, &sparta);
    assert!(
        out.report
            .comm
            .iter()
            .all(|c| c.bytes_sent == 0 && c.bytes_received == 0)
    );
}

#[test]
fn sparta_diloco_honours_the_sparta_interval() {
    let n = ParamLayout::trainable(&small_mlp(&Device::default().autodiff())).num_elements() as u64;
    let hybrid = SpartaDiLoCoConfig::new()
        .with_sparta(
            SparseCommunicatorConfig::new()
                .with_p(1.0)
                .with_sync_interval(4),
        )
        .with_diloco(DiLoCoCommunicatorConfig::new().with_sync_interval(10));
    let out = fit(2, 21, &hybrid);
    // Sparse syncs after steps 3, 7, 11, 15, 19 (5), DiLoCo after 9 and 19 (2): 7 all-reduces
    // of n floats, ring cost 2·(2−1)/2 · 4n bytes each.
    let c = out.report.comm[0];
    assert_eq!(c.all_reduce_calls, 7);
    assert_eq!(c.bytes_sent, 7 * (2 * 4 * n / 2));
}

#[test]
fn fedavg_islands_average_within_and_differ_across() {
    let module = AveragingCommunicatorConfig::new()
        .with_sync_interval(1)
        .with_island_size(Some(2));
    let device = Device::default().autodiff();
    let layout = ParamLayout::trainable(&linear(3, &device));
    let group = InProcessGroup::new(4);
    let results = group
        .run(|comm| {
            let rank = comm.rank();
            let values = [(rank * rank) as f32 * 10.0, rank as f32, 1.0];
            let t = host(&values, &device);
            let mut replica = ModelReplica::new(linear(3, &device), layout.clone());
            replica.set_params(t.clone());
            let mut m = module
                .init(&NodeInfo {
                    rank,
                    world_size: 4,
                    max_steps: 10,
                    seed: 77,
                    device: &device,
                    layout: &layout,
                    initial_params: t.clone(),
                    node_speeds: &[1.0; 4],
                    faults: false,
                })
                .unwrap();
            let mut ctx = StepContext {
                rank,
                world_size: 4,
                step: 3,
                max_steps: 10,
                replica: &mut replica,
                collective: &comm,
                layout: &layout,
            };
            m.communicate(&mut ctx).unwrap();
            replica.params().into_data().try_to_vec::<f32>().unwrap()
        })
        .unwrap();
    let results: Vec<Vec<f32>> = results.into_iter().map(Result::unwrap).collect();
    let partition = IslandPartition::draw(4, 2, 77, 3);
    assert_eq!(
        partition,
        IslandPartition::draw(4, 2, 77, 3),
        "the same seed gives the same islands"
    );
    for island in partition.islands() {
        let m = island.members();
        assert_eq!(results[m[0]], results[m[1]], "equal within island {m:?}");
        let expected0 = (m[0] * m[0] + m[1] * m[1]) as f32 * 10.0 / 2.0;
        assert_eq!(results[m[0]][0], expected0);
    }
    let (a, b) = (
        partition.islands()[0].members()[0],
        partition.islands()[1].members()[0],
    );
    assert_ne!(results[a], results[b], "different across islands");
    // Islands are redrawn at every sync, from the seed.
    let draws: std::collections::HashSet<_> = (0..20)
        .map(|s| format!("{:?}", IslandPartition::draw(4, 2, 77, s)))
        .collect();
    assert!(draws.len() > 1);
}

#[test]
fn diloco_with_h_20_sends_a_twentieth_of_allreduce_bytes() {
    // 60 steps: AllReduce all-reduces the gradient 60 times; DiLoCo the parameters after
    // steps 19, 39 and 59. Same buffer size and ring cost: exactly 1/20 of the bytes.
    let diloco = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(20));
    let (a, b) = (fit(4, 60, &diloco), fit(4, 60, &AllReduceConfig::new()));
    let (d, r) = (a.report.comm[0].bytes_sent, b.report.comm[0].bytes_sent);
    assert_eq!(a.report.comm[0].all_reduce_calls, 3);
    assert_eq!(d * 20, r, "DiLoCo {d} vs AllReduce {r}");
}
