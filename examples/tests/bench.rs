//! The benchmark suite of `bench --suite`, in a tiny configuration: every figure it names is
//! in its JSON, finite and positive (the precision part's included).

use examples::bench_suite::{self, SuiteConfig};
use std::path::PathBuf;
use std::sync::Mutex;

/// Held by each test here: the suite's figures are ratios of timings, so the other tests of
/// this binary must not take the cores while it times (a matmul rate timed beside the soak
/// would put a model above its bound below).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn bench_suite_writes_every_named_figure() {
    let _alone = one_at_a_time();
    let scratch = std::env::temp_dir().join(format!("gym-bench-test-{}", std::process::id()));
    let mut config = SuiteConfig::new(
        tests::shared_data("mnist"),
        tests::shared_data("shakespeare"),
        Some(PathBuf::from(env!("CARGO_BIN_EXE_mnist"))),
    );
    // Everything at its smallest: K ≤ 2, 1 MiB, one warm-up step. The timed steps are a
    // step time's difference of two runs, so they must outlast the runs' noise for the
    // fractions' bound below to hold on a busy machine: 50 MLP steps (about 25 ms), 10 GPT
    // steps (about 50 ms), one CNN step (about 200 ms).
    config.ks = vec![1, 2];
    config.warmup_steps = 1;
    config.repeats = 1;
    config.mlp_steps = 50;
    config.cnn_steps = 1;
    config.gpt_steps = 10;
    config.collective_mb = vec![1];
    config.collective_ks = vec![2];
    config.collective_reps = 1;
    config.rss_ks = vec![1, 2];
    config.startup_k = Some(2);
    config.scratch_dir = scratch.join("runs");
    config.command = "cargo test --test bench".into();
    config.plan_bin = Some(PathBuf::from(env!("CARGO_BIN_EXE_plan")));
    // The compute limit at one size; the paper-width GPT for one step after its warm-up.
    config.matmul_sizes = vec![512];
    config.gpt_6l384_steps = 1;
    // The cost of a node-step at 2 and 4 MLP nodes (two rounds each) and 2 GPT nodes.
    config.node_cost.mlp_ks = vec![2, 4];
    config.node_cost.gpt_ks = vec![2];
    config.node_cost.mlp_node_steps = 80;
    config.node_cost.gpt_node_steps = 40;
    config.node_cost.repeats = 1;

    let result = bench_suite::run_suite(&config).expect("the suite runs");
    let path = scratch.join("suite.json");
    result.write_json(&path).expect("the JSON is written");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let map = json.as_object().expect("a flat JSON object");

    for key in ["machine", "date", "load_average"] {
        assert!(
            map.get(key)
                .and_then(|v| v.as_str())
                .is_some_and(|s| !s.is_empty()),
            "{key}: {:?}",
            map.get(key)
        );
    }
    let mut names = vec![
        "cnn_step_ms_flex".to_string(),
        "gpt_step_ms_flex".to_string(),
        "peak_rss_mlp_k1_bytes".to_string(),
        "peak_rss_mlp_k2_bytes".to_string(),
        "startup_s_k2".to_string(),
    ];
    for model in ["mlp", "cnn", "gpt"] {
        for k in [1, 2] {
            names.push(format!("step_ms_{model}_k{k}"));
            names.push(format!("overhead_ratio_{model}_k{k}"));
        }
    }
    for op in ["allreduce", "allgather", "broadcast"] {
        names.push(format!("{op}_vs_memcpy_1mb_k2"));
    }
    names.push("allreduce_vs_memcpy_all_1mb_k2".to_string());
    names.push("plan_10k_nodes_1k_rounds_s".to_string());
    names.push("plan_10k_nodes_1k_rounds_peak_rss_bytes".to_string());
    for (model, k) in [("mlp", 2), ("mlp", 4), ("gpt", 2)] {
        for key in ["cpu_ms", "wall_ms", "cpu_vs_first"] {
            names.push(format!("node_step_{key}_{model}_k{k}_flex"));
        }
    }
    // The precision part: each model in f32 and bf16 on the default backend.
    for model in ["mlp", "cnn", "gpt"] {
        for key in ["f32_step_ms", "bf16_step_ms", "bf16_vs_f32"] {
            names.push(format!("{key}_{model}_flex"));
        }
    }
    for name in &names {
        let v = map
            .get(name)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("{name} missing from {json:#}"));
        assert!(v.is_finite() && v > 0.0, "{name} = {v}");
    }
    // Every value other than the three strings is a number: the object is flat.
    for (name, v) in map {
        assert!(
            v.is_number() || ["machine", "date", "load_average"].contains(&name.as_str()),
            "{name}: {v}"
        );
    }
    // Each model's first node-cost row is the one the others are set against.
    for first in [
        "node_step_cpu_vs_first_mlp_k2_flex",
        "node_step_cpu_vs_first_gpt_k2_flex",
    ] {
        assert_eq!(map[first].as_f64(), Some(1.0), "{first}");
    }
    // One node is its own compute limit, and has no independent runs to compare with; K = 2
    // has both figures.
    for model in ["mlp", "cnn", "gpt"] {
        let ratio = map[&format!("overhead_ratio_{model}_k1")].as_f64().unwrap();
        assert!((ratio - 1.0).abs() < 1e-9, "{model}: {ratio}");
        for key in ["independent_runs_ratio", "overhead_vs_independent"] {
            assert!(
                !map.contains_key(&format!("{key}_{model}_k1")),
                "{key}_{model}_k1"
            );
            let v = map
                .get(&format!("{key}_{model}_k2"))
                .and_then(|v| v.as_f64())
                .unwrap_or_else(|| panic!("{key}_{model}_k2 missing from {json:#}"));
            assert!(v.is_finite() && v > 0.0, "{key}_{model}_k2 = {v}");
        }
    }
    // The compute limit: each matmul rate measured, and the two limits are the best of
    // them on one thread and on every core (not compared with each other: on a shared
    // machine two threads can lose to one). Every model's fraction of the one-thread rate
    // is in a sane range: the step's FLOPs are counted from the model, so a fraction above
    // 1.2 would be a miscount, not a fast step.
    let figure = |key: &str| {
        map.get(key)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("{key} missing from {json:#}"))
    };
    let cores = result.machine.cores;
    // On every core, a third source: a one-thread product on each core at once.
    let best = |threads: usize| {
        let sources: &[&str] = if threads > 1 {
            &["flex", "gemm", "gemm_per_thread"]
        } else {
            &["flex", "gemm"]
        };
        sources
            .iter()
            .map(|source| figure(&format!("matmul_flops_{source}_512_t{threads}")))
            .fold(0.0, f64::max)
    };
    let one = figure("matmul_flops_1t");
    assert!((1e8..1e13).contains(&one), "matmul_flops_1t = {one}");
    assert_eq!(one, best(1));
    assert_eq!(figure("matmul_flops_all"), best(cores));
    for model in ["mlp", "cnn", "gpt_small", "gpt_6l384"] {
        let f = figure(&format!("fraction_of_matmul_{model}"));
        // A sanity bound only: the fraction divides two timings taken at different moments,
        // and beside other tests the reference matmul can be the slower one (1.73 seen).
        assert!(f > 0.0 && f <= 4.0, "fraction_of_matmul_{model} = {f}");
        let per_core = figure(&format!("flops_per_s_{model}"));
        assert!((per_core / one - f).abs() < 1e-9 * f, "{model}");
    }
    // Without LibTorch in this build the comparison is a row that says why, and no key.
    if !cfg!(feature = "tch") {
        assert!(!map.contains_key("cnn_vs_libtorch") && !map.contains_key("cifar_cnn_vs_libtorch"));
        let table = result.markdown();
        assert!(
            table.contains("not measured: this build has no LibTorch"),
            "{table}"
        );
    }
    // One table per part, each captioned with the machine and the command.
    assert_eq!(result.tables.len(), 9);
    for table in &result.tables {
        assert!(table.caption.contains(&result.machine.machine));
        assert!(table.caption.contains("cargo test --test bench"));
        assert!(!table.rows.is_empty());
    }
    std::fs::remove_dir_all(&scratch).ok();
}

