//! The example binaries as a user runs them: Burn's optimizers chosen by name, simulated
//! time, the strategies of the zoo, resuming after Ctrl-C, faults and quorums, devices, and
//! `--collective mpi`. Bad input is in `refusals.rs`.

use std::path::PathBuf;
use std::process::Command;

mod mnist_binary;
use mnist_binary::{mnist, mnist_dir, temp_dir};

// The Ctrl-C helpers of the series tests; the rest of the module is theirs.
#[allow(dead_code)]
mod series;

#[test]
fn burn_optimizers_are_chosen_by_name() {
    for optimizer in ["muon", "lion", "adan"] {
        let logs = temp_dir(&format!("opt-{optimizer}"));
        let out = mnist(&logs, &["--optimizer", optimizer, "--lr", "1e-3"]);
        assert!(
            out.status.success(),
            "{optimizer}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(logs.join("run/summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["steps"], 3);
        assert!(summary["final_train_loss"].as_f64().unwrap().is_finite());
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(logs.join("run/config.json")).unwrap())
                .unwrap();
        let inner = &config["strategy"]["config"]["inner"];
        let named = |v: &serde_json::Value| v.to_string().to_lowercase();
        match optimizer {
            // Muon holds the matrices; AdamW the rest.
            "muon" => {
                assert!(named(&inner["groups"][0]["optimizer"]).contains("muon"));
                assert!(named(&inner["optimizer"]).contains("adamw"));
            }
            other => assert!(named(&inner["optimizer"]).contains(other), "{inner}"),
        }
        std::fs::remove_dir_all(&logs).ok();
    }
}

#[test]
fn simulated_time_flags_are_checked_and_reported() {
    let logs = temp_dir("sim");
    let out = mnist(
        &logs,
        &[
            "--network",
            "1gbit:10ms",
            "--node-speed",
            "1,0.5",
            "--target-loss",
            "9",
        ],
    );
    tests::assert_succeeded(&out);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("run/summary.json")).unwrap())
            .unwrap();
    let time = summary["simulated_time_s"].as_f64().unwrap();
    let idle = summary["simulated_idle_s"].as_f64().unwrap();
    assert!(time > 0.0 && idle > 0.0, "the fast node waits: {summary}");
    // Without intermediate evaluations, the target is first seen at the end.
    assert_eq!(summary["time_to_target_s"].as_f64(), Some(time));
    let train = std::fs::read_to_string(logs.join("run/train.csv")).unwrap();
    assert!(
        train
            .lines()
            .next()
            .unwrap()
            .ends_with("sim_time_s,sim_compute_s,sim_comm_s,sim_idle_s")
    );
    for (flags, says) in [
        (&["--network", "fast"][..], "is not a network"),
        (
            &["--network", "1gbit:10ms", "--topology", "mesh"][..],
            "is not a topology",
        ),
        (
            &["--network", "1gbit:10ms", "--node-tflops", "lots"][..],
            "is not a node",
        ),
        (&["--target-loss", "2"][..], "--target-loss needs --network"),
        (
            &["--network", "1gbit:10ms", "--node-speed", "1,1,1"][..],
            "node_speed",
        ),
    ] {
        let out = mnist(&temp_dir("bad"), flags);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{flags:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&logs).ok();
}

