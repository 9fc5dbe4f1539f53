//! PowerSGD (Vogels et al., 2019) against its limiting cases and a naive re-implementation
//! of one step. `cargo test --release -- zoo`.

use burn::nn::LinearConfig;
use burn::tensor::{Device, Tensor, TensorData};
use gym_core::rng::lock_backend_rng;
use gym_core::{
    Collective, FitOutput, FlatReplica, Group, GymError, InProcessGroup, InnerOptimizerConfig,
    NodeData, NodeInfo, OptimizerConfig, ParamLayout, StepContext, StrategyConfig, Trainer,
    TrainerConfig,
};
use gym_models::{Mlp, MlpConfig};
use gym_strategies::compress::{Compressor, PowerSgdCompressionConfig, PowerSgdCompressor};
use gym_strategies::{AllReduceConfig, PowerSgdConfig};
use tests::{
    Synthetic, SyntheticBatcher, fit_small_mlp, flat_params, max_abs_diff, relative_error,
    small_mlp,
};

/// The paper's optimizer: SGD with Nesterov momentum 0.9, applied after decompression.
fn nesterov() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new()
        .with_optimizer(OptimizerConfig::sgd_momentum(0.9, true))
        .with_lr(0.05)
}

fn host(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 values")
}

/// The layout of a `d_in → d_out` linear layer with bias: a `d_in×d_out` weight and a bias
/// (always sent as it is).
///
/// Building a model draws from the backend's process-wide generator: under its lock, or a
/// `fit` running in parallel (another test) would see its own draws disturbed.
fn layer(d_in: usize, d_out: usize) -> ParamLayout {
    let _guard = lock_backend_rng();
    let model = LinearConfig::new(d_in, d_out).init(&Device::default().autodiff());
    ParamLayout::trainable(&model)
}

/// The compressor of `rank` in a world of `world_size`.
fn compressor(
    config: PowerSgdCompressionConfig,
    layout: &ParamLayout,
    rank: usize,
    world_size: usize,
) -> PowerSgdCompressor {
    let device = Device::default();
    config
        .init(
            &NodeInfo {
                rank,
                world_size,
                max_steps: 10,
                seed: 42,
                device: &device,
                layout,
                initial_params: Tensor::zeros([layout.num_elements()], &device),
                node_speeds: &vec![1.0; world_size],
                faults: false,
            },
            0,
        )
        .expect("valid settings")
}

/// The context of `step` for a compressor driven by hand (its replica unused).
fn context<'a>(
    comm: &'a Collective,
    layout: &'a ParamLayout,
    replica: &'a mut FlatReplica,
    world_size: usize,
    step: usize,
) -> StepContext<'a> {
    StepContext {
        rank: comm.rank(),
        world_size,
        step,
        max_steps: 10,
        replica,
        collective: comm,
        layout,
    }
}

#[test]
fn zoo_powersgd_at_full_rank_trains_as_allreduce() {
    // r ≥ min(n, m) for both weights of the 16-32-4 MLP, and every matrix compressed: Ĝ is
    // the exact mean and the errors sum to zero over the nodes, so every step applies the
    // mean gradient (the paper's argument), up to rounding. With the paper's optimizer and
    // with AdamW, which would amplify a wrong small coordinate.
    let compression = PowerSgdCompressionConfig::new()
        .with_rank(32)
        .with_min_compression_rate(0.0);
    let (steps, k) = (20, 4);
    let device = Device::default();
    for inner in [nesterov(), InnerOptimizerConfig::new().with_lr(3e-3)] {
        let powersgd = PowerSgdConfig::new()
            .with_inner(inner.clone())
            .with_compression(compression);
        let allreduce = AllReduceConfig::new().with_inner(inner);
        let a = fit_small_mlp(k, steps, 8, 5, &powersgd);
        let b = fit_small_mlp(k, steps, 8, 5, &allreduce);
        let (pa, pb) = (flat_params(&a.model), flat_params(&b.model));
        let err = relative_error(host(&pa, &device), host(&pb, &device));
        assert!(err <= 1e-5, "relative error {err:e}");
        // It went through the compressor: uncompressed, P and Q each step.
        assert_eq!(a.report.comm[0].all_reduce_calls, 3 * steps as u64);
        assert_eq!(b.report.comm[0].all_reduce_calls, steps as u64);
    }
}

