//! Exact resume of every strategy: K = 4 hand-driven nodes train with deterministic
//! synthetic gradients for T steps; a second run stops after s steps, saves every node's
//! strategy state and model, and fresh strategies built from the same configurations load
//! that state and continue to T. The final parameters, masters, learning rates and traffic
//! must equal the uninterrupted run's, bit for bit. `cargo test --release --test
//! resume_strategies` (every test name holds `resume`).

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::rng::derive_seed;
use gym_core::{
    CommStats, InProcessGroup, InnerOptimizerConfig, LrScheduleConfig, ModelReplica, NodeInfo,
    OptimizerConfig, ParamLayout, ReduceOp, Replica, StateDict, StepContext, StrategyConfig,
};
use gym_models::Mlp;
use gym_strategies::compress::PowerSgdCompressionConfig;
use gym_strategies::{
    AllReduceConfig, AsyncDiLoCoConfig, AveragingCommunicatorConfig, CommunicateOptimizeConfig,
    CompressionConfig, DeMoConfig, DesLocConfig, DiLoCoCommunicatorConfig, DiLoCoConfig,
    FedAvgConfig, IndexSelectorKind, MuLoCoConfig, NoLoCoCommunicatorConfig, NoLoCoConfig,
    PowerSgdConfig, SparseCommunicatorConfig, SparseLoCoConfig, SpartaConfig, SpartaDiLoCoConfig,
    StreamingDiLoCoConfig, muloco_communicator, round_fn,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::{Mutex, OnceLock};
use tests::small_mlp;

const K: usize = 4;
const SEED: u64 = 7;
const EQUAL_SPEEDS: [f64; K] = [1.0; K];

/// Warmup then cosine, clipped: so that the schedule's position and clipping take part.
fn schedule() -> LrScheduleConfig {
    LrScheduleConfig::new()
        .with_warmup_steps(2)
        .with_cosine(true)
}

fn adamw() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new()
        .with_lr(1e-2)
        .with_schedule(schedule())
        .with_max_norm(Some(1.0))
}

fn diloco(h: usize, compression: CompressionConfig) -> DiLoCoConfig {
    DiLoCoConfig::new().with_inner(adamw()).with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(h)
            .with_compression(compression),
    )
}

fn host(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn bits(t: Tensor<1>) -> Vec<u32> {
    values(t).into_iter().map(f32::to_bits).collect()
}

/// Node `rank`'s gradient at `step`: seeded noise plus a pull on the parameters, so that
/// a state restored wrongly changes every later gradient too.
fn gradient(rank: usize, step: usize, theta: &[f32]) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(0x6AD, &[rank as u64, step as u64]));
    theta
        .iter()
        .map(|t| rng.random_range(-1.0f32..1.0) * 0.1 + 0.05 * t)
        .collect()
}

/// What a node ends with, as bits.
#[derive(Debug, Clone, PartialEq)]
struct Final {
    params: Vec<u32>,
    master: Option<Vec<u32>>,
    lr: u64,
}

/// A node stopped between two steps: what a checkpoint holds for it.
struct Stopped {
    step: usize,
    state: StateDict,
    model: Mlp,
    stats: CommStats,
}

/// How a run starts.
enum Start<'a> {
    /// From the shared initial parameters.
    Fresh,
    /// From checkpoints, loading each node's state into its fresh strategy.
    Resume(Vec<Stopped>),
    /// From checkpoints, but with fresh strategy states (to show the state matters).
    ResumeWithoutState(Vec<Stopped>),
    /// From checkpoints, loading the state saved by another strategy.
    LoadForeign(Vec<Stopped>, &'a (dyn Fn(String) + Sync)),
}

/// The flat initial parameters, the same for every node and every run (drawn once).
fn initial_params() -> Vec<f32> {
    static INITIAL: OnceLock<Vec<f32>> = OnceLock::new();
    INITIAL
        .get_or_init(|| {
            let model = gym_core::rng::init_seeded(&Device::default().autodiff(), 0, small_mlp);
            values(ParamLayout::trainable(&model).flatten(&model))
        })
        .clone()
}

