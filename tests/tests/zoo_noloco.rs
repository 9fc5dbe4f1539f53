//! NoLoCo against a naive heavy-ball DiLoCo, FedAvg, its groups on hand-driven nodes, and
//! its bytes. `cargo test --release --test zoo_noloco`.

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{
    Group, InProcessGroup, InnerOptimizerConfig, ModelReplica, NodeInfo, OptimizerConfig,
    ParamLayout, ReduceOp, Replica, Result, StepContext, StrategyConfig,
};
use gym_strategies::communicate::{CommunicationModule, CommunicationModuleConfig, is_sync_step};
use gym_strategies::{
    AveragingCommunicatorConfig, CommunicateOptimizeConfig, FedAvgConfig, NoLoCoCommunicatorConfig,
    NoLoCoConfig, NoLoCoGroups,
};
use tests::{fit_small_mlp, flat_params, max_abs_diff, small_mlp};

fn adam() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new()
        .with_optimizer(OptimizerConfig::adam())
        .with_lr(3e-3)
}

fn noloco(h: usize, n: usize, alpha: f64, mu: f64) -> NoLoCoConfig {
    NoLoCoConfig::new().with_inner(adam()).with_communicator(
        NoLoCoCommunicatorConfig::new()
            .with_sync_interval(h)
            .with_group_size(n)
            .with_outer_lr(alpha)
            .with_outer_momentum(mu),
    )
}

fn host(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [v.len()]),
        &device.clone().inner(),
    )
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// DiLoCo with a heavy-ball outer step over all nodes, on the host:
/// `m ← μm + α(θ̄ − φ); φ ← φ + m; θ ← φ` (jkolehm/noloco's `PipelineDiLoCoOptimizer`,
/// with the pseudo-gradient's sign written out).
struct HeavyBall {
    h: usize,
    alpha: f32,
    mu: f32,
    phi: Vec<f32>,
    m: Vec<f32>,
}

struct HeavyBallConfig {
    h: usize,
    alpha: f32,
    mu: f32,
}

impl CommunicationModuleConfig for HeavyBallConfig {
    fn name(&self) -> String {
        "heavy-ball-diloco".into()
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        let phi = values(node.initial_params.clone());
        Ok(Box::new(HeavyBall {
            h: self.h,
            alpha: self.alpha,
            mu: self.mu,
            m: vec![0.0; phi.len()],
            phi,
        }))
    }
}

impl CommunicationModule for HeavyBall {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.h) {
            return Ok(());
        }
        let mean = values(
            ctx.collective
                .all_reduce(ctx.replica.params(), ReduceOp::Mean)?,
        );
        for ((phi, m), avg) in self.phi.iter_mut().zip(&mut self.m).zip(mean) {
            *m = self.mu * *m + self.alpha * (avg - *phi);
            *phi += *m;
        }
        ctx.replica.set_params(host(&self.phi, &Device::default()));
        Ok(())
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        Some(host(&self.phi, &Device::default()))
    }
}

#[test]
fn zoo_noloco_with_one_group_is_heavy_ball_diloco() {
    let (k, h) = (4, 5);
    let a = fit_small_mlp(k, 23, 8, 5, &noloco(h, k, 0.7, 0.5));
    let reference =
        CommunicateOptimizeConfig::new("heavy-ball", adam()).with_module(HeavyBallConfig {
            h,
            alpha: 0.7,
            mu: 0.5,
        });
    let b = fit_small_mlp(k, 23, 8, 5, &reference);
    tests::assert_same_training(&a, &b, 1e-6);
    assert_eq!(a.report.comm[0].all_reduce_calls, 4);
}

#[test]
fn zoo_noloco_with_one_group_no_momentum_and_lr_1_is_fedavg() {
    let (k, h) = (4, 5);
    let a = fit_small_mlp(k, 23, 8, 5, &noloco(h, k, 1.0, 0.0));
    let fedavg = FedAvgConfig::new()
        .with_inner(adam())
        .with_communicator(AveragingCommunicatorConfig::new().with_sync_interval(h));
    let b = fit_small_mlp(k, 23, 8, 5, &fedavg);
    let d = max_abs_diff(&flat_params(&a.model), &flat_params(&b.model));
    assert!(d <= 1e-6, "max |Δ| = {d:e}");
    assert_eq!(a.report.comm, b.report.comm);
}