/// Averages each rank's `gradient(rank)` through PowerSGD on `k` nodes; every rank's result.
fn powersgd_mean(
    config: PowerSgdCompressionConfig,
    layout: &ParamLayout,
    k: usize,
    gradient: impl Fn(usize) -> Vec<f32> + Sync,
) -> (Vec<Vec<f32>>, gym_core::CommStats) {
    let group = InProcessGroup::new(k);
    let results = group
        .run(|comm| {
            let rank = comm.rank();
            let mut c = compressor(config, layout, rank, k);
            let mut unused = FlatReplica(Tensor::zeros([1], &Device::default()));
            let ctx = context(&comm, layout, &mut unused, k, 0);
            let x = host(&gradient(rank), &Device::default());
            values(c.mean(&Group::world(k), x, &ctx).expect("averages"))
        })
        .expect("threads");
    let results = results.into_iter().map(|r| r.expect("no panic")).collect();
    (results, group.stats(0))
}

#[test]
fn zoo_powersgd_recovers_the_exact_mean_of_rank_1_gradients_on_two_nodes() {
    // Node k's weight gradient is c_k·a·bᵀ (c = 1, 3): their mean 2·a·bᵀ has rank 1, so
    // rank-1 PowerSGD returns it exactly; the bias is averaged exactly.
    let layout = layer(8, 6);
    let a: Vec<f32> = (0..8).map(|i| (i as f32 * 0.7 - 2.0).sin()).collect();
    let b: Vec<f32> = (0..6).map(|j| 0.3 + j as f32 * 0.25).collect();
    let gradient = |rank: usize| -> Vec<f32> {
        let c = [1.0f32, 3.0][rank];
        let mut g: Vec<f32> = (0..48).map(|x| c * a[x / 6] * b[x % 6]).collect();
        g.extend((0..6).map(|j| (rank * 10 + j) as f32));
        g
    };
    let mut want: Vec<f32> = (0..48).map(|x| 2.0 * a[x / 6] * b[x % 6]).collect();
    want.extend((0..6).map(|j| j as f32 + 5.0));

    let (results, stats) = powersgd_mean(
        PowerSgdCompressionConfig::new().with_rank(1),
        &layout,
        2,
        gradient,
    );
    for got in results {
        let d = max_abs_diff(&got, &want);
        assert!(d <= 1e-5, "max |Ĝ − mean| = {d:e}");
        assert_eq!(got[48..], want[48..], "the bias is an exact mean");
    }
    // Bytes, per node: ring all-reduces of K = 2 send 2(K−1)/K = 1 times the payload: the
    // bias (6 f32), P (8×1 f32) and Q (6×1 f32).
    assert_eq!(stats.all_reduce_calls, 3);
    assert_eq!(stats.bytes_sent, 4 * (6 + 8 + 6));
}

