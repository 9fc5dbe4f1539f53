//! Streaming DiLoCo against DiLoCo, a naive re-implementation, its schedule on hand-driven
//! nodes, and a simulated network. `cargo test --release --test zoo_streaming`.

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{
    ComputeModel, InProcessGroup, InnerOptimizerConfig, Link, ModelReplica, Network, NodeInfo,
    OptimizerConfig, ParamLayout, ReduceOp, Replica, Result, RunReport, SimulationConfig,
    StepContext, StrategyConfig, TrainModel, Trainer, TrainerConfig,
};
use gym_strategies::communicate::{CommunicationModule, CommunicationModuleConfig, is_sync_step};
use gym_strategies::{
    CommunicateOptimizeConfig, CompressionConfig, DiLoCoCommunicatorConfig, DiLoCoConfig,
    FragmentPattern, StreamingDiLoCo, StreamingDiLoCoConfig,
};
use std::ops::Range;
use tests::{
    SyntheticBatcher, fit_small_mlp, flat_params, init_rank0, max_abs_diff, relative_error,
    small_mlp, small_mlp_data,
};

fn adamw() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new().with_lr(3e-3)
}

fn layout() -> ParamLayout {
    ParamLayout::trainable(&small_mlp(&Device::default().autodiff()))
}

/// Streaming DiLoCo with exact means and the given schedule.
fn streaming(h: usize, f: usize, tau: usize, alpha: f64) -> StreamingDiLoCoConfig {
    StreamingDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(h)
        .with_fragments(f)
        .with_overlap(tau)
        .with_mixing(alpha)
        .with_compression(CompressionConfig::None)
}

/// The flat element ranges of each fragment, from the parameter indices of `split`.
fn fragment_ranges(layout: &ParamLayout, split: &[Vec<usize>]) -> Vec<Vec<Range<usize>>> {
    split
        .iter()
        .map(|params| {
            params
                .iter()
                .map(|&i| {
                    let e = &layout.entries()[i];
                    e.offset..e.offset + e.numel
                })
                .collect()
        })
        .collect()
}

#[test]
fn zoo_streaming_with_one_fragment_no_overlap_no_mixing_is_diloco() {
    let h = 5;
    let stream = streaming(h, 1, 0, 0.0);
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(h));
    let a = fit_small_mlp(4, 23, 8, 5, &stream);
    let b = fit_small_mlp(4, 23, 8, 5, &diloco);
    tests::assert_same_training(&a, &b, 1e-6);
    assert_eq!(a.report.comm[0].all_reduce_calls, 4);
}

#[test]
fn zoo_streaming_fragment_patterns_split_the_small_mlp_as_documented() {
    // fc1.weight 512, fc1.bias 32, fc2.weight 128, fc2.bias 4 (N = 676).
    let layout = layout();
    let sizes: Vec<usize> = layout.entries().iter().map(|e| e.numel).collect();
    assert_eq!(sizes, [512, 32, 128, 4]);
    let seq = |f| FragmentPattern::Sequential.split(&layout, f);
    // Boundaries nearest p·N/F: 338 → offset 512; 225, 451 → 512, 544.
    assert_eq!(seq(1), vec![vec![0, 1, 2, 3]]);
    assert_eq!(seq(2), vec![vec![0], vec![1, 2, 3]]);
    assert_eq!(seq(3), vec![vec![0], vec![1], vec![2, 3]]);
    assert_eq!(seq(4), vec![vec![0], vec![1], vec![2], vec![3]]);
    assert_eq!(
        FragmentPattern::Strided.split(&layout, 2),
        vec![vec![0, 2], vec![1, 3]]
    );
    assert_eq!(
        FragmentPattern::Strided.split(&layout, 3),
        vec![vec![0, 3], vec![1], vec![2]]
    );
}

/// Streaming DiLoCo with τ = 0 and α = 0, written naively: the whole φ and the whole
/// Nesterov momentum kept on the host, and at each sync only fragment p's elements of both
/// are touched (so a fragment's momentum does not decay while others sync).
struct NaiveStreaming {
    h: usize,
    ranges: Vec<Vec<Range<usize>>>,
    lr: f32,
    mu: f32,
    phi: Vec<f32>,
    m: Vec<f32>,
}

