//! The planner runs fault schedules as training does: nodes that leave and rejoin (catching
//! up with their source's clock and receiving its state, with the transfers it holds in
//! flight), crash, run slow, fail at random, or lose the link between islands. Each
//! strategy that plans (DeMo and PowerSGD from the model's shapes) is trained on four simulated nodes and planned; clocks (with the
//! time away), bytes and the work each node lost agree bit for bit.

use gym_core::faults::FaultSchedule;
use gym_core::planner::{PlanConfig, RejoinBytes, plan};
use gym_core::{GymError, QuorumRule, RunReport, StrategyConfig, Trainer};
use gym_strategies::{AllReduceConfig, IndexSelectorKind, SpartaDiLoCoConfig};
use tests::twin::{checkpointed, cluster, mlp_plan, state_sizes, twin_config};
use tests::twin_strategies::{GRACE, diloco, diloco_quorum, fedavg_islands, sparta, streaming};
use tests::twin_strategies::{more_strategies, overlapped_strategies, shaped_strategies};
use tests::{SyntheticBatcher, small_mlp, small_mlp_data};

const STEPS: usize = 12;

/// Trains `strategy` under `faults` (checkpointing every step into `dir`, which changes
/// nothing of the run); returns its report and the size of every node's encoded state
/// before every step after 0: what a rejoin's source sends.
fn train(
    strategy: &dyn StrategyConfig,
    faults: &FaultSchedule,
    dir: &std::path::Path,
) -> (RunReport, RejoinBytes) {
    let data = small_mlp_data();
    let config = twin_config(cluster(), STEPS).with_faults(Some(faults.clone()));
    let report = Trainer::new(checkpointed(config, STEPS, dir))
        .fit(small_mlp, strategy, &data, &SyntheticBatcher)
        .expect("trains")
        .report;
    (report, state_sizes(STEPS, dir))
}

fn planned(
    strategy: &dyn StrategyConfig,
    faults: &FaultSchedule,
    rejoin_bytes: RejoinBytes,
) -> Result<RunReport, GymError> {
    let (config, layout) = mlp_plan(cluster(), STEPS);
    let config = PlanConfig {
        faults: Some(faults.clone()),
        rejoin_bytes,
        ..config
    };
    plan(&config, strategy, Some(&layout))
}

fn strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    vec![
        ("allreduce", Box::new(AllReduceConfig::new())),
        (
            "allreduce int8",
            Box::new(AllReduceConfig::new().with_compression("int8".parse().unwrap())),
        ),
        ("diloco H=3", Box::new(diloco(3, "none"))),
        ("diloco H=4 top-k", Box::new(diloco(4, "topk:8/64+int8,ef"))),
        ("fedavg islands of 2", Box::new(fedavg_islands(2, 2))),
        (
            "sparta random",
            Box::new(sparta(0.1, 0, IndexSelectorKind::Random)),
        ),
        ("sparta-diloco", Box::new(SpartaDiLoCoConfig::new())),
        (
            "sparta delayed 2, partitioned",
            Box::new(sparta(0.25, 2, IndexSelectorKind::Partitioned)),
        ),
        (
            "sparta random delayed 1",
            Box::new(sparta(0.1, 1, IndexSelectorKind::Random)),
        ),
        (
            "streaming diloco F=2 H=4 overlap 1",
            Box::new(streaming(4, 2, 1)),
        ),
        (
            "streaming diloco F=2 H=6 overlap 2",
            Box::new(streaming(6, 2, 2)),
        ),
        (
            "diloco H=3 quorum 2, grace",
            Box::new(diloco_quorum(3, "none", GRACE)),
        ),
        (
            "diloco H=2 fastest 2, int8",
            Box::new(diloco_quorum(2, "int8", QuorumRule::Fastest { count: 2 })),
        ),
    ]
}

/// Schedules: a leave and its rejoin, a crash, a slow node, random failures, a cut between
/// the islands (each half carries on; the smaller side takes the other's state when it
/// heals), and all at once.
const FAULTS: &[&str] = &[
    "leave:1@3+2",
    "crash:2@5",
    "slow:2@2+4x0.5",
    "random:20000/h,down=2",
    "cut:0-1@4+3",
    "leave:0@2+3;slow:3@0+12x0.7;cut:0-1@7+2;crash:1@9",
];

