//! The planner gives the simulated seconds and bytes of training, for every strategy that
//! plans: each one trained on four simulated nodes (stragglers, jitter, islands, started
//! transfers that overlap compute, quorums that leave the late nodes out) and planned from
//! its traffic schedule alone, compared bit for bit, with the work each node lost.

use burn::tensor::Device;
use gym_core::planner::{PlanConfig, plan};
use gym_core::{
    GymError, NodeData, ParamLayout, QuorumRule, RunReport, SimulationConfig, StrategyConfig,
    Trainer, TrainerConfig,
};
use gym_strategies::{
    AllReduceConfig, AveragingCommunicatorConfig, CompressionConfig, DiLoCoCommunicatorConfig,
    DiLoCoConfig, FedAvgConfig, IndexSelectorKind, SparseCommunicatorConfig, SpartaConfig,
    SpartaDiLoCoConfig, StreamingDiLoCoConfig,
};
use tests::twin::{BATCH, NODES, SEED, cluster, mlp_plan};
use tests::{Synthetic, SyntheticBatcher, small_mlp};

const STEPS: usize = 12;

fn train(strategy: &dyn StrategyConfig, sim: &SimulationConfig) -> RunReport {
    let data = NodeData::shared(Synthetic::new(1024, 16, 4, 1), Synthetic::new(64, 16, 4, 2));
    let config = TrainerConfig::new(NODES)
        .with_max_steps(Some(STEPS))
        .with_batch_size(BATCH)
        .with_val_size(Some(0))
        .with_seed(SEED)
        .with_simulation(Some(sim.clone()));
    Trainer::new(config)
        .fit(small_mlp, strategy, &data, &SyntheticBatcher)
        .expect("trains")
        .report
}

fn planned(
    strategy: &dyn StrategyConfig,
    sim: &SimulationConfig,
    exact_layout: bool,
) -> Result<RunReport, GymError> {
    let (config, layout) = mlp_plan(sim.clone(), STEPS);
    plan(&config, strategy, exact_layout.then_some(&layout))
}

fn sparta(p: f64, delay: usize, selector: IndexSelectorKind) -> SpartaConfig {
    SpartaConfig::new().with_communicator(
        SparseCommunicatorConfig::new()
            .with_p(p)
            .with_delay(delay)
            .with_selector(selector),
    )
}

/// DiLoCo every `h` steps through `codec` whose outer steps wait for a quorum under `rule`.
fn diloco_quorum(h: usize, codec: &str, rule: QuorumRule) -> DiLoCoConfig {
    DiLoCoConfig::new().with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(h)
            .with_compression(codec.parse().unwrap())
            .with_quorum(Some(rule)),
    )
}

/// A quorum of 2 and a grace window, which takes a third node in some rounds and not in
/// others on the twin cluster.
const GRACE: QuorumRule = QuorumRule::Grace {
    min: 2,
    grace_s: 0.01,
};

/// The fastest three of four.
const FASTEST: QuorumRule = QuorumRule::Fastest { count: 3 };

fn strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    let int8: CompressionConfig = "int8".parse().unwrap();
    let topk: CompressionConfig = "topk:8/64+int8,ef".parse().unwrap();
    vec![
        ("allreduce", Box::new(AllReduceConfig::new())),
        (
            "allreduce int8",
            Box::new(AllReduceConfig::new().with_compression(int8)),
        ),
        (
            "diloco H=3",
            Box::new(
                DiLoCoConfig::new()
                    .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(3)),
            ),
        ),
        (
            "diloco H=4 top-k",
            Box::new(
                DiLoCoConfig::new().with_communicator(
                    DiLoCoCommunicatorConfig::new()
                        .with_sync_interval(4)
                        .with_compression(topk),
                ),
            ),
        ),
        (
            "sparta random",
            Box::new(sparta(0.1, 0, IndexSelectorKind::Random)),
        ),
        (
            "sparta delayed 2, partitioned",
            Box::new(sparta(0.25, 2, IndexSelectorKind::Partitioned)),
        ),
        (
            "diloco H=3 bf16 ring",
            Box::new(
                DiLoCoConfig::new().with_communicator(
                    DiLoCoCommunicatorConfig::new()
                        .with_sync_interval(3)
                        .with_compression("bf16".parse().unwrap()),
                ),
            ),
        ),
        ("sparta-diloco", Box::new(SpartaDiLoCoConfig::new())),
        (
            "streaming diloco F=2 H=4 overlap 1",
            Box::new(
                StreamingDiLoCoConfig::new()
                    .with_sync_interval(4)
                    .with_fragments(2)
                    .with_overlap(1),
            ),
        ),
        (
            "streaming diloco F=3 H=6 int8 no overlap",
            Box::new(
                StreamingDiLoCoConfig::new()
                    .with_sync_interval(6)
                    .with_fragments(3)
                    .with_compression(int8),
            ),
        ),
        (
            "fedavg islands of 2",
            Box::new(
                FedAvgConfig::new().with_communicator(
                    AveragingCommunicatorConfig::new()
                        .with_sync_interval(2)
                        .with_island_size(Some(2)),
                ),
            ),
        ),
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