struct NaiveStreamingConfig {
    h: usize,
    f: usize,
    lr: f32,
    mu: f32,
}

impl CommunicationModuleConfig for NaiveStreamingConfig {
    fn name(&self) -> String {
        "naive-streaming".into()
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        // Strided by hand: parameter i in fragment i mod F.
        let entries = node.layout.entries();
        let ranges = (0..self.f)
            .map(|p| {
                entries
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % self.f == p)
                    .map(|(_, e)| e.offset..e.offset + e.numel)
                    .collect()
            })
            .collect();
        let phi = values(node.initial_params.clone());
        Ok(Box::new(NaiveStreaming {
            h: self.h,
            ranges,
            lr: self.lr,
            mu: self.mu,
            m: vec![0.0; phi.len()],
            phi,
        }))
    }
}

impl CommunicationModule for NaiveStreaming {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        let f = self.ranges.len();
        let s = self.h / f;
        if !is_sync_step(ctx.step, s) {
            return Ok(());
        }
        let p = ((ctx.step + 1) / s - 1) % f;
        let mut theta = values(ctx.replica.params());
        let idx: Vec<usize> = self.ranges[p].iter().flat_map(|r| r.clone()).collect();
        let delta: Vec<f32> = idx.iter().map(|&i| self.phi[i] - theta[i]).collect();
        let mean = values(
            ctx.collective
                .all_reduce(host(&delta, &Device::default()), ReduceOp::Mean)?,
        );
        for (&i, d) in idx.iter().zip(mean) {
            // PyTorch's Nesterov, dampening 0: m ← μm + Δ̄; φ ← φ − η(Δ̄ + μm).
            self.m[i] = self.mu * self.m[i] + d;
            self.phi[i] -= self.lr * (d + self.mu * self.m[i]);
            theta[i] = self.phi[i];
        }
        ctx.replica.set_params(host(&theta, &Device::default()));
        Ok(())
    }
}

#[test]
fn zoo_streaming_with_fragments_syncs_each_on_its_own_offset_like_a_naive_version() {
    // H = 6, F = 2: fragment 0 after steps 2, 8, 14, …, fragment 1 after 5, 11, 17, ….
    let (h, f) = (6, 2);
    let stream = streaming(h, f, 0, 0.0).with_pattern(FragmentPattern::Strided);
    let naive =
        CommunicateOptimizeConfig::new("naive", adamw()).with_module(NaiveStreamingConfig {
            h,
            f,
            lr: 0.7,
            mu: 0.9,
        });
    let a = fit_small_mlp(4, 23, 8, 5, &stream);
    let b = fit_small_mlp(4, 23, 8, 5, &naive);
    let (pa, pb) = (flat_params(&a.model), flat_params(&b.model));
    let err = relative_error(host(&pa, &Device::default()), host(&pb, &Device::default()));
    assert!(err <= 1e-5, "relative error {err:e}");
    // Not DiLoCo: the staggering changes the run.
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(h));
    let c = flat_params(&fit_small_mlp(4, 23, 8, 5, &diloco).model);
    assert!(max_abs_diff(&pa, &c) > 1e-4);
    // The same traffic as the naive version: 7 events (steps 2, 5, …, 20).
    assert_eq!(a.report.comm, b.report.comm);
    assert_eq!(a.report.comm[0].all_reduce_calls, 7);
}

