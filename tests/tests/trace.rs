//! The timeline (`TrainerConfig::trace`, `--trace`): `trace.json` read with a plain JSON
//! reader ([`tests::trace_file`]). On four simulated nodes with islands, a straggler, jitter
//! and Streaming DiLoCo's overlapped transfers, every node's main track tiles its clock and
//! each category sums to its figure; the link tracks hold the transfers that ran behind
//! compute; flows join the members of each collective; the planner draws the same events;
//! a fault draws `down` time and a rejoin's transfer; a trace past its cap merges steps and
//! keeps every sum.

use gym_core::faults::FaultSchedule;
use gym_core::planner::{PlanConfig, RejoinBytes, plan_traced};
use gym_core::{
    NodeData, QuorumRule, RunReport, SimulatedTime, StrategyConfig, Trainer, TrainerConfig,
};
use gym_strategies::{
    AllReduceConfig, DiLoCoCommunicatorConfig, DiLoCoConfig, StreamingDiLoCoConfig,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tests::trace_file::{self, CATEGORIES, NodeTrack};
use tests::twin::{BATCH, NODES, SEED, cluster, mlp_plan};
use tests::{Synthetic, SyntheticBatcher, small_mlp, small_mlp_data};

fn streaming() -> StreamingDiLoCoConfig {
    StreamingDiLoCoConfig::new()
        .with_sync_interval(4)
        .with_fragments(2)
        .with_overlap(1)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-trace-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// Trains the synthetic MLP with a trace; returns the report and the parsed trace.
fn traced_fit(
    name: &str,
    config: TrainerConfig,
    strategy: &dyn StrategyConfig,
) -> (RunReport, Value) {
    let dir = temp_dir(name);
    let data = small_mlp_data();
    let config = config
        .with_batch_size(BATCH)
        .with_val_size(Some(0))
        .with_seed(SEED)
        .with_log_dir(Some(dir.to_string_lossy().into_owned()))
        .with_run_name(Some("run".into()))
        .with_trace(true);
    let report = Trainer::new(config)
        .fit(small_mlp, strategy, &data, &SyntheticBatcher)
        .expect("trains")
        .report;
    let path = report.trace.clone().expect("the trace's path");
    assert_eq!(path, dir.join("run/trace.json"));
    let trace = trace_file::read(&path);
    std::fs::remove_dir_all(&dir).ok();
    (report, trace)
}

/// Plans the synthetic MLP's set-up (under `faults`, a rejoin's source sending
/// `rejoin_bytes`); returns the report and the trace written with `max_events`.
fn traced_plan(
    strategy: &dyn StrategyConfig,
    steps: usize,
    max_events: Option<usize>,
    (faults, rejoin_bytes): (Option<FaultSchedule>, u64),
) -> (RunReport, Value) {
    let (config, layout) = mlp_plan(cluster(), steps);
    let config = PlanConfig {
        faults,
        rejoin_bytes: RejoinBytes::Each(rejoin_bytes),
        ..config
    };
    let (report, trace) = plan_traced(&config, strategy, Some(&layout)).expect("plans");
    let dir = temp_dir(&format!("plan-{steps}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.json");
    match max_events {
        Some(cap) => trace.write_capped(&path, cap),
        None => trace.write(&path),
    }
    .expect("writes");
    let parsed = trace_file::read(&path);
    std::fs::remove_dir_all(&dir).ok();
    (report, parsed)
}

/// Each node's main track sums to its clock, category by category, to a microsecond, and
/// ends at its clock.
fn assert_sums(tracks: &[NodeTrack], clocks: &[SimulatedTime]) {
    assert_eq!(tracks.len(), clocks.len());
    for (rank, (track, clock)) in tracks.iter().zip(clocks).enumerate() {
        let figures = [clock.compute_s, clock.comm_s, clock.idle_s, clock.down_s];
        for ((cat, sum), figure) in CATEGORIES.iter().zip(track.sums).zip(figures) {
            assert!(
                (sum - figure * 1e6).abs() < 1.0,
                "node {rank} {cat}: {sum} µs in the trace, {figure} s on the clock"
            );
        }
        assert!(
            (track.end_us - clock.now_s * 1e6).abs() < 1.0,
            "node {rank}"
        );
        let total: f64 = track.sums.iter().sum();
        assert!((total - clock.now_s * 1e6).abs() < 1.0, "node {rank}");
    }
}

/// The events two traces must share: every node's spans, transfers, byte counters and
/// flows (not the loss, nor the real time, which a plan has not).
fn node_events(trace: &Value) -> Vec<Value> {
    let run_pid = trace["otherData"]["nodes"].as_array().unwrap().len() as u64 + 1;
    trace_file::events(trace)
        .iter()
        .filter(|e| e["pid"].as_u64() != Some(run_pid) && e["tid"] != trace_file::REAL)
        .cloned()
        .collect()
}

/// Every node's real-time track tiles its loop's wall time, and sums, category by
/// category, to the report's figures (to a few nanoseconds per event).
fn assert_real_sums(trace: &Value, report: &RunReport) {
    let tracks = trace_file::real_tracks(trace);
    assert_eq!(tracks.len(), report.real.len());
    for (rank, ((sums, end), real)) in tracks.iter().zip(&report.real).enumerate() {
        assert!(real.wall_s > 0.0, "node {rank}: {real:?}");
        let figures = [real.compute_s, real.communication_s, real.simulator_s];
        for ((cat, sum), figure) in trace_file::REAL_CATEGORIES.iter().zip(sums).zip(figures) {
            assert!(
                (sum - figure).abs() < 1e-5,
                "node {rank} {cat}: {sum} s in the trace, {figure} s reported"
            );
        }
        assert!(
            (end - real.wall_s).abs() < 1e-5,
            "node {rank}: {end} against {real:?}"
        );
        // Not vacuous: the node waited in collectives and did its own work.
        assert!(sums[0] > 0.0 && sums[1] > 0.0, "node {rank}: {sums:?}");
    }
}

#[test]
fn trace_tiles_every_nodes_clock_and_the_plan_draws_the_same() {
    let steps = 12;
    let config = TrainerConfig::new(NODES)
        .with_max_steps(Some(steps))
        .with_simulation(Some(cluster()));
    let (report, trace) = traced_fit("streaming", config, &streaming());
    let meta = &trace["otherData"];
    assert_eq!(meta["aggregated"], false);
    assert_eq!(meta["steps_per_event"], 1);
    assert_eq!(meta["source"], "training");
    assert_eq!(meta["strategy"], "streaming-diloco");
    let tracks = trace_file::main_tracks(&trace);
    assert_sums(&tracks, &report.simulated);
    // The makespan and the means of summary.json's figures.
    let longest = tracks.iter().map(|t| t.end_us).fold(0.0, f64::max);
    assert!((longest - report.simulated_time_s().unwrap() * 1e6).abs() < 1.0);
    for (i, mean) in [
        report.simulated_compute_s(),
        report.simulated_comm_s(),
        report.simulated_idle_s(),
    ]
    .into_iter()
    .enumerate()
    {
        let traced = tracks.iter().map(|t| t.sums[i]).sum::<f64>() / NODES as f64;
        assert!(
            (traced - mean.unwrap() * 1e6).abs() < 1.0,
            "{}",
            CATEGORIES[i]
        );
    }
    // Every category shows: the straggler makes the others idle, the wide area link's
    // transfers are partly exposed.
    let all = |i: usize| tracks.iter().map(|t| t.sums[i]).sum::<f64>();
    assert!(all(0) > 0.0 && all(1) > 0.0 && all(2) > 0.0);
    // Compute events: one per step and node, labelled with the step.
    for track in &tracks {
        let steps_seen: Vec<u64> = track
            .events
            .iter()
            .filter(|e| e["cat"] == "compute")
            .map(|e| e["args"]["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps_seen, (0..steps as u64).collect::<Vec<_>>());
    }
    // Communication: op, bytes, group and algorithm.
    let comm = tracks[0]
        .events
        .iter()
        .find(|e| e["cat"] == "communication")
        .expect("a collective");
    let args = &comm["args"];
    assert_eq!(args["op"], "all_gather_bytes", "{comm}");
    assert_eq!(args["group"], "0-3");
    assert_eq!(args["group_size"], 4);
    assert_eq!(args["algorithm"], "hierarchical");
    assert!(args["payload_bytes"].as_u64().unwrap() > 0);
    // Streaming DiLoCo's overlapped transfers, one per fragment synchronisation, on the link
    // track. The straggler, the last member ready, starts each and computes its next step
    // behind it: part of each is hidden, the rest is its exposed communication. (The others,
    // idle until it arrives, wait for the whole transfer.)
    let links = trace_file::link_tracks(&trace);
    let end = |e: &Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
    for (rank, link) in links.iter().enumerate() {
        assert_eq!(
            link.len(),
            steps / 2,
            "node {rank}: a fragment every 2 steps"
        );
    }
    let straggler = &tracks[1];
    for x in &links[1] {
        let behind = straggler.events.iter().any(|e| {
            let ts = e["ts"].as_f64().unwrap();
            e["cat"] == "compute" && x["ts"].as_f64().unwrap() <= ts && ts < end(x)
        });
        assert!(behind, "the straggler computes behind {x}");
    }
    let on_link: f64 = links[1].iter().map(|x| x["dur"].as_f64().unwrap()).sum();
    assert!(
        on_link > straggler.sums[1] + 1.0,
        "part of the transfers hidden"
    );
    // One flow per collective, joining its four members.
    let flows = trace_file::check_flows(&trace);
    assert_eq!(flows, vec![NODES; steps / 2]);
    // Counters: cumulative bytes per node, ending at the node's traffic; the loss per step.
    for (rank, stats) in report.comm.iter().enumerate() {
        let last = trace_file::events(&trace)
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "sent" && e["pid"] == rank as u64 + 1)
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .max();
        assert_eq!(last, Some(stats.bytes_sent), "node {rank}");
    }
    let losses = trace_file::events(&trace)
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "train")
        .count();
    assert_eq!(losses, steps);

    // The planner draws the same timeline, event for event.
    let (plan_report, planned) = traced_plan(&streaming(), steps, None, (None, 0));
    assert_eq!(plan_report.simulated, report.simulated);
    assert_eq!(planned["otherData"]["source"], "plan");
    assert_sums(&trace_file::main_tracks(&planned), &report.simulated);
    let (trained, plan) = (node_events(&trace), node_events(&planned));
    assert_eq!(trained.len(), plan.len());
    for (a, b) in trained.iter().zip(&plan) {
        assert_eq!(a, b);
    }
    assert_real_sums(&trace, &report);
}

/// Node 1 leaves before step 3 for 2 steps (DiLoCo, H = 2): its main track holds `down`
/// time summing to its clock's, then the transfer of a peer's state as it rejoins; the
/// planner, told the state's size, draws the same events.
#[test]
fn trace_of_a_fault_draws_the_time_away_and_the_rejoin() {
    let diloco = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(2));
    let faults: FaultSchedule = "leave:1@3+2".parse().unwrap();
    let config = TrainerConfig::new(NODES)
        .with_max_steps(Some(8))
        .with_simulation(Some(cluster()))
        .with_faults(Some(faults.clone()));
    let (report, trace) = traced_fit("fault", config, &diloco);
    let tracks = trace_file::main_tracks(&trace);
    assert_sums(&tracks, &report.simulated);
    let down = report.simulated[1].down_s;
    assert!(down > 0.0);
    let node1 = &tracks[1];
    let downs: Vec<&Value> = node1.events.iter().filter(|e| e["cat"] == "down").collect();
    assert_eq!(downs.len(), 1);
    assert!((downs[0]["dur"].as_f64().unwrap() - down * 1e6).abs() < 1.0);
    assert_eq!(
        downs[0]["args"]["step"], 5,
        "away until it rejoins before step 5"
    );
    let rejoin = node1
        .events
        .iter()
        .find(|e| e["name"] == "rejoin: broadcast_bytes")
        .expect("the rejoin's transfer");
    assert_eq!(rejoin["cat"], "communication");
    assert_eq!(rejoin["args"]["purpose"], "rejoin");
    assert_eq!(rejoin["args"]["root"], 0, "node 0 serves it");
    assert!(
        rejoin["ts"].as_f64() >= downs[0]["ts"].as_f64(),
        "after the time away"
    );
    // The others' tracks have no time away.
    for (rank, t) in tracks.iter().enumerate().filter(|(r, _)| *r != 1) {
        assert_eq!(t.sums[3], 0.0, "node {rank}");
    }
    // The plan of the same schedule, its rejoin sending the state training measured.
    let state = rejoin["args"]["payload_bytes"].as_u64().unwrap();
    let (plan_report, planned) = traced_plan(&diloco, 8, None, (Some(faults), state));
    assert_eq!(plan_report.simulated, report.simulated);
    let (trained, plan) = (node_events(&trace), node_events(&planned));
    assert_eq!(trained.len(), plan.len());
    for (a, b) in trained.iter().zip(&plan) {
        assert_eq!(a, b);
    }
}

/// DiLoCo with a quorum (H = 3, a quorum of 2 and a 10 ms grace window): the late nodes'
/// tracks are cut back to the close and draw the catch-up broadcast; the plan, deciding
/// the quorum from its own clocks, draws the same events.
#[test]
fn trace_of_a_quorum_draws_the_late_nodes_as_training_does() {
    let diloco = DiLoCoConfig::new().with_communicator(
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(3)
            .with_quorum(Some(QuorumRule::Grace {
                min: 2,
                grace_s: 0.01,
            })),
    );
    let config = TrainerConfig::new(NODES)
        .with_max_steps(Some(9))
        .with_simulation(Some(cluster()));
    let (report, trace) = traced_fit("quorum", config, &diloco);
    assert!(
        report.elastic.total().discarded_steps > 0,
        "someone is late"
    );
    let tracks = trace_file::main_tracks(&trace);
    assert_sums(&tracks, &report.simulated);
    let (plan_report, planned) = traced_plan(&diloco, 9, None, (None, 0));
    assert_eq!(plan_report.simulated, report.simulated);
    assert_sums(&trace_file::main_tracks(&planned), &plan_report.simulated);
    let (trained, plan) = (node_events(&trace), node_events(&planned));
    // The quorum's wait and the late nodes' catch-up broadcast are drawn.
    assert!(
        trained
            .iter()
            .any(|e| e["args"].to_string().contains("quorum"))
    );
    assert!(trained.iter().any(|e| e["name"] == "broadcast"));
    assert_eq!(trained.len(), plan.len());
    for (a, b) in trained.iter().zip(&plan) {
        assert_eq!(a, b);
    }
}

/// Past its cap a trace merges steps: `otherData` says so, every event names its steps, no
/// flow is drawn, and every node's track still tiles and sums to its clock.
#[test]
fn trace_past_its_cap_aggregates_steps_and_keeps_the_sums() {
    let (report, full) = traced_plan(&AllReduceConfig::new(), 64, None, (None, 0));
    assert_eq!(full["otherData"]["aggregated"], false);
    let cap = 150;
    assert!(trace_file::events(&full).len() > cap);
    let (_, trace) = traced_plan(&AllReduceConfig::new(), 64, Some(cap), (None, 0));
    let meta = &trace["otherData"];
    assert_eq!(meta["aggregated"], true);
    let n = meta["steps_per_event"].as_u64().unwrap();
    assert!(n > 1 && n.is_power_of_two(), "{n}");
    assert!(trace_file::events(&trace).len() <= cap);
    let tracks = trace_file::main_tracks(&trace);
    assert_sums(&tracks, &report.simulated);
    for e in tracks.iter().flat_map(|t| &t.events) {
        let steps = e["args"]["steps"].as_str().expect("a range of steps");
        let (a, b) = steps.split_once("..").unwrap();
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        assert!(a % n == 0 && b < a + n, "{steps} in buckets of {n}");
    }
    assert!(trace_file::check_flows(&trace).is_empty());
}

/// A trace needs simulated time and a folder, refused before any step.
#[test]
fn trace_without_simulated_time_or_a_folder_is_refused() {
    let data = NodeData::shared(Synthetic::new(64, 16, 4, 1), Synthetic::new(16, 16, 4, 2));
    let fit = |config: TrainerConfig| {
        Trainer::new(config.with_max_steps(Some(1)).with_trace(true))
            .fit(small_mlp, &AllReduceConfig::new(), &data, &SyntheticBatcher)
            .err()
            .expect("refused")
            .to_string()
    };
    let no_time = fit(TrainerConfig::new(2).with_log_dir(Some("unused".into())));
    assert!(no_time.contains("simulation"), "{no_time}");
    let no_folder = fit(TrainerConfig::new(4).with_simulation(Some(cluster())));
    assert!(no_folder.contains("log_dir"), "{no_folder}");
    assert!(!Path::new("unused").exists());
}
