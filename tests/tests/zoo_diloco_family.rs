//! SparseLoCo, MuLoCo, compressed DiLoCo and asynchronous DiLoCo against their limiting
//! cases (an existing strategy, or a closed form). `cargo test --release -- zoo`.

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{
    ComputeModel, FlatReplica, Group, InProcessGroup, InnerOptimizerConfig, Network, NodeData,
    NodeInfo, OptimizerConfig, ParamLayout, RunReport, SimulationConfig, StepContext,
    StrategyConfig, TrainModel, Trainer, TrainerConfig,
};
use gym_strategies::{
    Aggregation, AsyncDiLoCoConfig, Codec, CompressionConfig, DiLoCoCommunicatorConfig,
    DiLoCoConfig, MuLoCoConfig, Quantizer, SparseLoCoConfig,
};
use tests::{
    Synthetic, SyntheticBatcher, fit_small_mlp, flat_params, max_abs_diff, small_mlp,
    small_mlp_data,
};

fn adamw() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new().with_lr(3e-3)
}

fn params(strategy: &dyn StrategyConfig, k: usize, steps: usize) -> (Vec<f32>, RunReport) {
    let out = fit_small_mlp(k, steps, 8, 5, strategy);
    (flat_params(&out.model), out.report)
}

fn num_params() -> usize {
    ParamLayout::trainable(&small_mlp(&Device::default().autodiff())).num_elements()
}

#[test]
fn zoo_sparseloco_at_full_density_in_f32_without_feedback_decay_is_diloco_with_outer_sgd() {
    // Every value kept, sent in f32, the buffer emptied every round: Δ̂ is the mean Δ, and
    // the outer step is plain SGD with lr η.
    let sparseloco = SparseLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(5)
        .with_top_k(64)
        .with_chunk(64)
        .with_values(Quantizer::F32)
        .with_error_feedback_decay(0.0)
        .with_outer_lr(0.8);
    let diloco = DiLoCoConfig::new().with_inner(adamw()).with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(5)
            .with_outer_optimizer(OptimizerConfig::sgd())
            .with_outer_lr(0.8),
    );
    let (a, _) = params(&sparseloco, 4, 23);
    let (b, _) = params(&diloco, 4, 23);
    let d = max_abs_diff(&a, &b);
    assert!(d <= 1e-6, "max |Δ| = {d:e}");
}

#[test]
fn zoo_sparseloco_sends_the_packed_top_k_codes_and_nothing_else() {
    let (k, steps, h) = (4usize, 20usize, 5usize);
    let (_, report) = params(&SparseLoCoConfig::new().with_sync_interval(h), k, steps);
    // Formula, written out: per chunk of 4096 the top 64 (the last chunk min(64, its
    // length)); 12-bit indices and 2-bit values, packed; 20 bytes of statistics per 4096
    // kept values.
    let n = num_params();
    let kept: usize = (0..n.div_ceil(4096)).map(|c| 64.min(n - c * 4096)).sum();
    let payload = (kept * 12).div_ceil(8) + kept.div_ceil(4) + 20 * kept.div_ceil(4096);
    let syncs = steps / h;
    assert_eq!(
        report.comm[0].bytes_sent,
        (syncs * (k - 1) * payload) as u64
    );
    assert_eq!(report.comm[0].all_gather_calls, syncs as u64);
    assert_eq!(report.comm[0].all_reduce_calls, 0);
}

#[test]
fn zoo_muloco_with_an_adamw_inner_optimizer_is_diloco() {
    let communicator = DiLoCoCommunicatorConfig::new().with_sync_interval(5);
    let muloco = MuLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(communicator.clone());
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(communicator);
    let (a, ra) = params(&muloco, 4, 17);
    let (b, rb) = params(&diloco, 4, 17);
    assert_eq!(a, b, "bit for bit");
    assert_eq!(ra.comm, rb.comm);
}

#[test]
fn zoo_muloco_steps_its_matrices_with_muon() {
    // The default inner optimizer differs from AdamW on the matrices only.
    let communicator = DiLoCoCommunicatorConfig::new().with_sync_interval(5);
    let muloco = MuLoCoConfig::new().with_communicator(communicator.clone());
    let adamw_only = MuLoCoConfig::new()
        .with_inner(InnerOptimizerConfig::new())
        .with_communicator(communicator);
    let (a, _) = params(&muloco, 2, 4);
    let (b, _) = params(&adamw_only, 2, 4);
    assert!(max_abs_diff(&a, &b) > 1e-5);
}

