//! The strategies the twins ([`crate::twin`]) are trained and planned with: every strategy
//! and codec that plans by size, and those whose traffic follows the parameters' shapes
//! (DeMo, PowerSGD).

use gym_core::{QuorumRule, StrategyConfig};
use gym_strategies::{
    AllReduceConfig, AveragingCommunicatorConfig, CompressionConfig, DeMoConfig,
    DiLoCoCommunicatorConfig, DiLoCoConfig, FedAvgConfig, IndexSelectorKind, PowerSgdConfig,
    SparseCommunicatorConfig, SpartaConfig, SpartaDiLoCoConfig, StreamingDiLoCoConfig,
};
use gym_strategies::{
    AsyncDiLoCoConfig, DesLocConfig, EagerDiLoCoCommunicatorConfig, EagerDiLoCoConfig,
    FreeAsyncDiLoCoConfig, MuLoCoConfig, NoLoCoCommunicatorConfig, NoLoCoConfig, SparseLoCoConfig,
};

/// SPARTA averaging a fraction `p` of the parameters, `delay` steps late, drawn by
/// `selector`.
pub fn sparta(p: f64, delay: usize, selector: IndexSelectorKind) -> SpartaConfig {
    SpartaConfig::new().with_communicator(
        SparseCommunicatorConfig::new()
            .with_p(p)
            .with_delay(delay)
            .with_selector(selector),
    )
}

/// DiLoCo every `h` steps, its pseudo-gradients averaged through `codec` (`none`: exactly).
pub fn diloco(h: usize, codec: &str) -> DiLoCoConfig {
    DiLoCoConfig::new().with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(h)
            .with_compression(codec.parse().unwrap()),
    )
}

/// DiLoCo every `h` steps through `codec` whose outer steps wait for a quorum under `rule`.
pub fn diloco_quorum(h: usize, codec: &str, rule: QuorumRule) -> DiLoCoConfig {
    let communicator = diloco(h, codec).communicator.with_quorum(Some(rule));
    DiLoCoConfig::new().with_communicator(communicator)
}

/// Streaming DiLoCo every `h` steps in `fragments` fragments, each averaged over `overlap`
/// steps of the next round's compute.
pub fn streaming(h: usize, fragments: usize, overlap: usize) -> StreamingDiLoCoConfig {
    StreamingDiLoCoConfig::new()
        .with_sync_interval(h)
        .with_fragments(fragments)
        .with_overlap(overlap)
}

/// FedAvg every `h` steps within islands of `island_size` nodes.
pub fn fedavg_islands(h: usize, island_size: usize) -> FedAvgConfig {
    FedAvgConfig::new().with_communicator(
        AveragingCommunicatorConfig::new()
            .with_sync_interval(h)
            .with_island_size(Some(island_size)),
    )
}

/// A quorum of 2 and a grace window, which takes a third node in some rounds and not in
/// others on the twin cluster.
pub const GRACE: QuorumRule = QuorumRule::Grace {
    min: 2,
    grace_s: 0.01,
};

/// The fastest three of four.
pub const FASTEST: QuorumRule = QuorumRule::Fastest { count: 3 };

/// Every strategy and codec that plans by size (with the layout for SPARTA's draws and
/// Streaming DiLoCo's fragments): the cases the twins are trained and planned with.
pub fn strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    let int8: CompressionConfig = "int8".parse().unwrap();
    vec![
        ("allreduce", Box::new(AllReduceConfig::new())),
        (
            "allreduce int8",
            Box::new(AllReduceConfig::new().with_compression(int8)),
        ),
        ("diloco H=3", Box::new(diloco(3, "none"))),
        ("diloco H=4 top-k", Box::new(diloco(4, "topk:8/64+int8,ef"))),
        (
            "sparta random",
            Box::new(sparta(0.1, 0, IndexSelectorKind::Random)),
        ),
        (
            "sparta delayed 2, partitioned",
            Box::new(sparta(0.25, 2, IndexSelectorKind::Partitioned)),
        ),
        ("diloco H=3 bf16 ring", Box::new(diloco(3, "bf16"))),
        ("sparta-diloco", Box::new(SpartaDiLoCoConfig::new())),
        (
            "streaming diloco F=2 H=4 overlap 1",
            Box::new(streaming(4, 2, 1)),
        ),
        (
            "streaming diloco F=3 H=6 int8 overlap 1",
            Box::new(streaming(6, 3, 1).with_compression(int8)),
        ),
        ("fedavg islands of 2", Box::new(fedavg_islands(2, 2))),
        (
            "diloco H=3 quorum 2, grace",
            Box::new(diloco_quorum(3, "none", GRACE)),
        ),
        (
            "diloco H=2 fastest 3, int8",
            Box::new(diloco_quorum(2, "int8", FASTEST)),
        ),
    ]
}

