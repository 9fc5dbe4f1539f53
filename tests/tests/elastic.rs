//! Failures as an experiment: nodes that crash, leave and rejoin, quorums that leave a late
//! node out, links that are cut. `cargo test --release -- elastic`.

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::faults::FaultSchedule;
use gym_core::{
    ComputeModel, FitOutput, Group, InProcessGroup, Network, NodeData, QuorumRule, ReduceOp,
    SharedDataset, SimulationConfig, StrategyConfig, Trainer, TrainerConfig,
};
use gym_models::Mlp;
use gym_strategies::{AllReduceConfig, DiLoCoCommunicatorConfig, DiLoCoConfig};
use std::sync::Arc;
use tests::{
    Synthetic, SyntheticBatcher, assert_same_end, flat_params, max_abs_diff, small_mlp,
    small_mlp_data,
};

fn data() -> NodeData<tests::Example> {
    small_mlp_data()
}

/// Node `r` trains on a set of its own, whatever the number of nodes: a run of 4 nodes
/// whose node 3 never shows up sees exactly the data of a run of 3.
fn per_node_data() -> NodeData<tests::Example> {
    NodeData::per_node(|rank, _, split| -> SharedDataset<tests::Example> {
        match split {
            gym_core::Split::Train => Arc::new(Synthetic::new(128, 16, 4, 100 + rank as u64)),
            _ => Arc::new(Synthetic::new(64, 16, 4, 2)),
        }
    })
}

/// A simulated internet where one step of the MLP takes about 30 ms.
fn simulation() -> SimulationConfig {
    SimulationConfig::new("internet".parse::<Network>().unwrap())
        .with_compute(ComputeModel::Modelled { flops_per_s: 1e6 })
}

fn config(k: usize, steps: usize) -> TrainerConfig {
    TrainerConfig::new(k)
        .with_max_steps(Some(steps))
        .with_batch_size(8)
        .with_val_size(Some(0))
        .with_seed(5)
}

fn faults(spec: &str) -> Option<FaultSchedule> {
    Some(spec.parse().expect("a fault spec"))
}

fn fit(config: TrainerConfig, strategy: &dyn StrategyConfig) -> FitOutput<Mlp> {
    fit_on(config, strategy, &data())
}

fn fit_on(
    config: TrainerConfig,
    strategy: &dyn StrategyConfig,
    data: &NodeData<tests::Example>,
) -> FitOutput<Mlp> {
    Trainer::new(config)
        .fit(small_mlp, strategy, data, &SyntheticBatcher)
        .expect("trains")
}

fn diloco(h: usize) -> DiLoCoConfig {
    DiLoCoConfig::new().with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(h))
}

fn correlation_after(out: &FitOutput<Mlp>, steps: usize) -> f64 {
    out.report
        .correlation
        .iter()
        .find(|c| c.step == steps)
        .unwrap_or_else(|| panic!("no correlation after {steps} steps"))
        .correlation
}

/// Random faults and scheduled ones come from the seed: two runs meet the same faults at
/// the same steps and end with the same parameters and clocks, bit for bit; another seed
/// draws other faults.
#[test]
fn elastic_same_seed_same_fault_timeline_and_parameters() {
    let schedule = "random:20000/h,down=3;slow:2@5+10x0.5;leave:1@12+4";
    let run = |seed: u64| {
        fit(
            config(4, 30)
                .with_seed(seed)
                .with_simulation(Some(simulation().with_jitter(0.2)))
                .with_faults(faults(schedule)),
            &diloco(5),
        )
    };
    let (a, b, other) = (run(5), run(5), run(6));
    let drawn = a.report.elastic.faults.len();
    assert!(drawn > 2, "random faults were drawn: {drawn} events");
    assert_same_end("same seed", &a, &b);
    assert_ne!(
        a.report.elastic.faults, other.report.elastic.faults,
        "another seed draws other faults"
    );
    let lost = a.report.node_steps_lost();
    assert!(lost >= 4, "the leave alone costs 4 node-steps, got {lost}");
    let goodput = a.report.goodput().expect("simulated");
    assert!(goodput > 0.0 && goodput < 1.0, "goodput {goodput}");
}

