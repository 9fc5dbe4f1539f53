//! The planner gives the simulated seconds and bytes of training, for every strategy that
//! plans: each one trained on four simulated nodes (stragglers, jitter, islands, started
//! transfers that overlap compute, quorums that leave the late nodes out) and planned from
//! its traffic schedule alone, compared bit for bit, with the work each node lost.

use burn::tensor::Device;
use gym_core::planner::{PlanConfig, plan};
use gym_core::{GymError, ParamLayout, RunReport, SimulationConfig, StrategyConfig, Trainer};
use gym_strategies::compress::PowerSgdCompressionConfig;
use gym_strategies::{AllReduceConfig, DeMoConfig, IndexSelectorKind, PowerSgdConfig};
use tests::twin::{NODES, SEED, cluster, mlp_plan, twin_config};
use tests::twin_strategies::{
    FASTEST, GRACE, diloco_quorum, more_strategies, overlapped_strategies, shaped_strategies,
    sparta, strategies,
};
use tests::{SyntheticBatcher, small_mlp, small_mlp_data};

const STEPS: usize = 12;

fn train(strategy: &dyn StrategyConfig, sim: &SimulationConfig) -> RunReport {
    let data = small_mlp_data();
    let config = twin_config(sim.clone(), STEPS);
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

#[test]
fn planning_gives_the_simulated_time_and_bytes_of_training() {
    for (name, strategy) in strategies()
        .into_iter()
        .chain(more_strategies())
        .chain(overlapped_strategies())
        .chain(shaped_strategies())
    {
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
        shapes: None,
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
    // Shapes that do not add up to the parameters.
    refused(
        PlanConfig {
            shapes: Some(vec![vec![16, 32], vec![32]]),
            ..base.clone()
        },
        &strategy,
        "`shapes` hold 544 values",
    );
    // PowerSGD and DeMo by size alone: the shapes are needed, said by a typed error.
    let powersgd = AllReduceConfig::new().with_compression("powersgd:2".parse().unwrap());
    for shaped in [
        &powersgd as &dyn StrategyConfig,
        &PowerSgdConfig::new(),
        &DeMoConfig::new(),
    ] {
        let err = plan(&base, shaped, None).unwrap_err();
        assert!(
            matches!(err, GymError::PlanNeedsShapes { .. }),
            "{}: {err}",
            shaped.name()
        );
        assert!(err.to_string().contains("shapes"), "{err}");
    }
}

/// DeMo's and PowerSGD's payloads follow the shapes: given the shapes alone (no layout),
/// the plan is training's; a plan with another top-k, chunk or rank is not.
#[test]
fn shaped_payloads_plan_from_the_shapes_alone_and_follow_the_settings() {
    let sim = cluster();
    let (config, layout) = mlp_plan(sim.clone(), STEPS);
    let shapes: Vec<Vec<usize>> = layout.entries().iter().map(|e| e.shape.clone()).collect();
    let by_shapes = PlanConfig {
        shapes: Some(shapes),
        ..config
    };
    let powersgd = |rank: usize| {
        PowerSgdConfig::new().with_compression(PowerSgdCompressionConfig::new().with_rank(rank))
    };
    let cases: [(&dyn StrategyConfig, &dyn StrategyConfig); 3] = [
        (
            &DeMoConfig::new(),
            &DeMoConfig::new().with_compression_topk(31),
        ),
        (
            &DeMoConfig::new().with_compression_chunk(4),
            &DeMoConfig::new().with_compression_chunk(8),
        ),
        (&powersgd(2), &powersgd(3)),
    ];
    for (strategy, other) in cases {
        let trained = train(strategy, &sim);
        let plan_ = plan(&by_shapes, strategy, None).unwrap();
        assert_eq!(plan_.simulated, trained.simulated, "{}", strategy.name());
        assert_eq!(plan_.comm, trained.comm, "{}", strategy.name());
        let wrong = plan(&by_shapes, other, None).unwrap();
        assert_ne!(wrong.comm, trained.comm, "{}", strategy.name());
        assert_ne!(wrong.simulated, trained.simulated, "{}", strategy.name());
    }
}