/// Strategies built on the others' schedules, or with schedules of their own: MuLoCo and
/// SparseLoCo (DiLoCo's synchronisation, with their codecs: 2-bit and top-k + 2-bit over
/// the senders), DES-LOC (parameters and Adam's moments on three periods) and NoLoCo (a
/// mean within random pairs).
pub fn more_strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    let muloco = MuLoCoConfig::new();
    let muloco_sync = muloco.communicator.clone().with_sync_interval(3);
    vec![
        (
            "muloco H=3",
            Box::new(muloco.with_communicator(muloco_sync)),
        ),
        (
            "sparseloco H=4",
            Box::new(
                SparseLoCoConfig::new()
                    .with_sync_interval(4)
                    .with_chunk(64)
                    .with_top_k(8),
            ),
        ),
        (
            "desloc K_x=4, K_u=2, K_v=3",
            Box::new(
                DesLocConfig::new()
                    .with_param_interval(4)
                    .with_first_moment_interval(Some(2))
                    .with_second_moment_interval(Some(3)),
            ),
        ),
        (
            "noloco H=2 pairs",
            Box::new(
                NoLoCoConfig::new().with_communicator(
                    NoLoCoCommunicatorConfig::new()
                        .with_sync_interval(2)
                        .with_group_size(2),
                ),
            ),
        ),
    ]
}

/// Strategies whose rounds overlap the next round's compute (eager DiLoCo: each round's
/// all-reduce waited for at the next round) or whose nodes sit steps out by their speeds
/// (asynchronous DiLoCo's DyLU; free-running asynchronous DiLoCo, whose workers push when
/// their own H steps end, refused under faults by training and plan alike). Planned with
/// and without faults, with fewer fault schedules than the others.
pub fn overlapped_strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    let eager = |h: usize| {
        EagerDiLoCoConfig::new()
            .with_communicator(EagerDiLoCoCommunicatorConfig::new().with_sync_interval(h))
    };
    vec![
        ("eager diloco H=3", Box::new(eager(3))),
        ("eager diloco H=1", Box::new(eager(1))),
        (
            "async diloco H=4 DyLU",
            Box::new(AsyncDiLoCoConfig::new().with_sync_interval(4)),
        ),
        (
            "async diloco H=6 DyLU, at least 4",
            Box::new(
                AsyncDiLoCoConfig::new()
                    .with_sync_interval(6)
                    .with_min_local_steps(4),
            ),
        ),
        (
            "free async diloco H=2",
            Box::new(FreeAsyncDiLoCoConfig::new().with_sync_interval(2)),
        ),
        (
            "free async diloco H=3",
            Box::new(FreeAsyncDiLoCoConfig::new().with_sync_interval(3)),
        ),
    ]
}

/// The strategies whose payload follows each tensor's shape: DeMo (DCT chunks, top-k of
/// each) and PowerSGD (rank-r factors per matrix) under AllReduce, DiLoCo and FedAvg.
pub fn shaped_strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    let powersgd =
        |rank: usize| -> CompressionConfig { format!("powersgd:{rank}").parse().unwrap() };
    vec![
        ("demo", Box::new(DeMoConfig::new())),
        (
            "demo chunk 4, top 3",
            Box::new(
                DeMoConfig::new()
                    .with_compression_chunk(4)
                    .with_compression_topk(3),
            ),
        ),
        (
            "powersgd rank 2",
            Box::new(PowerSgdConfig::new().with_compression(
                gym_strategies::compress::PowerSgdCompressionConfig::new().with_rank(2),
            )),
        ),
        (
            "allreduce powersgd:1 from step 3",
            Box::new(
                AllReduceConfig::new().with_compression(CompressionConfig::PowerSgd(
                    gym_strategies::compress::PowerSgdCompressionConfig::new()
                        .with_rank(1)
                        .with_start_step(3),
                )),
            ),
        ),
        (
            "diloco H=3 powersgd:4",
            Box::new(
                DiLoCoConfig::new().with_communicator(
                    DiLoCoCommunicatorConfig::new()
                        .with_sync_interval(3)
                        .with_compression(powersgd(4)),
                ),
            ),
        ),
        (
            "fedavg islands of 2, powersgd:2",
            Box::new(
                FedAvgConfig::new().with_communicator(
                    AveragingCommunicatorConfig::new()
                        .with_sync_interval(2)
                        .with_island_size(Some(2))
                        .with_compression(powersgd(2)),
                ),
            ),
        ),
    ]
}