#[test]
fn zoo_streaming_bytes_per_event_are_one_fragment_and_per_round_are_diloco() {
    let (k, h, f, steps) = (4u64, 6, 3, 24);
    let layout = layout();
    let n = layout.num_elements() as u64;
    let split = FragmentPattern::Sequential.split(&layout, f);
    let frag_elems: Vec<u64> = fragment_ranges(&layout, &split)
        .iter()
        .map(|rs| rs.iter().map(|r| r.len() as u64).sum())
        .collect();
    assert_eq!(frag_elems.iter().sum::<u64>(), n);
    let ring = |elems: u64| 2 * (k - 1) * 4 * elems / k;
    // s = 2: 12 events over 24 steps, fragment p at events p, p+3, …: 4 each.
    let expected: u64 = frag_elems.iter().map(|&e| 4 * ring(e)).sum();
    let a = fit_small_mlp(k as usize, steps, 8, 5, &streaming(h, f, 0, 0.0));
    for c in &a.report.comm {
        assert_eq!(c.all_reduce_calls, 12);
        assert_eq!(c.bytes_sent, expected);
    }
    // DiLoCo with the same H: 4 events of the whole model, the same total (within the
    // floor of each fragment's share).
    let diloco = DiLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(h));
    let b = fit_small_mlp(k as usize, steps, 8, 5, &diloco);
    assert_eq!(b.report.comm[0].all_reduce_calls, 4);
    assert_eq!(b.report.comm[0].bytes_sent, 4 * ring(n));
    assert!(expected.abs_diff(4 * ring(n)) <= 4 * f as u64);
    // The peak: the largest event is the largest fragment, below the whole model.
    let peak = frag_elems.iter().copied().max().unwrap();
    assert!(ring(peak) < ring(n));
}

#[test]
fn zoo_streaming_default_sends_fp4_outer_gradients() {
    // The default codec: ⌈N_p/2⌉ + 4·⌈N_p/32⌉ bytes per node and peer, all-gathered.
    let (k, h, f, steps) = (4u64, 4, 2, 8);
    let layout = layout();
    let split = FragmentPattern::Sequential.split(&layout, f);
    let code = |e: u64| e.div_ceil(2) + 4 * e.div_ceil(32);
    let expected: u64 = fragment_ranges(&layout, &split)
        .iter()
        .map(|rs| 2 * (k - 1) * code(rs.iter().map(|r| r.len() as u64).sum()))
        .sum();
    let config = StreamingDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(h)
        .with_fragments(f);
    assert_eq!(config.overlap, 1);
    assert_eq!(config.mixing, 0.5);
    let out = fit_small_mlp(k as usize, steps, 8, 5, &config);
    for c in &out.report.comm {
        assert_eq!(c.all_gather_calls, 4);
        assert_eq!(c.all_reduce_calls, 0);
        assert_eq!(c.bytes_sent, expected);
    }
}

// ---- Nodes driven by hand ----

fn host(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [v.len()]),
        &device.clone().inner(),
    )
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// A deterministic "inner step" of node `rank` at `step`: a small rank-dependent move.
fn inner_step(rank: usize, step: usize, theta: &mut [f32]) {
    for (i, x) in theta.iter_mut().enumerate() {
        let h = (rank * 7919 + step * 104_729 + i * 31) % 1000;
        *x += (h as f32 / 1000.0 - 0.5) * 0.01 * (rank + 1) as f32;
    }
}

/// One node's record: the values handed to the module at each step (after the inner
/// step), what it wrote back, and its master at the end.
struct Trace {
    before: Vec<Vec<f32>>,
    after: Vec<Vec<f32>>,
    master: Vec<f32>,
}