/// Each algorithm of 2025–26 runs by name, its flags reach its configuration, and a
/// setting it cannot run with is refused naming the setting.
#[test]
fn zoo_every_new_strategy_runs_by_name_with_its_flags() {
    let cases: [(&str, &[&str], &str, serde_json::Value); 7] = [
        (
            "streaming-diloco",
            &[
                "-H",
                "2",
                "--fragments",
                "2",
                "--overlap",
                "0",
                "--mixing",
                "0.25",
            ],
            "/mixing",
            serde_json::json!(0.25),
        ),
        (
            "sparseloco",
            &["-H", "2", "--topk", "16", "--topk-chunk", "256"],
            "/top_k",
            serde_json::json!(16),
        ),
        (
            "muloco",
            &["-H", "2", "--compression", "int8:64"],
            "/communicator/compression/Codec/codec/Dense/Int8/chunk",
            serde_json::json!(64),
        ),
        (
            "desloc",
            &["-H", "1", "--first-moment-interval", "2"],
            "/first_moment_interval",
            serde_json::json!(2),
        ),
        (
            "noloco",
            &["-H", "2", "--group-size", "2", "--outer-momentum", "0.3"],
            "/communicator/outer_momentum",
            serde_json::json!(0.3),
        ),
        (
            "async-diloco",
            &["-H", "2", "--momentum-period", "3"],
            "/momentum_period",
            serde_json::json!(3),
        ),
        (
            "powersgd",
            &["--powersgd-rank", "2"],
            "/compression/rank",
            serde_json::json!(2),
        ),
    ];
    for (strategy, flags, pointer, want) in cases {
        let logs = temp_dir(&format!("zoo-{strategy}"));
        let mut extra = vec!["--strategy", strategy, "--lr", "1e-3"];
        extra.extend_from_slice(flags);
        let out = mnist(&logs, &extra);
        assert!(
            out.status.success(),
            "{strategy}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(logs.join("run/config.json")).unwrap())
                .unwrap();
        let strategy_config = &config["strategy"]["config"];
        assert_eq!(
            strategy_config.pointer(pointer),
            Some(&want),
            "{strategy}: {strategy_config}"
        );
        std::fs::remove_dir_all(&logs).ok();
    }
    // Refused, naming the setting: NoLoCo's groups must split the nodes.
    let logs = temp_dir("zoo-refused");
    let out = mnist(&logs, &["--strategy", "noloco", "--group-size", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("group_size"),
        "{stderr}"
    );
    let out = mnist(
        &logs,
        &["--strategy", "allreduce", "--compression", "topk:0/64"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--compression"),
        "{stderr}"
    );
}

/// Ctrl-C, then the printed command: the run ends where the run left alone ends.
#[test]
fn resume_after_ctrl_c_with_the_printed_command_ends_as_the_run_left_alone() {
    let logs = temp_dir("ctrl-c");
    let flags = |run: &str| -> Vec<String> {
        [
            "--strategy",
            "diloco",
            "-H",
            "20",
            "--max-steps",
            "400",
            "--checkpoint-interval",
            "25",
            "--no-progress",
            "--run-name",
            run,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--data-dir".into(),
            mnist_dir().to_string_lossy().into_owned(),
        ])
        .chain(["--log-dir".into(), logs.to_string_lossy().into_owned()])
        .collect()
    };
    // SIGINT once 3 steps are logged: inside the run on a machine of any speed.
    let out = series::interrupted(
        env!("CARGO_BIN_EXE_mnist"),
        &flags("stopped"),
        &logs.join("stopped").join("train.csv"),
        3,
    );
    let summary = |run: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(logs.join(run).join("summary.json")).unwrap())
            .unwrap()
    };
    let stopped = summary("stopped");
    let at = stopped["interrupted_at_step"]
        .as_u64()
        .expect("marked interrupted");
    assert!(at > 0 && at < 400, "{at}");
    // The summary tells what was done, not what was planned.
    assert_eq!(stopped["steps"], at);
    assert_eq!(stopped["steps_planned"], 400);
    let rows = std::fs::read_to_string(logs.join("stopped/train.csv"))
        .unwrap()
        .lines()
        .count()
        - 1;
    assert_eq!(rows as u64, at, "a train.csv row per step done");
    // The printed command, run as printed.
    tests::assert_succeeded(&series::resume(&out));
    let alone = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(flags("alone"))
        .output()
        .unwrap();
    assert!(alone.status.success());
    let (a, b) = (summary("stopped"), summary("alone"));
    assert!(
        a["interrupted_at_step"].is_null(),
        "the resumed run finished"
    );
    for key in ["final_val_loss", "final_train_loss", "val_accuracy"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(
        (a["steps"].clone(), a["steps_planned"].clone()),
        (400.into(), 400.into())
    );
    std::fs::remove_dir_all(&logs).ok();
}

/// `--faults` and DiLoCo's quorum flags reach the run: a node away for 4 steps is counted in
/// summary.json's node-steps lost and goodput, and faults.json lists it; a spec that does not
/// parse is refused naming the flag.
#[test]
fn elastic_cli_faults_and_quorum_reach_the_summary() {
    let logs = temp_dir("elastic");
    let flags = [
        "--num-nodes",
        "4",
        "--max-steps",
        "12",
        "--strategy",
        "diloco",
        "-H",
        "4",
        "--network",
        "1gbit:10ms",
        "--faults",
        "leave:1@2+4",
        "--min-quorum",
        "3",
        "--grace",
        "0.0",
    ];
    let out = mnist(&logs, &flags);
    tests::assert_succeeded(&out);
    let read_json = |file: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(logs.join("run").join(file)).unwrap())
            .unwrap()
    };
    let summary = read_json("summary.json");
    let lost = summary["node_steps_lost"].as_u64().unwrap();
    assert!(lost >= 4, "rank 1 is away for steps 2..6: {summary}");
    let goodput = summary["goodput"].as_f64().unwrap();
    assert!(goodput > 0.0 && goodput <= 1.0, "{summary}");
    let elastic = &summary["elastic"];
    assert_eq!(elastic["node_steps_absent"], 4, "{elastic}");
    assert_eq!(elastic["rejoins"], 1, "{elastic}");
    let leave = serde_json::json!({ "kind": "leave", "rank": 1, "at": 2, "steps": 4 });
    assert_eq!(elastic["faults"], serde_json::json!([leave]), "{elastic}");
    let faults = read_json("faults.json");
    assert_eq!(faults["events"], serde_json::json!([leave]), "{faults}");
    // The quorum reached DiLoCo's configuration.
    let config = read_json("config.json");
    let quorum = config["strategy"]["config"].to_string();
    assert!(
        quorum.contains("Grace") && quorum.contains("\"min\":3"),
        "{quorum}"
    );

    let bad = temp_dir("elastic-bad");
    let out = mnist(&bad, &["--faults", "leave:9@x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--faults"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(2), "a bad flag: {stderr}");
    // A strategy without a quorum refuses the quorum flags, naming itself.
    let out = mnist(&bad, &["--strategy", "allreduce", "--min-quorum", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2)
            && stderr.contains("--min-quorum")
            && stderr.contains("allreduce"),
        "{stderr}"
    );
    assert!(!bad.join("run").exists(), "a run folder was made");
    std::fs::remove_dir_all(&logs).ok();
}