#[test]
fn planning_gives_the_simulated_time_and_bytes_of_training() {
    for (name, strategy) in strategies() {
        let sim = cluster();
        let trained = train(&*strategy, &sim);
        let plan = planned(&*strategy, &sim, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(plan.simulated, trained.simulated, "{name}: clocks");
        assert_eq!(plan.comm, trained.comm, "{name}: traffic");
        assert_eq!(plan.elastic, trained.elastic, "{name}: work lost");
        assert_eq!(plan.goodput(), trained.goodput(), "{name}: goodput");
        assert!(
            trained.simulated_comm_s().unwrap() > 0.0,
            "{name}: the case exercises communication"
        );
    }
}

/// The quorum cases leave nodes out, not always the same number, and the plan follows:
/// without the quorum the clocks differ, and the late nodes' lost work lowers the goodput.
#[test]
fn a_quorum_is_decided_from_the_planned_clocks() {
    let sim = cluster();
    for rule in [GRACE, FASTEST] {
        let quorum = diloco_quorum(3, "none", rule);
        let trained = train(&quorum, &sim);
        let lost = trained.elastic.total();
        assert!(lost.discarded_steps > 0, "{rule}: someone is late");
        let plan = planned(&quorum, &sim, true).unwrap();
        assert_eq!(plan.elastic, trained.elastic, "{rule}");
        let all = planned(
            &quorum
                .clone()
                .with_communicator(quorum.communicator.clone().with_quorum(None)),
            &sim,
            true,
        )
        .unwrap();
        assert_ne!(
            plan.simulated, all.simulated,
            "{rule}: the quorum changes the clocks"
        );
        assert!(
            plan.goodput().unwrap() < plan.compute_utilisation().unwrap(),
            "{rule}"
        );
    }
    // The grace window takes a third node in some rounds only: rounds of 2 and of 3.
    let trained = train(&diloco_quorum(3, "none", GRACE), &sim);
    let late: Vec<u64> = trained
        .elastic
        .nodes
        .iter()
        .map(|n| n.discarded_steps)
        .collect();
    let rounds = (STEPS / 3) as u64;
    let left_out: u64 = late.iter().sum::<u64>() / 3;
    assert!(left_out > rounds && left_out < 2 * rounds, "{late:?}");
}

/// Without the model's layout, a cyclic selection still counts exactly, and a random one
/// its expected size (within a few per cent of what was drawn here).
#[test]
fn planning_by_size_alone() {
    let sim = cluster();
    let cyclic = sparta(0.25, 1, IndexSelectorKind::ShuffledSequential);
    let by_layout = planned(&cyclic, &sim, true).unwrap();
    let by_size = planned(&cyclic, &sim, false).unwrap();
    // The MLP's parameters are cut one by one, the size-only plan as one: counts agree
    // within one value per parameter and part.
    let (a, b) = (
        by_layout.bytes_sent_per_node(),
        by_size.bytes_sent_per_node(),
    );
    assert!((a - b).abs() / a < 0.01, "{a} vs {b}");
    let random = sparta(0.1, 0, IndexSelectorKind::Random);
    let (a, b) = (
        planned(&random, &sim, true).unwrap().bytes_sent_per_node(),
        planned(&random, &sim, false).unwrap().bytes_sent_per_node(),
    );
    assert!((a - b).abs() / a < 0.05, "{a} vs {b}");
}

#[test]
fn a_plan_refuses_what_it_cannot_run() {
    let sim = cluster();
    let strategy = AllReduceConfig::new();
    let model = small_mlp(&Device::default().autodiff());
    let base = PlanConfig {
        num_nodes: NODES,
        steps: STEPS,
        seed: SEED,
        params: ParamLayout::trainable(&model).num_elements() as u64,
        step_flops: 1e6,
        simulation: sim.clone(),
        faults: None,
        rejoin_bytes: Default::default(),
    };
    let refused = |config: PlanConfig, strategy: &dyn StrategyConfig, needle: &str| {
        let err = plan(&config, strategy, None).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    };
    refused(
        PlanConfig {
            num_nodes: 0,
            ..base.clone()
        },
        &strategy,
        "num_nodes",
    );
    refused(
        PlanConfig {
            steps: 0,
            ..base.clone()
        },
        &strategy,
        "steps",
    );
    refused(
        PlanConfig {
            params: 0,
            ..base.clone()
        },
        &strategy,
        "params",
    );
    refused(
        PlanConfig {
            step_flops: f64::NAN,
            ..base.clone()
        },
        &strategy,
        "FLOPs",
    );
    // Four speed factors for five nodes.
    refused(
        PlanConfig {
            num_nodes: 5,
            ..base.clone()
        },
        &strategy,
        "node_speed",
    );
    let powersgd = AllReduceConfig::new().with_compression("powersgd:2".parse().unwrap());
    refused(base.clone(), &powersgd, "PowerSGD");
    let demo = gym_strategies::DeMoConfig::new();
    refused(base, &demo, "cannot be planned");
}