/// Trains K nodes with `config` from `start` until step `until` of a run of `total` steps,
/// and returns each node's final values and checkpoint.
fn train(
    config: &dyn StrategyConfig,
    speeds: &[f64],
    total: usize,
    start: Start<'_>,
    until: usize,
) -> Vec<(Final, Stopped)> {
    let initial = initial_params();
    let (stopped, load, on_error) = match start {
        Start::Fresh => (Vec::new(), true, None),
        Start::Resume(s) => (s, true, None),
        Start::ResumeWithoutState(s) => (s, false, None),
        Start::LoadForeign(s, on_error) => (s, true, Some(on_error)),
    };
    let group = InProcessGroup::new(K);
    let slots: Vec<Mutex<Option<Stopped>>> = if stopped.is_empty() {
        (0..K).map(|_| Mutex::new(None)).collect()
    } else {
        stopped
            .into_iter()
            .enumerate()
            .map(|(rank, s)| {
                // The traffic so far, as a resumed run restores it.
                group.restore(rank, s.stats, None);
                Mutex::new(Some(s))
            })
            .collect()
    };
    let results = group
        .run(|comm| {
            let rank = comm.rank();
            let device = Device::default().autodiff();
            let host_device = device.clone().inner();
            let resumed = slots[rank].lock().unwrap().take();
            // A resumed replica is the saved model itself: its parameter ids, which key the
            // optimizers' states, are the saved ones.
            let (model, first) = match &resumed {
                Some(s) => (s.model.clone(), s.step),
                None => (small_mlp(&device), 0),
            };
            let layout = ParamLayout::trainable(&model);
            let mut replica = ModelReplica::new(model, layout.clone());
            if resumed.is_none() {
                replica.set_params(host(&initial, &host_device));
            }
            let node = NodeInfo {
                rank,
                world_size: K,
                max_steps: total,
                seed: SEED,
                device: &device,
                layout: &layout,
                initial_params: host(&initial, &host_device),
                node_speeds: speeds,
                faults: false,
            };
            let mut strategy = config.init(&node).expect("valid configuration");
            if let Some(s) = &resumed
                && load
            {
                match (strategy.load_state(&s.state), on_error) {
                    (Ok(()), None) => {}
                    (Err(e), Some(on_error)) => {
                        on_error(e.to_string());
                        return None;
                    }
                    (Ok(()), Some(_)) => panic!("rank {rank}: a foreign state was accepted"),
                    (Err(e), None) => panic!("rank {rank}: {e}"),
                }
            }
            for step in first..until {
                let mut ctx = StepContext {
                    rank,
                    world_size: K,
                    step,
                    max_steps: total,
                    replica: &mut replica,
                    collective: &comm,
                    layout: &layout,
                };
                if strategy.computes(step) {
                    let g = gradient(rank, step, &values(ctx.replica.params()));
                    strategy.step(host(&g, &host_device), &mut ctx).unwrap();
                } else {
                    strategy.idle(&mut ctx).unwrap();
                }
            }
            let state = strategy.save_state().expect("saves its state");
            let last = Final {
                params: bits(replica.params()),
                master: strategy.master_params().map(bits),
                lr: strategy.lr().to_bits(),
            };
            Some((last, state, replica.into_model()))
        })
        .expect("thread pool");
    results
        .into_iter()
        .enumerate()
        .filter_map(|(rank, r)| {
            let (last, state, model) = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"))?;
            let stats = group.stats(rank);
            Some((
                last,
                Stopped {
                    step: until,
                    state,
                    model,
                    stats,
                },
            ))
        })
        .collect()
}

fn finals(run: &[(Final, Stopped)]) -> Vec<Final> {
    run.iter().map(|(f, _)| f.clone()).collect()
}

fn stats(run: &[(Final, Stopped)]) -> Vec<CommStats> {
    run.iter().map(|(_, s)| s.stats).collect()
}

fn checkpoints(run: Vec<(Final, Stopped)>) -> Vec<Stopped> {
    run.into_iter().map(|(_, s)| s).collect()
}