#[test]
fn zoo_diloco_with_int8_outer_gradients_sends_a_byte_per_value_plus_scales() {
    let (k, steps, h) = (4usize, 20usize, 5usize);
    let communicator = DiLoCoCommunicatorConfig::new().with_sync_interval(h);
    let exact = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(communicator.clone());
    let int8 =
        DiLoCoConfig::new()
            .with_inner(adamw())
            .with_communicator(communicator.with_compression(CompressionConfig::codec(
                Codec::Dense(Quantizer::Int8 { chunk: 256 }),
            )));
    let (a, ra) = params(&exact, k, steps);
    let (b, rb) = params(&int8, k, steps);
    let n = num_params();
    let payload = n + 4 * n.div_ceil(256);
    assert_eq!(
        rb.comm[0].bytes_sent,
        ((steps / h) * (k - 1) * payload) as u64
    );
    assert_eq!(
        ra.comm[0].bytes_sent,
        ((steps / h) * (2 * (k - 1) * 4 * n / k)) as u64
    );
    // Close to exact DiLoCo, but not equal: the code is lossy.
    let d = max_abs_diff(&a, &b);
    assert!(d > 0.0 && d < 0.05, "max |Δ| = {d:e}");
}

#[test]
fn zoo_an_f32_codec_is_the_exact_all_reduce() {
    let communicator = DiLoCoCommunicatorConfig::new().with_sync_interval(5);
    let exact = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(communicator.clone());
    let f32 = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(communicator.with_compression(CompressionConfig::codec(Codec::F32)));
    let (a, ra) = params(&exact, 4, 11);
    let (b, rb) = params(&f32, 4, 11);
    assert_eq!(a, b);
    assert_eq!(ra.comm, rb.comm);
}

#[test]
fn zoo_async_diloco_with_equal_speeds_is_diloco() {
    // N = K pushes per round: the round's total is Nesterov on the mean pseudo-gradient.
    let asynchronous = AsyncDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(5);
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(5));
    for k in [1, 4] {
        let (a, _) = params(&asynchronous, k, 23);
        let (b, _) = params(&diloco, k, 23);
        let d = max_abs_diff(&a, &b);
        assert!(d <= 1e-5, "K = {k}: max |Δ| = {d:e}");
    }
}

#[test]
fn zoo_dynamic_local_updates_give_slower_workers_proportionally_fewer_steps() {
    let config = AsyncDiLoCoConfig::new().with_sync_interval(20);
    let speeds = [1.0, 2.0, 0.5, 0.3];
    let steps: Vec<usize> = (0..4).map(|r| config.local_steps(&speeds, r)).collect();
    // ⌊20·s/2⌋: 10, 20, 5, 3.
    assert_eq!(steps, [10, 20, 5, 3]);
    let floored = config.clone().with_min_local_steps(5);
    assert_eq!(floored.local_steps(&speeds, 3), 5);
    let without = config.with_dynamic_local_updates(false);
    assert_eq!(without.local_steps(&speeds, 3), 20);
}

fn simulated(strategy: &dyn StrategyConfig, speeds: Vec<f64>, steps: usize) -> RunReport {
    let data = small_mlp_data();
    let network: Network = "datacenter".parse().unwrap();
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(steps))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_seed(3)
        .with_simulation(Some(
            SimulationConfig::new(network)
                .with_compute(ComputeModel::Modelled { flops_per_s: 1e8 })
                .with_node_speed(speeds),
        ));
    Trainer::new(config)
        .fit(small_mlp, strategy, &data, &SyntheticBatcher)
        .unwrap()
        .report
}

#[test]
fn zoo_async_diloco_with_a_half_speed_node_finishes_sooner_than_synchronous_diloco() {
    let speeds = vec![1.0, 1.0, 1.0, 0.5];
    let (h, steps) = (10, 40);
    let asynchronous = simulated(
        &AsyncDiLoCoConfig::new().with_sync_interval(h),
        speeds.clone(),
        steps,
    );
    let synchronous = simulated(
        &DiLoCoConfig::new()
            .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(h)),
        speeds,
        steps,
    );
    let step_s = 8.0 * small_mlp(&Device::default().autodiff()).flops_per_example() / 1e8;
    let (a, s) = (
        asynchronous.simulated_time_s().unwrap(),
        synchronous.simulated_time_s().unwrap(),
    );
    // Synchronous: every round waits for the slow node's 10 steps at 2×. Asynchronous:
    // the slow node takes 5 steps at 2×, so a round lasts 10 fast steps.
    assert!(s > 2.0 * steps as f64 * step_s, "{s}");
    assert!(a < 1.1 * steps as f64 * step_s, "{a}");
    // The slow node computed half the steps, and sat out the rest.
    assert!(
        (asynchronous.simulated[3].compute_s - steps as f64 * step_s).abs() < 1e-9,
        "{:?}",
        asynchronous.simulated[3]
    );
    assert!(
        asynchronous.train.iter().all(|r| r.train_loss.is_finite()),
        "the logged loss averages the nodes that computed"
    );
    // Per round of 10 steps: 3 nodes × 10 batches + the slow node's 5, of 8 examples.
    assert_eq!(asynchronous.train.last().unwrap().examples_seen, 4 * 35 * 8);
    assert_eq!(synchronous.train.last().unwrap().examples_seen, 4 * 40 * 8);
}