/// Trains `strategy` under the fault schedule `spec` and plans it: clocks, traffic, the work
/// lost and goodput must be equal, and faults must have happened.
fn plans_as_it_trains(
    name: &str,
    strategy: &dyn StrategyConfig,
    spec: &str,
    dir: &std::path::Path,
) {
    let faults: FaultSchedule = spec.parse().unwrap();
    let (trained, rejoin_bytes) = train(strategy, &faults, dir);
    let case = format!("{name} under {spec}");
    let plan = planned(strategy, &faults, rejoin_bytes).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(plan.simulated, trained.simulated, "{case}: clocks");
    assert_eq!(plan.comm, trained.comm, "{case}: traffic");
    assert_eq!(plan.elastic, trained.elastic, "{case}: work lost");
    assert_eq!(plan.goodput(), trained.goodput(), "{case}: goodput");
    assert!(!trained.elastic.faults.is_empty(), "{case}: faults happen");
}

#[test]
fn planning_under_faults_gives_the_simulated_time_and_bytes_of_training() {
    let dir = std::env::temp_dir().join(format!("gym-planner-faults-{}", std::process::id()));
    for (name, strategy) in strategies()
        .into_iter()
        .chain(more_strategies())
        .chain(shaped_strategies())
    {
        for spec in FAULTS {
            plans_as_it_trains(name, &*strategy, spec, &dir);
        }
    }
    // The cases exercise what they are meant to: time away and a rejoin's broadcast.
    let faults: FaultSchedule = "leave:1@3+2".parse().unwrap();
    let (trained, _) = train(&AllReduceConfig::new(), &faults, &dir);
    let away = trained.simulated[1].down_s;
    assert!(away > 0.0, "{away}");
    assert!(trained.comm[1].broadcast_calls == 1);
}

/// The strategies whose rounds overlap the next round (eager DiLoCo) or whose nodes sit
/// steps out (asynchronous DiLoCo), under two schedules:
/// a leave with a slow node (the node away keeps its share of the round in flight, and
/// holds its source's when it comes back), and a cut with a crash.
#[test]
fn overlapped_rounds_plan_under_faults_as_they_train() {
    let dir = std::env::temp_dir().join(format!("gym-planner-overlap-{}", std::process::id()));
    for (name, strategy) in overlapped_strategies() {
        for spec in ["leave:1@3+2;slow:2@0+12x0.6", "cut:0-1@4+3;crash:3@9"] {
            let faults: FaultSchedule = spec.parse().unwrap();
            if name.starts_with("free async") {
                // Training refuses a fault schedule (a worker away would leave the server
                // waiting for its push), and so does the plan, naming it.
                let err = planned(&*strategy, &faults, RejoinBytes::default()).unwrap_err();
                assert!(err.to_string().contains("fault schedule"), "{name}: {err}");
                continue;
            }
            plans_as_it_trains(name, &*strategy, spec, &dir);
        }
    }
}

/// A node that comes back with nobody to copy from (its whole part of a cut cluster was
/// away) while it holds a transfer in flight is refused, naming the node and the step:
/// what it waits for next is the strategy's own state. Training runs it; the plan does not
/// pretend to. Without that transfer, or with a peer to copy from, the same faults plan.
#[test]
fn a_node_back_with_nobody_to_copy_from_and_a_transfer_in_flight_is_refused() {
    // Island 0 (nodes 0 and 1) leaves after step 2 and comes back at step 5 cut off from
    // island 1: nobody there was present at step 4.
    let faults: FaultSchedule = "leave:0@3+2;leave:1@3+2;cut:0-1@4+3".parse().unwrap();
    let delayed = sparta(0.25, 2, IndexSelectorKind::Partitioned);
    let err = planned(&delayed, &faults, RejoinBytes::Each(1000))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node 0") && err.contains("step 5") && err.contains("nobody"),
        "{err}"
    );
    let at_once = sparta(0.25, 0, IndexSelectorKind::Partitioned);
    assert!(planned(&at_once, &faults, RejoinBytes::Each(1000)).is_ok());
    let peer: FaultSchedule = "leave:0@3+2;cut:0-1@4+3".parse().unwrap();
    assert!(planned(&delayed, &peer, RejoinBytes::Each(1000)).is_ok());
}

/// A schedule the run cannot take is refused as training refuses it.
#[test]
fn a_fault_schedule_that_does_not_fit_is_refused() {
    let strategy = AllReduceConfig::new();
    for (spec, needle) in [
        ("crash:7@2", "rank 7"),
        ("leave:1@30+2", "step 30"),
        ("crash:0@1;crash:1@1;crash:2@1;crash:3@1", "no node present"),
    ] {
        let faults: FaultSchedule = spec.parse().unwrap();
        let err = planned(&strategy, &faults, RejoinBytes::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{spec}: {err}");
    }
}