/// Node 1 leaves before step 3 for 10 steps (DiLoCo, H = 5): it comes back before step 13
/// with a peer's state, starting from the master, and after the synchronisation at the
/// end of step 14 every replica is the same. Its 3 inner steps before leaving are lost, and
/// the state it received went over the counted network.
#[test]
fn elastic_a_node_back_from_leave_matches_the_others_after_the_next_diloco_sync() {
    let out = fit(
        config(4, 15)
            .with_correlation_interval(Some(1))
            .with_simulation(Some(simulation()))
            .with_faults(faults("leave:1@3+10")),
        &diloco(5),
    );
    // Before the sync the replicas differ; after it, they are one.
    assert!(correlation_after(&out, 14) < 1.0 - 1e-6);
    assert!(correlation_after(&out, 15) > 1.0 - 1e-9);
    let master = flat_params(out.master.as_ref().expect("DiLoCo keeps a master"));
    let d = max_abs_diff(&flat_params(&out.model), &master);
    assert!(d < 1e-6, "the average of the replicas is the master: {d:e}");

    let node1 = out.report.elastic.nodes[1];
    assert_eq!(node1.absent_steps, 10);
    assert_eq!(
        node1.discarded_steps, 3,
        "inner steps 0–2, never synchronised"
    );
    assert_eq!(node1.rejoins, 1);
    assert!(
        node1.recovery_s > 0.0,
        "receiving the state took simulated time"
    );
    assert!(out.report.simulated[1].down_s > 0.0, "time away is counted");
    assert_eq!(out.report.node_steps_lost(), 13);
    // Parameters, master, outer momentum and Adam's two moments: at least 5 copies of the
    // 676 parameters in f32 reached node 1 beyond its one synchronisation.
    let params = master.len() as u64;
    let one_sync = 2 * 3 * params * 4 / 4;
    assert!(
        out.report.comm[1].bytes_received >= one_sync + 5 * params * 4,
        "{} bytes received",
        out.report.comm[1].bytes_received
    );
    // Node 0 served it.
    assert!(out.report.comm[0].bytes_sent > out.report.comm[2].bytes_sent);
}