#[test]
fn zoo_noloco_groups_partition_the_ranks_the_same_way_for_the_same_seed_and_step() {
    let (k, n) = (8, 2);
    let draw = |seed, step| NoLoCoGroups::draw(k, n, seed, step);
    for step in [0, 49, 99] {
        let groups = draw(7, step);
        assert_eq!(groups, draw(7, step), "a pure function of (seed, step)");
        assert_eq!(groups.groups().len(), k / n);
        let mut ranks: Vec<usize> = groups
            .groups()
            .iter()
            .flat_map(|g| {
                assert_eq!(g.size(), n);
                g.members().to_vec()
            })
            .collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (0..k).collect::<Vec<_>>());
        for r in 0..k {
            assert!(groups.group_of(r).contains(r));
        }
    }
    // Other steps, other seeds: other groups (7 pairings of 8 ranks out of 105 repeat the
    // first with tiny probability).
    let steps: Vec<NoLoCoGroups> = (0..8).map(|t| draw(7, t * 50 + 49)).collect();
    assert!(steps.iter().any(|g| *g != steps[0]));
    let seeds: Vec<NoLoCoGroups> = (0..8).map(|s| draw(s, 49)).collect();
    assert!(seeds.iter().any(|g| *g != seeds[0]));
    // Groups of 4 among 8, and one group of everyone.
    let fours = NoLoCoGroups::draw(8, 4, 7, 49);
    assert!(fours.groups().iter().all(|g| g.size() == 4));
    assert_eq!(NoLoCoGroups::draw(8, 8, 7, 49).groups(), [Group::world(8)]);
}