/// Runs `config`'s Streaming DiLoCo module on `k` nodes of an in-process group for `steps`
/// steps, each node applying [`inner_step`] before each call.
fn drive(config: &StreamingDiLoCoConfig, k: usize, steps: usize) -> Vec<Trace> {
    let group = InProcessGroup::new(k);
    let speeds = vec![1.0; k];
    group
        .run(|comm| {
            let rank = comm.rank();
            let device = Device::default().autodiff();
            let model = small_mlp(&device);
            let layout = ParamLayout::trainable(&model);
            let initial: Vec<f32> = (0..layout.num_elements())
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let mut replica = ModelReplica::new(model, layout.clone());
            let node = NodeInfo {
                rank,
                world_size: k,
                max_steps: steps,
                seed: 3,
                device: &device,
                layout: &layout,
                initial_params: host(&initial, &device),
                node_speeds: &speeds,
                faults: false,
            };
            let mut module = StreamingDiLoCo::new(config, &node).unwrap();
            let mut theta = initial;
            let (mut before, mut after) = (Vec::new(), Vec::new());
            for step in 0..steps {
                inner_step(rank, step, &mut theta);
                replica.set_params(host(&theta, &device));
                before.push(theta.clone());
                let mut ctx = StepContext {
                    rank,
                    world_size: k,
                    step,
                    max_steps: steps,
                    replica: &mut replica,
                    collective: &comm,
                    layout: &layout,
                };
                module.communicate(&mut ctx).unwrap();
                theta = values(replica.params());
                after.push(theta.clone());
            }
            Trace {
                before,
                after,
                master: values(module.master_params().unwrap()),
            }
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

fn pick(v: &[f32], ranges: &[Range<usize>]) -> Vec<f32> {
    ranges.iter().flat_map(|r| v[r.clone()].to_vec()).collect()
}

fn mean_over(traces: &[Trace], at: impl Fn(&Trace) -> Vec<f32>) -> Vec<f32> {
    let all: Vec<Vec<f32>> = traces.iter().map(at).collect();
    (0..all[0].len())
        .map(|i| all.iter().map(|v| v[i]).sum::<f32>() / all.len() as f32)
        .collect()
}

/// Plain SGD with lr 1 as outer step: φ_p becomes the mean of the θ_p sent.
fn plain_outer(config: StreamingDiLoCoConfig) -> StreamingDiLoCoConfig {
    config
        .with_outer_optimizer(OptimizerConfig::sgd())
        .with_outer_lr(1.0)
}

#[test]
fn zoo_streaming_overlap_steps_are_overwritten_by_the_global_value() {
    // K = 2, H = 4, F = 2, τ = 1: fragment 0 prepared at steps 0, 4 and synced at 1, 5;
    // fragment 1 prepared at 2, 6 and synced at 3, 7.
    let (k, steps) = (2, 8);
    let config = plain_outer(streaming(4, 2, 1, 0.0));
    let traces = drive(&config, k, steps);
    let layout = layout();
    let frags = fragment_ranges(&layout, &FragmentPattern::Sequential.split(&layout, 2));
    for (sync, p) in [(1, 0), (3, 1), (5, 0), (7, 1)] {
        let prepare = sync - 1;
        let sent = mean_over(&traces, |t| pick(&t.before[prepare], &frags[p]));
        let latest = mean_over(&traces, |t| pick(&t.before[sync], &frags[p]));
        for t in &traces {
            let got = pick(&t.after[sync], &frags[p]);
            // Every node holds the mean of what was sent at the prepare step…
            let d = max_abs_diff(&got, &sent);
            assert!(d <= 1e-6, "sync {sync}: max |Δ| = {d:e}");
            // … not the values trained since.
            assert!(max_abs_diff(&got, &latest) > 1e-4);
            // The other fragment is untouched.
            let q = 1 - p;
            assert_eq!(
                pick(&t.after[sync], &frags[q]),
                pick(&t.before[sync], &frags[q])
            );
        }
        // Between prepare and sync, nothing is written.
        for t in &traces {
            assert_eq!(t.after[prepare], t.before[prepare]);
        }
    }
    // The replicas are identical after fragment 1's sync on fragment 1 only.
    assert_ne!(traces[0].after[7], traces[1].after[7]);
    // The master is the φ_p put back in layout order: after the last syncs, fragment 0's φ
    // is what fragment 0 got at step 5, fragment 1's what it got at step 7.
    for t in &traces {
        assert_eq!(pick(&t.master, &frags[0]), pick(&t.after[5], &frags[0]));
        assert_eq!(pick(&t.master, &frags[1]), pick(&t.after[7], &frags[1]));
    }
}

#[test]
fn zoo_streaming_mixing_keeps_a_share_of_the_local_values() {
    let (k, steps) = (2, 4);
    let layout = layout();
    let frags = fragment_ranges(&layout, &FragmentPattern::Sequential.split(&layout, 2));
    let run = |alpha| drive(&plain_outer(streaming(4, 2, 1, alpha)), k, steps);
    let (none, half, all) = (run(0.0), run(0.5), run(1.0));
    for sync in [1, 3] {
        let p = sync / 2;
        for rank in 0..k {
            let phi = pick(&none[rank].after[sync], &frags[p]);
            // α = 1: the fragment keeps its local values exactly.
            let local = pick(&all[rank].before[sync], &frags[p]);
            assert_eq!(pick(&all[rank].after[sync], &frags[p]), local);
            // α = 0.5: halfway between the global and the local values.
            let local = pick(&half[rank].before[sync], &frags[p]);
            let expected: Vec<f32> = phi
                .iter()
                .zip(&local)
                .map(|(g, l)| 0.5 * g + 0.5 * l)
                .collect();
            let got = pick(&half[rank].after[sync], &frags[p]);
            let d = max_abs_diff(&got, &expected);
            assert!(d <= 1e-6, "max |Δ| = {d:e}");
            assert!(max_abs_diff(&got, &phi) > 1e-4, "α > 0 differs from α = 0");
        }
        // With α > 0 the replicas stay apart on the synced fragment.
        assert_ne!(
            pick(&half[0].after[sync], &frags[p]),
            pick(&half[1].after[sync], &frags[p])
        );
    }
    // And in a full run.
    let a = fit_small_mlp(4, 12, 8, 5, &streaming(4, 2, 1, 0.0));
    let b = fit_small_mlp(4, 12, 8, 5, &streaming(4, 2, 1, 0.5));
    assert!(max_abs_diff(&flat_params(&a.model), &flat_params(&b.model)) > 1e-5);
}

fn simulated_fit(strategy: &dyn StrategyConfig) -> RunReport {
    let device = Device::default().autodiff();
    // A node computes one step in 0.5 s: longer than an exchange of the small MLP.
    let flops_per_s = 8.0 * small_mlp(&device).flops_per_example() / 0.5;
    let sim = SimulationConfig::new(Network::switch(Link::preset("internet").unwrap()))
        .with_compute(ComputeModel::Modelled { flops_per_s });
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(16))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_seed(5)
        .with_simulation(Some(sim));
    let data = small_mlp_data();
    Trainer::new(config)
        .fit(small_mlp, strategy, &data, &SyntheticBatcher)
        .unwrap()
        .report
}

#[test]
fn zoo_streaming_overlap_hides_communication_on_a_simulated_network() {
    let blocking = simulated_fit(&streaming(4, 2, 0, 0.5));
    let overlapped = simulated_fit(&streaming(4, 2, 1, 0.5));
    let (b, o) = (
        blocking.simulated_comm_s().unwrap(),
        overlapped.simulated_comm_s().unwrap(),
    );
    assert!(b > 0.0, "{b}");
    // One step of compute is longer than the exchange: the overlap hides all of it.
    assert!(o < 1e-9 * b.max(1.0), "overlapped {o} s vs blocking {b} s");
    assert!(
        overlapped.simulated_time_s().unwrap() < blocking.simulated_time_s().unwrap(),
        "the run finishes earlier"
    );
    assert_eq!(blocking.comm, overlapped.comm, "the same bytes");
}

fn init_error(config: &StreamingDiLoCoConfig) -> String {
    match init_rank0(config, &layout(), 2, 100) {
        Ok(_) => panic!("accepted {config:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn zoo_streaming_refuses_bad_settings_naming_them() {
    let base = || streaming(6, 2, 0, 0.0);
    let e = init_error(&base().with_fragments(4));
    assert!(
        e.contains("`sync_interval` (H = 6) must be a multiple of `fragments` (F = 4)"),
        "{e}"
    );
    let e = init_error(&base().with_overlap(3));
    assert!(e.contains("`overlap`") && e.contains("H/F = 3"), "{e}");
    let e = init_error(&base().with_mixing(1.5));
    assert!(e.contains("`mixing`"), "{e}");
    let e = init_error(&base().with_fragments(0));
    assert!(e.contains("`fragments`"), "{e}");
    // Six fragments of a four-parameter model.
    let e = init_error(&base().with_fragments(6));
    assert!(
        e.contains("`fragments`") && e.contains("4 parameters"),
        "{e}"
    );
    let e = init_error(&base().with_sync_interval(0));
    assert!(e.contains("`sync_interval`"), "{e}");
    // τ = H/F − 1 is the largest overlap accepted.
    assert!(init_rank0(&base().with_overlap(2), &layout(), 1, 10).is_ok());
}
