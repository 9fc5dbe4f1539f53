//! A run whose nodes are spread over several processes (`Trainer::fit_with`, each process
//! running its share of the ranks as threads) trains as `Trainer::fit` does: with 4 nodes
//! over 2 processes of 2 and over 4 processes of 1, the final model, master, traffic,
//! simulated clocks and every logged loss are the bits of the one `fit`. Here threads stand
//! in for the processes ([`ProcessShare`]); the MPI tests (`--features mpi`) run the same
//! cases under `mpirun`.

use burn::tensor::Device;
use gym_core::checkpoint::Checkpoint;
use gym_core::{
    FitOutput, GymError, NodeData, StrategyConfig, ThreadTransport, Trainer, TrainerConfig,
};
use gym_models::Mlp;
use std::sync::Arc;
use tests::{
    ProcessShare, SyntheticBatcher, run_digest, small_mlp, small_mlp_data, spread_cases,
    spread_config,
};

const K: usize = 4;

fn data() -> NodeData<tests::Example> {
    small_mlp_data()
}

/// The run of `config` spread over `processes` processes (threads), each calling
/// `fit_with` with its share of one transport; every process's output, in process order.
fn spread(
    config: &TrainerConfig,
    strategy: &dyn StrategyConfig,
    processes: usize,
) -> Vec<FitOutput<Mlp>> {
    let k = config.num_nodes;
    let per = k / processes;
    let inner = Arc::new(ThreadTransport::new(k));
    let data = data();
    std::thread::scope(|s| {
        let all: Vec<_> = (0..processes)
            .map(|p| {
                let share = Arc::new(ProcessShare {
                    inner: inner.clone(),
                    local: p * per..(p + 1) * per,
                });
                let data = &data;
                s.spawn(move || {
                    Trainer::new(config.clone())
                        .fit_with(share, small_mlp, strategy, data, &SyntheticBatcher)
                        .expect("the process trains")
                })
            })
            .collect();
        all.into_iter().map(|p| p.join().unwrap()).collect()
    })
}

#[test]
fn nodes_spread_over_processes_give_the_bits_of_one_fit() {
    for (name, strategy, simulated) in spread_cases() {
        let config = spread_config(K, 20, 8, 32, simulated);
        let whole = Trainer::new(config.clone())
            .fit(small_mlp, strategy.as_ref(), &data(), &SyntheticBatcher)
            .unwrap();
        let expected = run_digest(&whole);
        // Not vacuous: the run learned, and reports what the case asks for.
        let train = &whole.report.train;
        assert!(train[19].train_loss < train[0].train_loss, "{name}");
        assert_eq!(whole.report.simulated.len(), if simulated { K } else { 0 });
        assert_eq!(whole.report.validation.len(), 3, "{name}: steps 0, 10, 20");
        for processes in [2, 4] {
            for (p, out) in spread(&config, strategy.as_ref(), processes)
                .iter()
                .enumerate()
            {
                assert_eq!(
                    run_digest(out),
                    expected,
                    "{name}, process {p} of {processes}"
                );
            }
        }
    }
}