/// Runs `config` for `total` steps uninterrupted, and interrupted after each of `stops`
/// steps then resumed; asserts that every resumed run ends bit for bit as the uninterrupted
/// one (parameters, masters, lr, traffic), and that resuming without the saved state does
/// not (the state matters, so the comparison has teeth).
fn assert_resumes_exactly(
    config: &dyn StrategyConfig,
    speeds: &[f64],
    total: usize,
    stops: &[usize],
) {
    let name = config.name();
    let reference = train(config, speeds, total, Start::Fresh, total);
    let want = finals(&reference);
    let initial: Vec<u32> = initial_params().into_iter().map(f32::to_bits).collect();
    assert!(
        want.iter().all(|f| f.params != initial),
        "{name}: a replica did not train"
    );
    for &stop in stops {
        let first = train(config, speeds, total, Start::Fresh, stop);
        let saved = |run: &[(Final, Stopped)]| -> Vec<Stopped> {
            run.iter()
                .map(|(_, s)| Stopped {
                    step: s.step,
                    state: s.state.clone(),
                    model: s.model.clone(),
                    stats: s.stats,
                })
                .collect()
        };
        let again = saved(&first);
        let resumed = train(
            config,
            speeds,
            total,
            Start::Resume(checkpoints(first)),
            total,
        );
        for (rank, (got, want)) in finals(&resumed).iter().zip(&want).enumerate() {
            assert!(
                got.params == want.params,
                "{name}, stopped after {stop} steps: rank {rank}'s parameters differ"
            );
            assert!(
                got.master == want.master,
                "{name}, stopped after {stop} steps: rank {rank}'s master differs"
            );
            assert_eq!(got.lr, want.lr, "{name}, stopped after {stop}: lr");
        }
        assert_eq!(
            stats(&resumed),
            stats(&reference),
            "{name}, stopped after {stop} steps: traffic"
        );
        let blank = train(
            config,
            speeds,
            total,
            Start::ResumeWithoutState(again),
            total,
        );
        assert_ne!(
            finals(&blank),
            want,
            "{name}, stopped after {stop} steps: a resume without the state ends the same"
        );
    }
}

#[test]
fn resume_allreduce_is_bit_identical() {
    // Every step communicates; 3 and 4 fall inside and after the warmup.
    assert_resumes_exactly(
        &AllReduceConfig::new().with_inner(adamw()),
        &EQUAL_SPEEDS,
        8,
        &[2, 5],
    );
}

#[test]
fn resume_diloco_is_bit_identical_between_and_at_syncs() {
    // H = 3: the steps 2, 5, 8 sync; stopping after 3 steps is right after a sync, after 4
    // in the middle of a round.
    assert_resumes_exactly(
        &diloco(3, CompressionConfig::None),
        &EQUAL_SPEEDS,
        10,
        &[3, 4],
    );
}