#[test]
fn zoo_async_diloco_refuses_a_zero_momentum_period() {
    let err = gym_core::Trainer::new(TrainerConfig::new(2).with_max_steps(Some(2)))
        .fit(
            small_mlp,
            &AsyncDiLoCoConfig::new().with_momentum_period(Some(0)),
            &NodeData::shared(Synthetic::new(64, 16, 4, 1), Synthetic::new(8, 16, 4, 2)),
            &SyntheticBatcher,
        )
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("momentum_period"), "{err}");
}

/// The mean of each rank's `input(rank)` through `compression` on `k` in-process nodes.
fn compressed_mean(
    compression: CompressionConfig,
    k: usize,
    input: impl Fn(usize) -> Vec<f32> + Sync,
) -> Vec<Vec<f32>> {
    let device = Device::default();
    let layout = ParamLayout::trainable(&small_mlp(&device.clone().autodiff()));
    let group = InProcessGroup::new(k);
    group
        .run(|comm| {
            let rank = comm.rank();
            let speeds = vec![1.0; k];
            let node = NodeInfo {
                rank,
                world_size: k,
                max_steps: 1,
                seed: 7,
                device: &device,
                layout: &layout,
                initial_params: Tensor::zeros([1], &device),
                node_speeds: &speeds,
                faults: false,
            };
            let mut compressor = compression.init(&node, 0).unwrap();
            let mut unused = FlatReplica(Tensor::zeros([1], &device));
            let ctx = StepContext {
                rank,
                world_size: k,
                step: 0,
                max_steps: 1,
                replica: &mut unused,
                collective: &comm,
                layout: &layout,
            };
            let x = input(rank);
            let x = Tensor::from_data(TensorData::new(x.clone(), [x.len()]), &device);
            let mean = compressor.mean(&Group::world(k), x, &ctx).unwrap();
            mean.into_data().try_to_vec::<f32>().unwrap()
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

#[test]
fn zoo_a_sparse_mean_divides_by_the_nodes_or_by_the_senders_of_each_position() {
    // Top-1 of each chunk of 4, f32 values. Rank 0 sends 4 at 0 and 8 at 4; rank 1 sends
    // 2 at 2 and 6 at 4.
    let inputs = [
        vec![4.0, 1.0, 0.0, 0.0, 8.0, 0.0, 0.0, 0.0],
        vec![0.0, 0.0, 2.0, 1.0, 6.0, 0.0, 0.0, 1.0],
    ];
    let codec = Codec::TopK {
        k: 1,
        chunk: 4,
        values: Quantizer::F32,
    };
    let over = |aggregation| CompressionConfig::Codec {
        codec,
        error_feedback: None,
        aggregation,
    };
    let nodes = compressed_mean(over(Aggregation::MeanOverNodes), 2, |r| inputs[r].clone());
    let senders = compressed_mean(over(Aggregation::MeanOverSenders), 2, |r| inputs[r].clone());
    for r in 0..2 {
        assert_eq!(nodes[r], [2.0, 0.0, 1.0, 0.0, 7.0, 0.0, 0.0, 0.0]);
        assert_eq!(senders[r], [4.0, 0.0, 2.0, 0.0, 7.0, 0.0, 0.0, 0.0]);
    }
    assert_eq!(
        "topk:1/4+f32,ef=0.5,senders"
            .parse::<CompressionConfig>()
            .unwrap(),
        CompressionConfig::Codec {
            codec,
            error_feedback: Some(0.5),
            aggregation: Aggregation::MeanOverSenders
        }
    );
    let spec = over(Aggregation::MeanOverSenders).to_string();
    assert_eq!(spec.parse::<CompressionConfig>().unwrap().to_string(), spec);
    assert!("int8,everyone".parse::<CompressionConfig>().is_err());
}