#[test]
fn only_the_process_of_rank_zero_writes_the_run_folder() {
    let dir = std::env::temp_dir().join(format!("gym-spread-{}", std::process::id()));
    let (_, strategy, _) = spread_cases().remove(0);
    let config =
        spread_config(K, 12, 8, 32, false).with_log_dir(Some(dir.to_string_lossy().into_owned()));
    let processes = spread(&config, strategy.as_ref(), 2);
    // One name for the run (rank 0's, with its time of day), one folder.
    assert!(
        processes
            .iter()
            .all(|n| n.report.run_name == processes[0].report.run_name)
    );
    let folders: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(folders.len(), 1);
    let run = dir.join(&processes[0].report.run_name);
    let train = std::fs::read_to_string(run.join("train.csv")).unwrap();
    assert_eq!(
        train.lines().count(),
        1 + 12,
        "a header and every step once"
    );
    let validation = std::fs::read_to_string(run.join("validation.csv")).unwrap();
    assert_eq!(validation.lines().count(), 1 + 3, "steps 0, 10 and 12");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_spread_run_refuses_a_fault_schedule() {
    let strategy = gym_strategies::AllReduceConfig::new();
    let fit = |config: TrainerConfig| {
        let share = Arc::new(ProcessShare {
            inner: Arc::new(ThreadTransport::new(2)),
            local: 0..1,
        });
        Trainer::new(config)
            .fit_with(
                share,
                |d: &Device| small_mlp(d),
                &strategy,
                &data(),
                &SyntheticBatcher,
            )
            .err()
            .map(|e| match e {
                GymError::InvalidConfig(why) => why,
                other => panic!("expected InvalidConfig, got {other}"),
            })
            .expect("refused")
    };
    let two = spread_config(2, 5, 8, 0, false);
    assert!(fit(spread_config(3, 5, 8, 0, false)).contains("2 ranks"));
    let faults: gym_core::faults::FaultSchedule = "crash:1@2".parse().unwrap();
    assert!(fit(two.clone().with_faults(Some(faults))).contains("fault schedule"));
}

#[test]
fn a_spread_run_checkpoints_in_shards_and_resumes_under_any_spread() {
    let dir = std::env::temp_dir().join(format!("gym-spread-ckpt-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let (name, strategy, simulated) = spread_cases().remove(1);
    assert_eq!(name, "diloco");
    let config = spread_config(K, 20, 8, 32, simulated);
    let expected = run_digest(
        &Trainer::new(config.clone())
            .fit(small_mlp, strategy.as_ref(), &data(), &SyntheticBatcher)
            .unwrap(),
    );
    // Two processes write a shard each at steps 10 and 20, and train as one process does.
    let writing = config
        .clone()
        .with_checkpoint_interval(Some(10))
        .with_checkpoint_dir(Some(dir.to_string_lossy().into_owned()));
    for out in spread(&writing, strategy.as_ref(), 2) {
        assert_eq!(run_digest(&out), expected);
    }
    let shard = |step, first, last| dir.join(Checkpoint::shard_file_name(step, first, last));
    for step in [10, 20] {
        assert!(shard(step, 0, 1).is_file() && shard(step, 2, 3).is_file());
    }
    // Step 10, named by the second process's file, resumes in one process and in four.
    let resumed = config
        .clone()
        .with_resume_from(Some(shard(10, 2, 3).to_string_lossy().into_owned()));
    let one = Trainer::new(resumed.clone())
        .fit(small_mlp, strategy.as_ref(), &data(), &SyntheticBatcher)
        .unwrap();
    assert_eq!(run_digest(&one), expected, "resumed in one process");
    for (p, out) in spread(&resumed, strategy.as_ref(), 4).iter().enumerate() {
        assert_eq!(run_digest(out), expected, "resumed in four, process {p}");
    }
    // Without the second process's files the folder has no complete checkpoint, and the
    // error names the ranks missing.
    for step in [10, 20] {
        std::fs::remove_file(shard(step, 2, 3)).unwrap();
    }
    let from_folder = config.with_resume_from(Some(dir.to_string_lossy().into_owned()));
    match Trainer::new(from_folder).fit(small_mlp, strategy.as_ref(), &data(), &SyntheticBatcher) {
        Err(GymError::Checkpoint(why)) => assert!(why.contains("missing ranks 2-3"), "{why}"),
        other => panic!("expected a checkpoint error, got {:?}", other.err()),
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `--trace` of a spread run: the process of rank 0 writes one trace of every node, whose
/// simulated tracks are the one `fit`'s event for event, and each node's real time beside
/// them, tiling its loop.
#[test]
fn a_spread_run_writes_one_trace_of_every_node() {
    let (_, strategy, simulated) = spread_cases().remove(1);
    assert!(simulated, "the DiLoCo case simulates time");
    let dir = |name: &str| {
        let d =
            std::env::temp_dir().join(format!("gym-spread-trace-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        d
    };
    let config = |dir: &std::path::Path| {
        spread_config(K, 12, 8, 32, true)
            .with_log_dir(Some(dir.to_string_lossy().into_owned()))
            .with_run_name(Some("run".into()))
            .with_trace(true)
    };
    let (one, two) = (dir("one"), dir("two"));
    let whole = Trainer::new(config(&one))
        .fit(small_mlp, strategy.as_ref(), &data(), &SyntheticBatcher)
        .unwrap();
    let processes = spread(&config(&two), strategy.as_ref(), 2);
    let traced = |path: &std::path::Path| tests::trace_file::read(&path.join("run/trace.json"));
    let (expected, got) = (traced(&one), traced(&two));
    let simulated = |trace: &serde_json::Value| -> Vec<serde_json::Value> {
        tests::trace_file::events(trace)
            .iter()
            .filter(|e| e["tid"] != tests::trace_file::REAL)
            .cloned()
            .collect()
    };
    let (a, b) = (simulated(&expected), simulated(&got));
    assert!(a.len() > 4 * K, "{} events", a.len());
    assert_eq!(a, b, "the spread run's simulated timeline");
    for process in &processes {
        assert_eq!(
            process.report.real.len(),
            K,
            "every node's real time, in every process"
        );
    }
    let real = tests::trace_file::real_tracks(&got);
    assert_eq!(real.len(), K);
    for (rank, (sums, end)) in real.iter().enumerate() {
        assert!(
            *end > 0.0 && sums[1] > 0.0,
            "node {rank}: {sums:?} to {end}"
        );
    }
    assert_eq!(whole.report.real.len(), K);
    for d in [one, two] {
        std::fs::remove_dir_all(d).ok();
    }
}