/// A module of one's own made of two closures ([`round_fn`]): its tensor of state (a
/// Lookahead's slow weights) is checkpointed, between rounds and at their ends.
#[test]
fn resume_a_round_fn_module_keeps_its_state() {
    let lookahead = round_fn(
        "lookahead",
        3,
        |node| node.initial_params.clone(),
        |slow, ctx| {
            let mean = ctx
                .collective
                .all_reduce(ctx.replica.params(), ReduceOp::Mean)?;
            *slow = slow.clone() + (mean - slow.clone()).mul_scalar(0.5);
            ctx.replica.set_params(slow.clone());
            Ok(())
        },
    );
    let strategy = CommunicateOptimizeConfig::new("lookahead", adamw()).with_module(lookahead);
    assert_resumes_exactly(&strategy, &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_diloco_with_int8_outer_gradients_is_bit_identical() {
    let int8 = "int8".parse().unwrap();
    assert_resumes_exactly(&diloco(3, int8), &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_diloco_with_top_k_and_error_feedback_keeps_the_residual() {
    let topk = "topk:8/64,ef".parse().unwrap();
    assert_resumes_exactly(&diloco(3, topk), &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_fedavg_with_islands_is_bit_identical() {
    let fedavg = FedAvgConfig::new().with_inner(adamw()).with_communicator(
        AveragingCommunicatorConfig::new()
            .with_sync_interval(3)
            .with_island_size(Some(2)),
    );
    assert_resumes_exactly(&fedavg, &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_fedavg_with_random_k_keeps_the_codec_call_counter() {
    // Random-k draws its positions from the codec's call counter.
    let fedavg = FedAvgConfig::new().with_inner(adamw()).with_communicator(
        AveragingCommunicatorConfig::new()
            .with_sync_interval(2)
            .with_island_size(Some(2))
            .with_compression("randomk:0.25,ef".parse().unwrap()),
    );
    assert_resumes_exactly(&fedavg, &EQUAL_SPEEDS, 9, &[3, 4]);
}

#[test]
fn resume_sparta_keeps_the_selector_position() {
    // Syncs after the steps 1, 3, 5, …: 3 steps end on a local step, 4 on a sync.
    let sparta = SpartaConfig::new().with_inner(adamw()).with_communicator(
        SparseCommunicatorConfig::new()
            .with_p(0.2)
            .with_sync_interval(2),
    );
    assert_resumes_exactly(&sparta, &EQUAL_SPEEDS, 9, &[3, 4]);
}

#[test]
fn resume_sparta_diloco_is_bit_identical() {
    let hybrid = SpartaDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sparta(
            SparseCommunicatorConfig::new()
                .with_p(0.3)
                .with_selector(IndexSelectorKind::Partitioned),
        )
        .with_diloco(DiLoCoCommunicatorConfig::new().with_sync_interval(3));
    assert_resumes_exactly(&hybrid, &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_demo_keeps_its_error_feedback_and_schedule() {
    let demo = DeMoConfig::new()
        .with_lr(1e-2)
        .with_schedule(schedule())
        .with_max_norm(Some(1.0))
        .with_compression_topk(4)
        .with_compression_chunk(8)
        .with_weight_decay(0.01);
    assert_resumes_exactly(&demo, &EQUAL_SPEEDS, 8, &[2, 5]);
}

#[test]
fn resume_streaming_diloco_between_a_prepare_and_its_sync() {
    // H = 6, F = 2, τ = 1: fragment syncs after the steps 2, 5, 8, 11, each prepared one
    // step before. Stopping after 2 or 5 steps leaves a mean in flight (saved by value);
    // after 3 is right after a sync; after 4 in between.
    let streaming = StreamingDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(6)
        .with_fragments(2)
        .with_overlap(1);
    assert_resumes_exactly(&streaming, &EQUAL_SPEEDS, 12, &[2, 3, 4, 5]);
}

#[test]
fn resume_streaming_diloco_saves_the_mean_in_flight_by_value() {
    let streaming = StreamingDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(6)
        .with_fragments(2)
        .with_overlap(1);
    let module = |run: &[(Final, Stopped)]| run[0].1.state.child("module0");
    let in_flight = train(&streaming, &EQUAL_SPEEDS, 12, Start::Fresh, 2);
    let state = module(&in_flight);
    assert_eq!(state.u64("in_flight").unwrap(), 1);
    assert_eq!(state.u64("in_flight/fragment").unwrap(), 0);
    assert_eq!(state.u64("in_flight/sync_step").unwrap(), 2);
    assert!(state.values("in_flight/mean").is_ok());
    for p in 0..2 {
        assert!(state.values(&format!("fragment{p}/outer/master")).is_ok());
    }
    let settled = train(&streaming, &EQUAL_SPEEDS, 12, Start::Fresh, 3);
    let state = module(&settled);
    assert_eq!(state.u64("in_flight").unwrap(), 0);
    assert!(state.values("in_flight/mean").is_err());
}

#[test]
fn resume_sparseloco_is_bit_identical() {
    let sparseloco = SparseLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(3)
        .with_top_k(8)
        .with_chunk(64);
    assert_resumes_exactly(&sparseloco, &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_muloco_keeps_muon_and_the_2_bit_residual() {
    let muloco = MuLoCoConfig::new().with_communicator(muloco_communicator().with_sync_interval(3));
    assert_resumes_exactly(&muloco, &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_desloc_keeps_its_moments_and_schedule() {
    // K_x = 2, K_u = 3, K_v = 4: after 3 steps u was just averaged, after 4 θ and v, after
    // 5 nothing.
    let desloc = DesLocConfig::new()
        .with_lr(1e-2)
        .with_schedule(schedule())
        .with_rho(Some(0.05))
        .with_param_interval(2)
        .with_first_moment_interval(Some(3))
        .with_second_moment_interval(Some(4));
    assert_resumes_exactly(&desloc, &EQUAL_SPEEDS, 10, &[3, 4, 5]);
}

#[test]
fn resume_noloco_keeps_phi_and_momentum() {
    let noloco = NoLoCoConfig::new().with_inner(adamw()).with_communicator(
        NoLoCoCommunicatorConfig::new()
            .with_sync_interval(3)
            .with_group_size(2),
    );
    assert_resumes_exactly(&noloco, &EQUAL_SPEEDS, 10, &[3, 4]);
}

#[test]
fn resume_async_diloco_with_a_slow_node() {
    // H = 4, the slow node takes 2 local steps per round and idles through the steps 2, 3;
    // N = K: the momentum moves every round. Stopped after 3 steps: the slow node idles
    // mid-round; after 4: right after a round; after 9: mid-round with the buffer emptied.
    let speeds = [1.0, 1.0, 1.0, 0.5];
    let async_diloco = AsyncDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(4);
    assert_resumes_exactly(&async_diloco, &speeds, 12, &[3, 4, 9]);
    // N = 3 pushes per momentum update with 4 pushes per round: the buffer G carries over
    // rounds, so the checkpoint holds a non-empty G.
    let delayed = async_diloco.with_momentum_period(Some(3));
    assert_resumes_exactly(&delayed, &speeds, 12, &[4, 8]);
}

#[test]
fn resume_powersgd_keeps_its_factors_and_errors() {
    // Exact means for the first 2 calls, then rank-2 factors with warm start.
    let powersgd = PowerSgdConfig::new()
        .with_inner(
            InnerOptimizerConfig::new()
                .with_optimizer(OptimizerConfig::sgd_momentum(0.9, true))
                .with_lr(0.05),
        )
        .with_compression(
            PowerSgdCompressionConfig::new()
                .with_rank(2)
                .with_min_compression_rate(0.0)
                .with_start_step(2),
        );
    assert_resumes_exactly(&powersgd, &EQUAL_SPEEDS, 8, &[2, 5]);
}

/// The error of loading, into `into`, what `from` saved after 4 steps.
fn foreign_load_error(from: &dyn StrategyConfig, into: &dyn StrategyConfig) -> String {
    let saved = checkpoints(train(from, &EQUAL_SPEEDS, 10, Start::Fresh, 4));
    let errors = Mutex::new(Vec::new());
    let record = |e: String| errors.lock().unwrap().push(e);
    let after = train(
        into,
        &EQUAL_SPEEDS,
        10,
        Start::LoadForeign(saved, &record),
        10,
    );
    assert!(after.is_empty(), "no node went on after a failed load");
    let errors = errors.into_inner().unwrap();
    assert_eq!(errors.len(), K);
    errors[0].clone()
}

#[test]
fn resume_from_another_strategy_is_an_error_naming_a_missing_key() {
    let diloco = diloco(3, CompressionConfig::None);
    let noloco = NoLoCoConfig::new()
        .with_inner(adamw())
        .with_communicator(NoLoCoCommunicatorConfig::new().with_sync_interval(3));
    let e = foreign_load_error(&diloco, &noloco);
    assert!(e.contains("no `module0/phi`"), "{e}");
    let e = foreign_load_error(&noloco, &diloco);
    assert!(e.contains("no `module0/outer/master`"), "{e}");
    let allreduce = AllReduceConfig::new().with_inner(adamw());
    let demo = DeMoConfig::new();
    let e = foreign_load_error(&allreduce, &demo);
    assert!(e.contains("no `steps`"), "{e}");
    let streaming = StreamingDiLoCoConfig::new()
        .with_inner(adamw())
        .with_sync_interval(6);
    // Nested state names its key with its whole path (Streaming DiLoCo's record reads its
    // fragments, then whether a mean is in flight: the first field DiLoCo's state lacks).
    let e = foreign_load_error(&diloco, &streaming);
    assert!(e.contains("no `module0/in_flight`"), "{e}");
    let desloc = DesLocConfig::new();
    let e = foreign_load_error(&demo, &desloc);
    assert!(e.contains("no `u`"), "{e}");
    let async_diloco = AsyncDiLoCoConfig::new().with_inner(adamw());
    let e = foreign_load_error(&diloco, &async_diloco);
    assert!(e.contains("no `master`") && !e.contains("/master"), "{e}");
}