/// Runs NoLoCo's module on `k` hand-driven nodes for one synchronisation (H = 1): node r's
/// replica holds `r + 1` in every element. Returns each node's parameters afterwards.
fn one_sync(k: usize, n: usize, alpha: f64, seed: u64, step: usize) -> Vec<Vec<f32>> {
    let config = NoLoCoCommunicatorConfig::new()
        .with_sync_interval(1)
        .with_group_size(n)
        .with_outer_lr(alpha)
        .with_outer_momentum(0.5);
    let group = InProcessGroup::new(k);
    let speeds = vec![1.0; k];
    group
        .run(|comm| {
            let rank = comm.rank();
            let device = Device::default().autodiff();
            let model = small_mlp(&device);
            let layout = ParamLayout::trainable(&model);
            let len = layout.num_elements();
            let mut replica = ModelReplica::new(model, layout.clone());
            let mut module = config
                .init(&NodeInfo {
                    rank,
                    world_size: k,
                    max_steps: step + 1,
                    seed,
                    device: &device,
                    layout: &layout,
                    initial_params: host(&vec![0.0; len], &device),
                    node_speeds: &speeds,
                    faults: false,
                })
                .unwrap();
            replica.set_params(host(&vec![(rank + 1) as f32; len], &device));
            let mut ctx = StepContext {
                rank,
                world_size: k,
                step,
                max_steps: step + 1,
                replica: &mut replica,
                collective: &comm,
                layout: &layout,
            };
            module.communicate(&mut ctx).unwrap();
            let after = values(replica.params());
            assert_eq!(after, values(module.master_params().unwrap()));
            after
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

#[test]
fn zoo_noloco_nodes_move_towards_the_mean_of_their_drawn_group() {
    let (k, n, alpha, seed) = (8, 2, 0.7, 11);
    for step in [3, 4] {
        let after = one_sync(k, n, alpha, seed, step);
        let groups = NoLoCoGroups::draw(k, n, seed, step);
        for (rank, values) in after.iter().enumerate() {
            let group = groups.group_of(rank);
            // φ = 0 and m = 0 before: m = α·θ̄_G, φ = m.
            let mean = group.members().iter().map(|&r| (r + 1) as f32).sum::<f32>() / n as f32;
            let expected = alpha as f32 * mean;
            assert!(
                values.iter().all(|v| (v - expected).abs() <= 1e-6),
                "rank {rank} in {group:?}: {} vs {expected}",
                values[0]
            );
        }
    }
    // The pairs differ between the two steps, and so do the results.
    assert_ne!(
        NoLoCoGroups::draw(k, n, seed, 3),
        NoLoCoGroups::draw(k, n, seed, 4)
    );
    assert_ne!(
        one_sync(k, n, alpha, seed, 3),
        one_sync(k, n, alpha, seed, 4)
    );
}

#[test]
fn zoo_noloco_bytes_per_node_per_sync_depend_on_the_group_size_not_on_k() {
    let n_elems =
        ParamLayout::trainable(&small_mlp(&Device::default().autodiff())).num_elements() as u64;
    let (n, h, steps) = (2u64, 5, 23);
    let per_sync = 2 * (n - 1) * 4 * n_elems / n;
    let mut per_node = Vec::new();
    for k in [4, 8] {
        let out = fit_small_mlp(k, steps, 8, 5, &noloco(h, n as usize, 0.7, 0.5));
        assert_eq!(out.report.comm.len(), k);
        for c in &out.report.comm {
            assert_eq!(c.all_reduce_calls, 4);
            assert_eq!(c.bytes_sent, 4 * per_sync, "K = {k}");
            assert_eq!(c.bytes_received, 4 * per_sync, "K = {k}");
        }
        per_node.push(out.report.comm[0].bytes_sent);
    }
    assert_eq!(per_node[0], per_node[1]);
    // Groups of 4 among 8 send 2·3/4 of the buffer.
    let out = fit_small_mlp(8, 10, 8, 5, &noloco(h, 4, 0.7, 0.5));
    assert_eq!(out.report.comm[3].bytes_sent, 2 * (2 * 3 * 4 * n_elems / 4));
}

fn init_error(config: &NoLoCoConfig, world_size: usize) -> String {
    let device = Device::default().autodiff();
    let layout = ParamLayout::trainable(&small_mlp(&device));
    let speeds = vec![1.0; world_size];
    let node = NodeInfo {
        rank: 0,
        world_size,
        max_steps: 100,
        seed: 1,
        device: &device,
        layout: &layout,
        initial_params: host(&vec![0.0; layout.num_elements()], &device),
        node_speeds: &speeds,
        faults: false,
    };
    match StrategyConfig::init(config, &node) {
        Ok(_) => panic!("accepted {config:?} on {world_size} nodes"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn zoo_noloco_refuses_a_group_size_that_does_not_divide_the_nodes() {
    let e = init_error(&noloco(50, 3, 0.7, 0.5), 4);
    assert!(e.contains("`group_size` (3) must divide"), "{e}");
    let e = init_error(&noloco(50, 8, 0.7, 0.5), 4);
    assert!(e.contains("`group_size`"), "{e}");
    let e = init_error(&noloco(50, 0, 0.7, 0.5), 4);
    assert!(e.contains("`group_size`"), "{e}");
    let e = init_error(&noloco(50, 2, 0.7, 1.0), 4);
    assert!(e.contains("`outer_momentum`"), "{e}");
    let e = init_error(&noloco(0, 2, 0.7, 0.5), 4);
    assert!(e.contains("`sync_interval`"), "{e}");
    // Defaults: the reference configs', with Adam inside.
    let d = NoLoCoConfig::new();
    assert_eq!(
        (
            d.communicator.sync_interval,
            d.communicator.group_size,
            d.communicator.outer_lr,
            d.communicator.outer_momentum
        ),
        (50, 2, 0.7, 0.5)
    );
    assert!(matches!(d.inner.optimizer, OptimizerConfig::Adam(_)));
    assert_eq!(StrategyConfig::name(&d), "noloco");
}