#[test]
fn zoo_powersgd_rank_above_the_rank_of_the_mean_still_gives_the_mean() {
    // Three nodes, a 12×5 weight at rank 4, gradients c_k·a·bᵀ: the sum Σ M_k·Q has rank 1,
    // so three of P's four columns are rounding noise. Orthonormalizing them must still
    // leave P·Pᵀ a projection (a classifier's last layer is rank-deficient the same way).
    let layout = layer(12, 5);
    let a: Vec<f32> = (0..12).map(|i| (i as f32 * 1.1).cos()).collect();
    let b: Vec<f32> = (0..5).map(|j| 1.0 - j as f32 * 0.4).collect();
    let gradient = |rank: usize| -> Vec<f32> {
        let c = [0.5f32, -1.0, 2.0][rank];
        let mut g: Vec<f32> = (0..60).map(|x| c * a[x / 5] * b[x % 5]).collect();
        g.extend([0.0; 5]);
        g
    };
    let mean: Vec<f32> = (0..60).map(|x| 0.5 * a[x / 5] * b[x % 5]).collect();
    let config = PowerSgdCompressionConfig::new()
        .with_rank(4)
        .with_min_compression_rate(0.0);
    let (results, _) = powersgd_mean(config, &layout, 3, gradient);
    for got in results {
        let d = max_abs_diff(&got[..60], &mean);
        assert!(d <= 1e-5, "max |Ĝ − mean| = {d:e}");
    }
}

/// One naive PowerSGD step on one node (K = 1) from the warm `q` (`m` values, rank 1):
/// `P = M·q̂`, `P̂ = P/‖P‖`, `Ĝ = P̂·(MᵀP̂)ᵀ`.
fn naive_rank_1_step(m_mat: &[f32], q: &[f32], n: usize, m: usize) -> Vec<f32> {
    let qn = q.iter().map(|x| x * x).sum::<f32>().sqrt();
    let q: Vec<f32> = q.iter().map(|x| x / qn).collect();
    let p: Vec<f32> = (0..n)
        .map(|i| (0..m).map(|j| m_mat[i * m + j] * q[j]).sum())
        .collect();
    let pn = p.iter().map(|x| x * x).sum::<f32>().sqrt();
    let p: Vec<f32> = p.iter().map(|x| x / pn).collect();
    let q2: Vec<f32> = (0..m)
        .map(|j| (0..n).map(|i| m_mat[i * m + j] * p[i]).sum())
        .collect();
    (0..n * m).map(|x| p[x / m] * q2[x % m]).collect()
}

#[test]
fn zoo_powersgd_error_feedback_carries_m_minus_g_hat_into_the_next_step() {
    let (n, m) = (6usize, 5usize);
    let layout = layer(n, m);
    let numel = layout.num_elements();
    let g1: Vec<f32> = (0..numel)
        .map(|x| (1.3 * (x / m) as f32 + 0.7 * (x % m) as f32 + 0.1).sin())
        .collect();
    let g2: Vec<f32> = (0..numel)
        .map(|x| (0.4 * (x / m) as f32 - 1.1 * (x % m) as f32).cos() * 0.5)
        .collect();
    let group = InProcessGroup::new(1);
    let comm = group.handle(0);
    let device = Device::default();
    let run = |error_feedback: bool| -> (Vec<f32>, Vec<f32>) {
        let config = PowerSgdCompressionConfig::new()
            .with_rank(1)
            .with_error_feedback(error_feedback);
        let mut c = compressor(config, &layout, 0, 1);
        let mut unused = FlatReplica(Tensor::zeros([1], &Device::default()));
        let ctx = context(&comm, &layout, &mut unused, 1, 0);
        let first = values(c.mean(&Group::world(1), host(&g1, &device), &ctx).unwrap());
        let second = values(c.mean(&Group::world(1), host(&g2, &device), &ctx).unwrap());
        (first, second)
    };
    let (first, second) = run(true);
    let w = n * m;
    // Call 1: Ĝ₁ is the projection of G₁ onto Ĝ₁'s column (p·pᵀ·G₁), whatever Q was drawn.
    let col = |x: &[f32], j: usize| -> Vec<f32> { (0..n).map(|i| x[i * m + j]).collect() };
    let best = (0..m)
        .max_by(|&a, &b| {
            let na: f32 = col(&first, a).iter().map(|x| x * x).sum();
            let nb: f32 = col(&first, b).iter().map(|x| x * x).sum();
            na.total_cmp(&nb)
        })
        .unwrap();
    let p = col(&first, best);
    let pn = p.iter().map(|x| x * x).sum::<f32>().sqrt();
    let p: Vec<f32> = p.iter().map(|x| x / pn).collect();
    let pt_g: Vec<f32> = (0..m)
        .map(|j| (0..n).map(|i| p[i] * g1[i * m + j]).sum())
        .collect();
    let projected: Vec<f32> = (0..w).map(|x| p[x / m] * pt_g[x % m]).collect();
    let d = max_abs_diff(&first[..w], &projected);
    assert!(d <= 1e-5, "call 1: max |Ĝ − p·pᵀ·G| = {d:e}");
    assert_eq!(first[w..], g1[w..], "the bias of one node is its own");

    // Call 2, naively: e₁ = M₁ − Ĝ₁ = G₁ − Ĝ₁; M₂ = G₂ + e₁; the warm Q is Q₁ = Ĝ₁ᵀ·p
    // (up to its sign, which cancels).
    let q1: Vec<f32> = (0..m)
        .map(|j| (0..n).map(|i| first[i * m + j] * p[i]).sum())
        .collect();
    let m2: Vec<f32> = (0..w).map(|x| g2[x] + g1[x] - first[x]).collect();
    let want = naive_rank_1_step(&m2, &q1, n, m);
    let d = max_abs_diff(&second[..w], &want);
    assert!(d <= 1e-5, "call 2 with error feedback: max |Δ| = {d:e}");

    // Without error feedback M₂ = G₂, a different answer: the check above can tell.
    let without = naive_rank_1_step(&g2[..w], &q1, n, m);
    assert!(max_abs_diff(&want, &without) > 1e-2);
    let (_, second_without) = run(false);
    let d = max_abs_diff(&second_without[..w], &without);
    assert!(d <= 1e-5, "call 2 without error feedback: max |Δ| = {d:e}");
}