/// AllReduce over the nodes present is AllReduce of the smaller world: 4 nodes whose node 3
/// crashes before the first step train exactly as 3 nodes (each node on a dataset of its
/// own), bit for bit, and a mean over a membership view equals the mean of a smaller group.
#[test]
fn elastic_allreduce_over_present_nodes_equals_a_smaller_world() {
    let strategy = AllReduceConfig::new();
    let four = fit_on(
        config(4, 12).with_faults(faults("crash:3@0")),
        &strategy,
        &per_node_data(),
    );
    let three = fit_on(config(3, 12), &strategy, &per_node_data());
    assert_eq!(flat_params(&four.model), flat_params(&three.model));
    let losses = |o: &FitOutput<Mlp>| {
        o.report
            .train
            .iter()
            .map(|r| r.train_loss.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(losses(&four), losses(&three));
    assert_eq!(four.report.elastic.nodes[3].absent_steps, 12);
    assert_eq!(
        four.report.comm[0], three.report.comm[0],
        "node 0's traffic"
    );

    // The same at the collective: node 2 away, the others' mean is a 3-node mean.
    let device = Device::default();
    let value = |r: usize| {
        Tensor::<1>::from_data(
            TensorData::new(vec![r as f32 * 0.3 + 0.1, 1.0 / (r + 3) as f32], [2]),
            &device,
        )
    };
    let present = Group::new([0, 1, 3]);
    let world = InProcessGroup::new(4);
    let viewed = world
        .run(|comm| {
            let rank = comm.rank();
            if rank == 2 {
                return None;
            }
            let view = comm.with_present(present.clone());
            let mean = view.all_reduce(value(rank), ReduceOp::Mean).unwrap();
            Some(mean.into_data().try_to_vec::<f32>().unwrap())
        })
        .unwrap();
    let small = InProcessGroup::new(3);
    let smaller = small
        .run(|comm| {
            let rank = [0, 1, 3][comm.rank()];
            let mean = comm.all_reduce(value(rank), ReduceOp::Mean).unwrap();
            mean.into_data().try_to_vec::<f32>().unwrap()
        })
        .unwrap();
    let expected = smaller[0].as_ref().unwrap().clone();
    for rank in [0, 1, 3] {
        assert_eq!(viewed[rank].as_ref().unwrap().as_ref(), Some(&expected));
    }
    assert_eq!(world.stats(0), small.stats(0), "a 3-node mean's traffic");
    assert!(world.stats(0).bytes_sent > 0);
}

/// A quorum (Decoupled DiLoCo) proceeds without a node past the grace window: node 3 runs
/// at a quarter of the speed, so it misses both synchronisations of an 8-step run. The
/// others' outer steps are those of a run where node 3 never existed (bit for bit), node 3
/// catches up by taking the same outer step, and the run ends far sooner than one that
/// waits.
#[test]
fn elastic_a_quorum_proceeds_without_a_late_node_and_it_catches_up() {
    let slow = simulation().with_node_speed(vec![1.0, 1.0, 1.0, 0.25]);
    let with = |quorum: Option<QuorumRule>| {
        DiLoCoConfig::new().with_communicator(
            DiLoCoCommunicatorConfig::new()
                .with_sync_interval(4)
                .with_quorum(quorum),
        )
    };
    let grace = QuorumRule::Grace {
        min: 3,
        grace_s: 0.01,
    };
    let run = |strategy: &DiLoCoConfig, faults_spec: Option<&str>| {
        fit_on(
            config(4, 8)
                .with_correlation_interval(Some(4))
                .with_simulation(Some(slow.clone()))
                .with_faults(faults_spec.and_then(faults)),
            strategy,
            &per_node_data(),
        )
    };
    let quorum = run(&with(Some(grace)), None);
    let fastest = run(&with(Some(QuorumRule::Fastest { count: 3 })), None);
    let without_node3 = run(&with(None), Some("crash:3@0"));
    let waits = run(&with(None), None);

    let master = |o: &FitOutput<Mlp>| flat_params(o.master.as_ref().expect("a master"));
    assert_eq!(master(&quorum), master(&without_node3));
    assert_eq!(master(&fastest), master(&without_node3));
    assert_ne!(
        master(&waits),
        master(&without_node3),
        "waiting includes node 3"
    );
    // Node 3 caught up: every replica is the master after each synchronisation.
    assert!(correlation_after(&quorum, 8) > 1.0 - 1e-9);
    let d = max_abs_diff(&flat_params(&quorum.model), &master(&quorum));
    assert!(d < 1e-6, "{d:e}");
    let node3 = quorum.report.elastic.nodes[3];
    assert_eq!(
        node3.discarded_steps, 8,
        "both of node 3's rounds were dropped"
    );
    assert_eq!(quorum.report.elastic.nodes[0].discarded_steps, 0);
    let (t_quorum, t_waits) = (
        quorum.report.simulated_time_s().unwrap(),
        waits.report.simulated_time_s().unwrap(),
    );
    // Nobody waits for node 3, and node 3 stops when each round closes without it: the run
    // takes the fast nodes' time, well under a quarter-speed node's.
    assert!(t_quorum < 0.5 * t_waits, "{t_quorum} vs {t_waits}");
    // The fast nodes end together; node 3 one catch-up transfer later (one 50 ms latency
    // of the simulated internet and 2.7 kB), not a quarter-speed round later.
    let clocks: Vec<f64> = quorum.report.simulated.iter().map(|t| t.now_s).collect();
    assert!(clocks[..3].iter().all(|&c| c == clocks[0]), "{clocks:?}");
    let behind = clocks[3] - clocks[0];
    assert!(behind > 0.0 && behind < 0.06, "{clocks:?}");
}

/// A cut between two islands splits an AllReduce run in two halves that train apart; when
/// it heals, the far half (the side without node 0, on a tie) takes node 0's state and the
/// replicas are one again.
#[test]
fn elastic_a_cut_splits_the_cluster_and_the_far_side_rejoins() {
    let islands = SimulationConfig::new(
        "1gbit:1ms"
            .parse::<Network>()
            .unwrap()
            .with_topology("islands:2:internet".parse().unwrap()),
    )
    .with_compute(ComputeModel::Modelled { flops_per_s: 1e6 });
    let out = fit(
        config(4, 10)
            .with_correlation_interval(Some(1))
            .with_simulation(Some(islands))
            .with_faults(faults("cut:0-1@2+4")),
        &AllReduceConfig::new(),
    );
    assert!(correlation_after(&out, 2) > 1.0 - 1e-9, "one cluster");
    assert!(correlation_after(&out, 6) < 1.0 - 1e-6, "two halves");
    assert!(correlation_after(&out, 7) > 1.0 - 1e-9, "healed");
    let ledger = &out.report.elastic.nodes;
    assert_eq!(
        ledger.iter().map(|n| n.rejoins).collect::<Vec<_>>(),
        vec![0, 0, 1, 1]
    );
    assert_eq!(out.report.node_steps_lost(), 0, "no node was away");
}

/// Bad schedules are typed errors before any step: a rank or step out of range, a cut
/// without islands, a schedule that leaves nobody.
#[test]
fn elastic_bad_fault_schedules_are_configuration_errors() {
    let refuse = |spec: &str, needle: &str| {
        let err = Trainer::new(config(4, 10).with_faults(faults(spec)))
            .fit(small_mlp, &diloco(5), &data(), &SyntheticBatcher)
            .err()
            .unwrap_or_else(|| panic!("`{spec}` was accepted"));
        assert!(
            matches!(err, gym_core::GymError::InvalidConfig(_)),
            "{spec}: {err}"
        );
        assert!(err.to_string().contains(needle), "{spec}: {err}");
    };
    refuse("crash:7@2", "crash:7@2");
    refuse("leave:1@10+2", "leave:1@10+2");
    refuse("cut:0-1@2+2", "islands");
    refuse("crash:0@1;crash:1@1;crash:2@1;crash:3@1", "no node");
    refuse("random:5/h", "simulated time");
}

/// A run with faults resumes from a checkpoint exactly: a node away across the checkpoint,
/// a rejoin after it, a quorum leaving a slow node out. Models, masters, ledgers, traffic
/// and clocks equal the run left alone.
#[test]
fn elastic_a_run_with_faults_resumes_bit_for_bit() {
    let strategy = DiLoCoConfig::new().with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(5)
            .with_quorum(Some(QuorumRule::Grace {
                min: 2,
                grace_s: 0.005,
            })),
    );
    let base = || {
        config(4, 20)
            .with_simulation(Some(simulation().with_jitter(0.2)))
            .with_faults(faults("leave:1@5+6;slow:3@0+20x0.5;crash:2@16"))
    };
    let alone = fit(base(), &strategy);
    let dir = std::env::temp_dir().join(format!("gym-elastic-resume-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let saved = fit(
        base()
            .with_log_dir(Some(dir.to_string_lossy().into_owned()))
            .with_run_name(Some("run".into()))
            .with_checkpoint_interval(Some(1))
            .with_keep_checkpoints(20),
        &strategy,
    );
    for next_step in [7, 11, 17] {
        let file = dir
            .join("run")
            .join(gym_core::checkpoint::Checkpoint::file_name(next_step));
        let resumed = fit(
            base().with_resume_from(Some(file.to_string_lossy().into_owned())),
            &strategy,
        );
        for (what, run) in [("checkpointing", &saved), ("resumed", &resumed)] {
            assert_same_end(&format!("{what} at {next_step}"), run, &alone);
        }
    }
    assert!(alone.report.elastic.nodes[1].rejoins == 1 && alone.report.node_steps_lost() > 10);
    std::fs::remove_dir_all(&dir).ok();
}

/// A quorum with compressed outer gradients (int8 with error feedback): the members'
/// compressed mean goes to the late node as it is, so the late node still holds the
/// members' master after each round, and it sends nothing of its own.
#[test]
fn elastic_a_quorum_with_compression_keeps_the_late_node_in_step() {
    use gym_strategies::{Codec, CompressionConfig, Quantizer};
    let strategy = DiLoCoConfig::new().with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(4)
            .with_compression(CompressionConfig::with_error_feedback(Codec::Dense(
                Quantizer::Int8 { chunk: 64 },
            )))
            .with_quorum(Some(QuorumRule::Fastest { count: 3 })),
    );
    let out = fit_on(
        config(4, 8)
            .with_correlation_interval(Some(4))
            .with_simulation(Some(
                simulation().with_node_speed(vec![1.0, 1.0, 1.0, 0.25]),
            )),
        &strategy,
        &per_node_data(),
    );
    assert!(correlation_after(&out, 8) > 1.0 - 1e-9);
    let d = max_abs_diff(
        &flat_params(&out.model),
        &flat_params(out.master.as_ref().unwrap()),
    );
    assert!(d < 1e-6, "{d:e}");
    assert_eq!(out.report.elastic.nodes[3].discarded_steps, 8);
    // Node 3 only received: the members' codes and the catch-up means.
    assert!(out.report.comm[3].bytes_sent < out.report.comm[0].bytes_sent / 4);
}

/// More nodes than compute permits take turns (`concurrent_nodes`), and a node waiting in
/// a collective hands its permit on: with one permit, two, or one per node, the same fault
/// timeline, clocks, traffic and parameters, bit for bit, and no run waits forever.
#[test]
fn elastic_nodes_taking_turns_change_nothing() {
    let schedule = "random:20000/h,down=3;slow:2@5+10x0.5;leave:1@12+4;crash:3@20";
    let strategies: [&dyn StrategyConfig; 2] = [&diloco(5), &AllReduceConfig::new()];
    for strategy in strategies {
        let run = |permits: usize| {
            fit(
                config(4, 24)
                    .with_concurrent_nodes(Some(permits))
                    .with_simulation(Some(simulation().with_jitter(0.2)))
                    .with_faults(faults(schedule)),
                strategy,
            )
        };
        let free = run(4);
        for permits in [1, 2] {
            let turns = run(permits);
            let name = strategy.name();
            assert_eq!(
                turns.report.elastic, free.report.elastic,
                "{name} {permits}"
            );
            assert_eq!(
                flat_params(&turns.model),
                flat_params(&free.model),
                "{name}"
            );
            assert_eq!(turns.report.simulated, free.report.simulated, "{name}");
            assert_eq!(turns.report.comm, free.report.comm, "{name}");
        }
    }
}