/// `--devices` spreads ranks over the devices listed, round-robin: here the CPU device
/// twice, which must train exactly as the default (the same bits), with every rank's
/// device in `config.json`; a device this build lacks is refused before any node starts.
#[test]
fn devices_are_spread_round_robin_and_unknown_ones_refused() {
    let plain = temp_dir("devices-plain");
    let spread = temp_dir("devices-spread");
    let a = mnist(&plain, &["--num-nodes", "3"]);
    let b = mnist(
        &spread,
        &["--num-nodes", "3", "--devices", "default,default"],
    );
    for out in [&a, &b] {
        tests::assert_succeeded(out);
    }
    let read = |dir: &PathBuf, file: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("run").join(file)).unwrap()).unwrap()
    };
    assert_eq!(
        read(&plain, "summary.json")["final_train_loss"],
        read(&spread, "summary.json")["final_train_loss"]
    );
    assert_eq!(
        read(&spread, "config.json")["devices"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(read(&spread, "summary.json")["backend"], "default,default");

    let refused = temp_dir("devices-refused");
    let out = mnist(&refused, &["--devices", "default,gpu7"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("\"gpu7\""), "{stderr}");
    assert!(!refused.join("run").exists(), "a run folder was made");
    for dir in [plain, spread, refused] {
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// The `train_loss` and `sim_time_s` columns of a run's `train.csv`.
#[cfg(feature = "mpi")]
fn losses_and_clocks(run: &std::path::Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(run.join("train.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (loss, clock) = (col("train_loss"), col("sim_time_s"));
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells[loss].to_string(), cells[clock].to_string())
        })
        .collect()
}

#[cfg(not(feature = "mpi"))]
#[test]
fn collective_mpi_in_a_build_without_mpi_says_how_to_build_it() {
    let dir = temp_dir("no-mpi");
    let out = mnist(&dir, &["--collective", "mpi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--features mpi"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `mpirun -n 4` and `mpirun -n 2` of `mnist --collective mpi --num-nodes 4`: one and two
/// nodes per process; the process of rank 0 alone writes the run folder and prints the
/// summary, whose losses and simulated clock are the in-process run's, step for step. A
/// checkpoint written in shards under `-n 2` resumes under `-n 4` and in one process with
/// the same log. Under `mpirun -n 3` the node count is refused before any step.
#[cfg(feature = "mpi")]
#[test]
fn mpi_mnist_under_mpirun_logs_once_what_the_in_process_run_logs() {
    let flags = [
        "--num-nodes",
        "4",
        "--max-steps",
        "6",
        "--network",
        "internet",
        "--strategy",
        "diloco",
        "--sync-interval",
        "4",
    ];
    let alone = temp_dir("mpi-alone");
    let out = mnist(&alone, &flags);
    tests::assert_succeeded(&out);

    let expected = losses_and_clocks(&alone.join("run"));
    assert_eq!(expected.len(), 6);
    assert!(expected.iter().all(|(_, clock)| !clock.is_empty()));
    let mpirun = |processes: usize, job: &std::path::Path, extra: &[&str]| {
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(processes.to_string())
            .arg(env!("CARGO_BIN_EXE_mnist"))
            .args([
                "--collective",
                "mpi",
                "--batch-size",
                "16",
                "--val-size",
                "0",
            ])
            .args(["--no-progress", "--run-name", "run", "--data-dir"])
            .arg(mnist_dir())
            .arg("--log-dir")
            .arg(job)
            .args(flags)
            .args(extra)
            .output()
            .expect("mpirun runs (apt-get install openmpi-bin)")
    };
    for processes in [4, 2] {
        let job = temp_dir(&format!("mpi-job-{processes}"));
        let out = mpirun(processes, &job, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.matches("strategy ").count(),
            1,
            "one summary: {stdout}"
        );
        assert!(
            stdout.contains(&format!("MPI, {processes} processes")),
            "{stdout}"
        );
        assert!(
            stdout.contains("simulated"),
            "real and simulated time: {stdout}"
        );
        assert_eq!(
            std::fs::read_dir(&job).unwrap().count(),
            1,
            "one run folder"
        );
        assert_eq!(
            losses_and_clocks(&job.join("run")),
            expected,
            "-n {processes}"
        );
        std::fs::remove_dir_all(&job).ok();
    }
    // Under -n 2 each process writes its shard of the checkpoints (steps 3 and 6); step 3,
    // named by either file, resumes under -n 4 and in one process, logging the same.
    let job = temp_dir("mpi-job-checkpoints");
    let out = mpirun(2, &job, &["--checkpoint-interval", "3"]);
    tests::assert_succeeded(&out);
    let shard = job
        .join("run")
        .join("checkpoint-000000003.ranks-2-3.safetensors");
    assert!(
        shard.is_file()
            && shard
                .with_file_name("checkpoint-000000003.ranks-0-1.safetensors")
                .is_file()
    );
    let resume = ["--resume", shard.to_str().unwrap()];
    let out = mpirun(4, &job, &resume);
    tests::assert_succeeded(&out);
    assert_eq!(
        losses_and_clocks(&job.join("run")),
        expected,
        "resumed under -n 4"
    );
    let alone_resumed = temp_dir("mpi-alone-resumed");
    let out = mnist(&alone_resumed, &[&flags[..], &resume[..]].concat());
    tests::assert_succeeded(&out);
    assert_eq!(
        losses_and_clocks(&alone_resumed.join("run")),
        expected,
        "resumed alone"
    );
    for dir in [&job, &alone_resumed] {
        std::fs::remove_dir_all(dir).ok();
    }

    let job = temp_dir("mpi-job-3");
    let out = mpirun(3, &job, &[]);
    let printed =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{printed}");
    assert!(
        printed.contains("4 nodes cannot be spread evenly over the 3 processes"),
        "{printed}"
    );
    for dir in [alone, job] {
        std::fs::remove_dir_all(&dir).ok();
    }
}