#[test]
fn zoo_powersgd_refuses_a_vector_that_is_not_laid_out_as_the_parameters() {
    let layout = layer(6, 5);
    let group = InProcessGroup::new(1);
    let comm = group.handle(0);
    let mut c = compressor(PowerSgdCompressionConfig::new(), &layout, 0, 1);
    let mut unused = FlatReplica(Tensor::zeros([1], &Device::default()));
    let ctx = context(&comm, &layout, &mut unused, 1, 0);
    let wrong = host(&vec![1.0; layout.num_elements() + 1], &Device::default());
    match c.mean(&Group::world(1), wrong, &ctx) {
        Err(GymError::InvalidConfig(why)) => assert!(why.contains("PowerSGD"), "{why}"),
        Err(e) => panic!("expected InvalidConfig, got {e}"),
        Ok(_) => panic!("a vector of the wrong length was averaged"),
    }
    // Rank 0 is refused too, naming the setting.
    match PowerSgdCompressionConfig::new().with_rank(0).validate() {
        Err(GymError::InvalidConfig(why)) => assert!(why.contains("rank"), "{why}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// Trains an `input`-`hidden`-4 MLP on the synthetic task, as [`fit_small_mlp`] does.
fn fit_mlp(
    input: usize,
    hidden: usize,
    k: usize,
    steps: usize,
    strategy: &dyn StrategyConfig,
) -> FitOutput<Mlp> {
    let data = NodeData::shared(
        Synthetic::new(1024, input, 4, 1),
        Synthetic::new(64, input, 4, 2),
    );
    let config = TrainerConfig::new(k)
        .with_max_steps(Some(steps))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_seed(5);
    let init = |d: &Device| {
        MlpConfig::new()
            .with_input(input)
            .with_hidden(hidden)
            .with_classes(4)
            .init(d)
    };
    Trainer::new(config)
        .fit(init, strategy, &data, &SyntheticBatcher)
        .expect("trains")
}

/// Bytes one node sends in `steps` steps, by the paper's formula:
/// 2(K−1)/K · 4 · [Σ r(n+m) over the compressed matrices + Σ numel of the rest].
fn formula(k: usize, steps: usize, factors: usize, uncompressed: usize) -> f64 {
    2.0 * (k - 1) as f64 / k as f64 * 4.0 * (factors + uncompressed) as f64 * steps as f64
}

#[test]
fn zoo_powersgd_at_rank_1_sends_the_factors_and_the_vectors_only() {
    let (k, steps) = (4, 10);
    let rank1 = PowerSgdConfig::new()
        .with_inner(nesterov())
        .with_compression(PowerSgdCompressionConfig::new().with_rank(1));
    let allreduce = AllReduceConfig::new().with_inner(nesterov());

    // The 16-32-4 MLP: weights 16×32 and 32×4 (Burn stores d_in×d_out), biases 32 and 4.
    // At r = 1 both weights shrink more than twice: (16+32)·1·2 < 512, (32+4)·1·2 < 128.
    let layout = {
        let _guard = lock_backend_rng();
        ParamLayout::trainable(&small_mlp(&Device::default().autodiff()))
    };
    let shapes: Vec<Vec<usize>> = layout.entries().iter().map(|e| e.shape.clone()).collect();
    assert_eq!(shapes, vec![vec![16, 32], vec![32], vec![32, 4], vec![4]]);
    let (factors, vectors, n) = ((16 + 32) + (32 + 4), 32 + 4, 16 * 32 + 32 + 32 * 4 + 4);
    let sent = fit_small_mlp(k, steps, 8, 5, &rank1).report.comm[0].bytes_sent;
    let dense = fit_small_mlp(k, steps, 8, 5, &allreduce).report.comm[0].bytes_sent;
    let bound = formula(k, steps, factors, vectors);
    assert!(sent as f64 <= bound, "{sent} > {bound}");
    assert_eq!(sent as f64, bound, "no fraction to round down at K = 4");
    assert_eq!(dense as f64, formula(k, steps, n, 0));
    // On this tiny model the biases alone are 36 of 676 values: 5.6× less, not more.
    let ratio = dense as f64 / sent as f64;
    assert!((ratio - 676.0 / 120.0).abs() < 1e-9, "ratio {ratio}");
    // With `start_step` 3 (PyTorch's `start_powerSGD_iter`), the first 3 steps are exact.
    let late = PowerSgdConfig::new()
        .with_inner(nesterov())
        .with_compression(
            PowerSgdCompressionConfig::new()
                .with_rank(1)
                .with_start_step(3),
        );
    let late = fit_small_mlp(k, steps, 8, 5, &late).report.comm[0].bytes_sent;
    assert_eq!(
        late as f64,
        formula(k, 3, n, 0) + formula(k, steps - 3, factors, vectors)
    );

    // A 64-64-4 MLP: weights 64×64 and 64×4, where the matrices dominate.
    let (factors, vectors, n) = ((64 + 64) + (64 + 4), 64 + 4, 64 * 64 + 64 + 64 * 4 + 4);
    let sent = fit_mlp(64, 64, k, steps, &rank1).report.comm[0].bytes_sent;
    let dense = fit_mlp(64, 64, k, steps, &allreduce).report.comm[0].bytes_sent;
    assert!(sent as f64 <= formula(k, steps, factors, vectors));
    assert_eq!(dense as f64, formula(k, steps, n, 0));
    let ratio = dense as f64 / sent as f64;
    assert!(ratio >= 10.0, "only {ratio:.1}× less than AllReduce");
}

#[test]
fn zoo_powersgd_is_named_and_serialised() {
    let config = PowerSgdConfig::new();
    assert_eq!(config.name(), "powersgd");
    let json = config.to_json();
    assert_eq!(json["compression"]["rank"], 4);
    assert_eq!(json["compression"]["min_compression_rate"], 2.0);
    assert_eq!(json["compression"]["warm_start"], true);
    assert_eq!(json["compression"]["error_feedback"], true);
    assert_eq!(json["compression"]["start_step"], 0);
}