/// `bench --peer-results FILE` puts the peer's runs in the table and each of ours gets its
/// speed ratio; without the file no peer figure is shown, and a bad line is an error naming
/// it.
#[test]
fn bench_shows_the_peer_results_it_is_given_and_no_other() {
    let _alone = one_at_a_time();
    let bench = env!("CARGO_BIN_EXE_bench");
    let scratch = std::env::temp_dir().join(format!("gym-bench-peer-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let peers = scratch.join("peers.jsonl");
    std::fs::write(
        &peers,
        "# a comment\n{\"task\": \"nanogpt\", \"strategy\": \"diloco\", \"its_per_s\": 0.5, \"val_loss\": 2.7}\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let data = tests::shared_data("shakespeare");
        std::process::Command::new(bench)
            .args([
                "--task",
                "nanogpt",
                "--strategies",
                "diloco",
                "--max-steps",
                "2",
            ])
            .args(["--data-dir", data.to_str().unwrap()])
            .args(["--log-dir", scratch.join("logs").to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let with = run(&["--peer-results", peers.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&with.stdout);
    assert!(with.status.success(), "{table}");
    assert!(
        table.contains("| original (Python) diloco | 0.50 |"),
        "{table}"
    );
    let ours = table
        .lines()
        .find(|l| l.starts_with("| diloco ("))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        ours.trim_end().ends_with("× |") && !ours.ends_with("| - |"),
        "{ours}"
    );

    let without = run(&[]);
    let table = String::from_utf8_lossy(&without.stdout);
    assert!(
        without.status.success() && !table.contains("original (Python)"),
        "{table}"
    );
    let ours = table.lines().find(|l| l.starts_with("| diloco (")).unwrap();
    assert!(
        ours.trim_end().ends_with("| - |"),
        "no ratio without a peer: {ours}"
    );

    std::fs::write(&peers, "{\"task\": \"nanogpt\"}\n").unwrap();
    let bad = run(&["--peer-results", peers.to_str().unwrap()]);
    let message = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && message.contains("line 1"),
        "{message}"
    );
    std::fs::remove_dir_all(&scratch).ok();
}

/// The soak at a few nodes and steps: faults are drawn and nodes rejoin (taking a peer's
/// state through a counted broadcast), the traffic summed over nodes balances, the memory
/// figures are the samples the growth is computed from, and the JSON names them.
#[test]
fn bench_soak_balances_its_traffic_and_reports_its_memory() {
    let _alone = one_at_a_time();
    let mut config = bench_suite::SoakConfig::new();
    config.nodes = 4;
    config.steps = 60;
    config.down_steps = 5;
    // Enough leaves that some come back before the end, with these seed and sizes.
    config.faults_per_node = 3.0;
    config.samples = 20;
    let report = bench_suite::run_soak(&config).expect("the soak runs");

    assert!(report.faults > 0 && report.rejoins > 0, "{report:?}");
    assert!(report.absent_node_steps > 0);
    let t = report.traffic;
    assert!(t.sent > 0 && t.all_reduce_calls > 0, "{t:?}");
    // Each rejoin is one state transfer, counted by the source and every node coming back.
    assert!(t.broadcast_calls >= 2, "{t:?}");
    assert!(t.balanced(), "{t:?}");
    assert_eq!(t.sent, t.received);

    // Ticks at every twentieth of the node-steps (nodes away draw none), then the end.
    assert!(
        (10..=config.samples + 1).contains(&report.samples.len()),
        "{:?}",
        report.samples
    );
    assert!(
        report.warm.step >= 6,
        "warm-up is 10% of 60 steps: {:?}",
        report.warm
    );
    assert_eq!(report.end, *report.samples.last().unwrap());
    assert_eq!(report.end.step, config.steps - 1);
    assert!(report.warm.rss_bytes > 0 && report.peak_rss_bytes >= report.end.rss_bytes);
    assert_eq!(
        report.rss_growth_pct(),
        bench_suite::rss_growth_pct(report.warm.rss_bytes, report.last_in_loop.rss_bytes)
    );

    let machine = bench_suite::MachineInfo::now();
    let result = bench_suite::soak_result(&config, &report, machine, "0.00 0.00 0.00");
    let json = result.to_json();
    assert_eq!(json["soak_bytes_balanced"], 1);
    assert_eq!(json["soak_bytes_sent"], t.sent);
    assert_eq!(json["soak_steps"], 60);
    assert!(json["soak_rss_growth_pct"].is_number());
    // The check is net of the train records written after warm-up.
    assert_eq!(
        json["soak_records_after_warmup_bytes"],
        report.records_bytes_between(&report.last_in_loop)
    );
    assert!(report.records_bytes_between(&report.last_in_loop) > 0);
    // The growth is measured to the loop's last sample, the one before the end sample.
    let n = report.samples.len();
    assert_eq!(report.last_in_loop, report.samples[n - 2]);
    assert!(json["soak_rss_net_growth_pct"].is_number());
    // This test binary counts no live heap: the figures say 0 rather than failing.
    assert_eq!(report.warm.live_bytes, 0);
    assert!(
        result.markdown().contains("| 60 | 4 |"),
        "{}",
        result.markdown()
    );
}
