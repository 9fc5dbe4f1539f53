//! The `compare` command end to end on real MNIST (a few steps): every strategy under the
//! same conditions, the table, the plots, the metrics, and configuration files.

use examples::cli::StrategyName;
use examples::compare;
use gym_strategies::registry::{OptimizerArgs, QuorumArgs};
use std::ffi::{OsStr, OsString};
use std::process::Command;

mod series;

fn argv(words: &[impl AsRef<OsStr>]) -> Vec<OsString> {
    series::argv("compare", words)
}

/// The contents of an SVG's `<text>` elements.
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split("</text>").next()?;
            Some(body.split_once('>')?.1.trim().to_string())
        })
        .collect()
}

#[test]
fn one_command_compares_five_strategies_under_identical_conditions() {
    // A run configuration: the command line overrides its max_steps; DeMo gets its own lr.
    let (out, config) = series::with_config(
        "compare-five",
        "num_nodes = 4\nmax_steps = 50\nbatch_size = 16\nval_size = 64\nval_interval = 3\n\
         correlation_interval = 3\nsync_interval = 3\nno_progress = true\n\
         strategies = [\"allreduce\", \"diloco\", \"sparta\", \"fedavg\", \"demo\"]\n\
         [overrides.demo]\nlr = 1e-3\n",
    );
    let out_dir = out.join("result");
    let flags = ["--config", config.to_str().unwrap(), "--max-steps", "6"];
    let result = compare::run(&argv(&series::on_mnist(&flags, &out_dir))).unwrap();

    // Five runs, the configuration resolved per strategy.
    let names: Vec<StrategyName> = result.outcomes.iter().map(|o| o.strategy).collect();
    assert_eq!(
        names,
        [
            named("allreduce"),
            named("diloco"),
            named("sparta"),
            named("fedavg"),
            named("demo")
        ]
    );
    for o in &result.outcomes {
        assert_eq!(o.report.steps, 6, "the command line wins over the file");
        assert_eq!(o.args.common.num_nodes, 4, "read from the file");
        let lr = if o.strategy == named("demo") {
            1e-3
        } else {
            3e-4
        };
        assert_eq!(
            o.args
                .common
                .strategy_flags
                .get::<OptimizerArgs>()
                .unwrap()
                .lr,
            lr,
            "{:?}",
            o.strategy
        );
        assert_eq!(o.args.common.strategy, o.strategy);
    }
    // Identical conditions: same initial parameters and sample order.
    assert!(result.identical_conditions);
    let first = &result.outcomes[0].report;
    for o in &result.outcomes {
        assert_eq!(o.report.init_fingerprint, first.init_fingerprint);
        assert_eq!(o.report.data_fingerprint, first.data_fingerprint);
    }

    // The table: one row per strategy, AllReduce the 1.0× baseline, DeMo sends less.
    let table = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    assert_eq!(table.lines().filter(|l| l.starts_with("| **")).count(), 5);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| **{name}**")))
            .unwrap()
            .to_string()
    };
    assert!(
        row("allreduce").ends_with("| 1.0× |"),
        "{}",
        row("allreduce")
    );
    let demo_reduction: f64 = row("demo")
        .rsplit('|')
        .nth(1)
        .unwrap()
        .trim()
        .trim_end_matches('×')
        .parse()
        .unwrap();
    assert!(
        demo_reduction > 10.0,
        "DeMo sends far less: {demo_reduction}"
    );

    // The plots: labelled axes, a legend entry per strategy, a log-scale bytes axis.
    for (file, x_label) in [
        ("val_loss.svg", "step"),
        ("val_loss_vs_bytes.svg", "bytes sent per node (log scale)"),
        ("correlation.svg", "step"),
    ] {
        let texts = svg_texts(&std::fs::read_to_string(out_dir.join(file)).unwrap());
        assert!(
            texts.iter().any(|t| t == x_label),
            "{file}: x label in {texts:?}"
        );
        for name in ["allreduce", "diloco", "sparta", "fedavg", "demo"] {
            assert!(
                texts.iter().any(|t| t == name),
                "{file}: legend entry {name}"
            );
        }
    }
    let bytes = svg_texts(&std::fs::read_to_string(out_dir.join("val_loss_vs_bytes.svg")).unwrap());
    assert!(bytes.iter().any(|t| t == "validation loss"));
    assert!(
        bytes
            .iter()
            .any(|t| t.ends_with(" MiB") || t.ends_with(" KiB")),
        "byte ticks: {bytes:?}"
    );

    // The metrics: every record in the JSONL, one CSV row per evaluation.
    let jsonl = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |kind: &str| records.iter().filter(|r| r["kind"] == kind).count();
    assert_eq!(count("train"), 5 * 6);
    // Evaluations at steps 0 and 3 and the final one at 6.
    assert_eq!(count("validation"), 5 * 3);
    assert_eq!(count("correlation"), 5 * 2);
    assert_eq!(count("summary"), 5);
    let csv = std::fs::read_to_string(out_dir.join("validation.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 5 * 3);
    let corr = std::fs::read_to_string(out_dir.join("correlation.csv")).unwrap();
    for line in corr.lines().filter(|l| l.starts_with("allreduce,")) {
        assert!(line.ends_with(",1"), "AllReduce replicas identical: {line}");
    }
    let diloco_at_3 = corr
        .lines()
        .find(|l| l.starts_with("diloco,3,"))
        .expect("DiLoCo at its sync");
    assert!(diloco_at_3.ends_with(",1"), "{diloco_at_3}");

    // Each run's resolved configuration reads back through --config to the same flags.
    let saved = out_dir.join("runs/demo/run_config.toml");
    let (again, _): (compare::CompareArgs, _) = examples::cli::try_parse_from(
        &<compare::CompareArgs as clap::CommandFactory>::command(),
        &argv(&["--config", saved.to_str().unwrap()]),
    )
    .unwrap();
    let demo = &result.outcomes[4].args;
    assert_eq!(
        serde_json::to_value(&again).unwrap(),
        serde_json::to_value(demo).unwrap()
    );
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn bad_configurations_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("gym-compare-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let message = |path: &std::path::Path| {
        compare::run(&argv(&["--config", path.to_str().unwrap()]))
            .unwrap_err()
            .to_string()
    };
    let broken = write("broken.toml", "num_nodes = ");
    assert!(message(&broken).contains("broken.toml"));
    let unknown = write("unknown.json", r#"{"num_nodez": 4}"#);
    assert!(message(&unknown).contains("--num-nodez"));
    let table = write("table.toml", "[trainer]\nnum_nodes = 4\n");
    assert!(message(&table).contains("`trainer` is a table"));
    assert!(message(&dir.join("missing.toml")).contains("cannot read config file"));
    let none = compare::run(&argv(&["--strategies", "allreduce,allreduce"])).unwrap_err();
    assert!(none.to_string().contains("twice"));
    std::fs::remove_dir_all(&dir).ok();
}

/// With a network, the table gains simulated time, utilisation and time to target, and a
/// plot of validation loss against simulated time is drawn; DiLoCo's rounds cost less
/// simulated time than AllReduce's per-step all-reduces over the internet.
#[test]
fn a_comparison_on_a_network_reports_simulated_time() {
    let out = series::temp_dir("compare-sim");
    let flags = [
        "--strategies",
        "allreduce,diloco",
        "-H",
        "4",
        "--num-nodes",
        "2",
        "--max-steps",
        "8",
        "--batch-size",
        "16",
        "--val-size",
        "64",
        "--val-interval",
        "4",
        "--network",
        "internet",
        "--target-loss",
        "9",
        "--no-progress",
    ];
    let result = compare::run(&argv(&series::on_mnist(&flags, &out))).unwrap();
    let time = |i: usize| result.outcomes[i].summary.simulated_time_s.unwrap();
    assert!(
        time(1) < time(0) / 2.0,
        "diloco {} vs allreduce {}",
        time(1),
        time(0)
    );
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(table.contains("| Simulated time | Compute utilisation | Time to loss 9 |"));
    let row = table
        .lines()
        .find(|l| l.starts_with("| **diloco**"))
        .unwrap();
    assert!(
        row.ends_with("| 0.0 µs |"),
        "reached at the first evaluation: {row}"
    );
    let svg = std::fs::read_to_string(out.join("val_loss_vs_time.svg")).unwrap();
    assert!(svg.contains("simulated seconds") && svg.contains("diloco"));
    std::fs::remove_dir_all(out).ok();
}

/// The algorithms of 2025–26 side by side on MNIST, as the README's command runs them:
/// 4 nodes, the MLP, 200 steps of 64 examples, lr 3e-4, H = 20.
#[test]
fn zoo_the_2026_algorithms_reach_88_percent_on_mnist_and_send_what_they_promise() {
    let out = series::temp_dir("compare-zoo");
    let flags = [
        "--task",
        "mnist",
        "--strategies",
        "allreduce,diloco,streaming-diloco,sparseloco,muloco,desloc,noloco,powersgd",
        "-H",
        "20",
        "--max-steps",
        "200",
        "--val-size",
        "0",
        "--no-progress",
    ];
    let result = compare::run(&argv(&series::on_mnist(&flags, &out))).unwrap();
    let bytes = |name: StrategyName| {
        result
            .outcomes
            .iter()
            .find(|o| o.strategy == name)
            .unwrap()
            .report
            .bytes_sent_per_node()
    };
    for o in &result.outcomes {
        let v = o.report.final_validation().unwrap();
        let accuracy = v.global_accuracy.unwrap();
        assert!(accuracy >= 0.88, "{}: {accuracy}", o.strategy.as_str());
        assert_eq!(o.args.common.num_nodes, 4);
        assert_eq!(o.args.common.batch_size, 64);
    }
    let ratio = bytes(named("diloco")) / bytes(named("sparseloco"));
    assert!(
        ratio >= 20.0,
        "sparseloco sends 1/{ratio:.1} of diloco's bytes"
    );
    let ratio = bytes(named("allreduce")) / bytes(named("powersgd"));
    assert!(
        ratio >= 10.0,
        "powersgd sends 1/{ratio:.1} of allreduce's bytes"
    );
    std::fs::remove_dir_all(&out).ok();
}

/// A variant runs under its own label with its own flags (`LABEL=STRATEGY`,
/// `[overrides.LABEL]`): DiLoCo with and without a quorum under the same faults. The quorum
/// run leaves the half-speed node out of both rounds, so it drops more work and takes less
/// simulated time; both met the same faults.
#[test]
fn elastic_compare_runs_labelled_variants_under_the_same_faults() {
    let (out, config) = series::with_config(
        "compare-elastic",
        "strategies = [\"diloco\", \"diloco-quorum=diloco\"]\n\
         [overrides.diloco-quorum]\nmin_quorum = 3\ngrace = 0.0\n",
    );
    let flags = [
        "--config",
        config.to_str().unwrap(),
        "-H",
        "4",
        "--num-nodes",
        "4",
        "--max-steps",
        "8",
        "--batch-size",
        "16",
        "--val-size",
        "0",
        "--network",
        "1gbit:10ms",
        "--node-speed",
        "1,1,1,0.5",
        "--faults",
        "leave:1@1+2",
        "--no-progress",
    ];
    let result = compare::run(&argv(&series::on_mnist(&flags, &out.join("result")))).unwrap();
    let labels: Vec<&str> = result.outcomes.iter().map(|o| o.label.as_str()).collect();
    assert_eq!(labels, ["diloco", "diloco-quorum"]);
    assert!(
        result
            .outcomes
            .iter()
            .all(|o| o.strategy == named("diloco"))
    );
    let (plain, quorum) = (&result.outcomes[0], &result.outcomes[1]);
    assert_eq!(plain.report.elastic.faults, quorum.report.elastic.faults);
    let min_quorum = |o: &compare::Outcome| {
        o.args
            .common
            .strategy_flags
            .get::<QuorumArgs>()
            .unwrap()
            .min_quorum
    };
    assert!(min_quorum(quorum) == Some(3) && min_quorum(plain).is_none());
    assert!(quorum.report.node_steps_lost() > plain.report.node_steps_lost());
    let time = |o: &compare::Outcome| o.report.simulated_time_s().unwrap();
    assert!(
        time(quorum) < time(plain),
        "{} vs {}",
        time(quorum),
        time(plain)
    );
    let table = std::fs::read_to_string(out.join("result").join("results.md")).unwrap();
    assert!(table.contains("| **diloco-quorum** |"), "{table}");
    assert!(out.join("result/runs/diloco-quorum/faults.json").exists());
    std::fs::remove_dir_all(&out).ok();
}

/// The registered strategy called `name`.
fn named(name: &str) -> StrategyName {
    StrategyName::named(name).unwrap()
}

/// A flag on the command line replaces the file's value: a list replaces the file's list
/// (naming one of its strategies again is no repeat), and a file's value that the command
/// line replaces is never read (here a faults file that does not exist).
#[test]
fn the_command_line_replaces_lists_and_unread_values_of_the_file() {
    let (out, config) = series::with_config(
        "compare-replace",
        "num_nodes = 2\nmax_steps = 3\nbatch_size = 8\nval_size = 16\nno_progress = true\n\
         strategies = [\"allreduce\", \"diloco\", \"sparta\"]\n\
         faults = \"no-such-faults-file.toml\"\n",
    );
    let flags = [
        "--config",
        config.to_str().unwrap(),
        "--strategies",
        "diloco",
        "--faults",
        "leave:1@1+1",
    ];
    let result = compare::run(&argv(&series::on_mnist(&flags, &out.join("result")))).unwrap();
    let names: Vec<StrategyName> = result.outcomes.iter().map(|o| o.strategy).collect();
    assert_eq!(names, [named("diloco")]);
    // The command line's schedule ran: node 1 was away for a step (and its work since the
    // last synchronisation was dropped), where a run without faults loses nothing.
    assert!(result.outcomes[0].report.node_steps_lost() >= 1);
    std::fs::remove_dir_all(&out).ok();
}

/// Ctrl-C during the second of three strategies: status 130, the outputs hold the first run
/// finished and the second marked interrupted (with its checkpoint), and the third did not
/// start. The printed `--resume` command skips the first (its logs untouched), continues
/// the second from its checkpoint and runs the third: every figure that does not measure
/// wall time equals, bit for bit, that of the comparison left alone.
#[test]
fn ctrl_c_stops_a_comparison_and_resume_ends_it_as_the_comparison_left_alone() {
    let root = series::temp_dir("compare");
    let flags = |out: &str| -> Vec<String> {
        let flags = [
            "--strategies",
            "allreduce,diloco,fedavg",
            "--num-nodes",
            "2",
            "--batch-size",
            "16",
            "--max-steps",
            "300",
            "-H",
            "10",
            "--val-size",
            "64",
            "--val-interval",
            "100",
            "--no-progress",
        ];
        series::on_mnist(&flags, &root.join(out))
    };
    let bin = env!("CARGO_BIN_EXE_compare");
    let stopped_dir = root.join("stopped");
    let runs = stopped_dir.join("runs");
    let stopped = series::interrupted(bin, &flags("stopped"), &runs.join("diloco/train.csv"), 5);
    // The stopped run drew fewer samples, and is no sign of unequal conditions.
    assert!(!series::stderr(&stopped).contains("did not start from the same"));

    let rows = series::csv_rows(&stopped_dir.join("summary.csv"));
    let statuses: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["strategy"].as_str(), r["status"].as_str()))
        .collect();
    assert_eq!(statuses.len(), 2, "fedavg did not start: {statuses:?}");
    assert_eq!(statuses[0], ("allreduce", "finished"));
    let at: usize = statuses[1]
        .1
        .strip_prefix("interrupted at step ")
        .unwrap_or_else(|| panic!("{statuses:?}"))
        .parse()
        .unwrap();
    assert!((5..300).contains(&at), "{at}");
    assert_eq!(statuses[1].0, "diloco");
    let table = std::fs::read_to_string(stopped_dir.join("results.md")).unwrap();
    assert!(
        table.contains(&format!("| **diloco** (interrupted at step {at}) |")),
        "{table}"
    );
    assert!(!table.contains("fedavg"), "{table}");
    let diloco: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs.join("diloco/summary.json")).unwrap())
            .unwrap();
    assert_eq!(diloco["interrupted_at_step"], at);
    assert_eq!(series::checkpoints(&runs.join("diloco")).len(), 1);
    assert!(!runs.join("fedavg").exists());

    let first_log = runs.join("allreduce/train.csv");
    let (log_before, mtime_before) = (
        std::fs::read_to_string(&first_log).unwrap(),
        std::fs::metadata(&first_log).unwrap().modified().unwrap(),
    );
    series::resume_series(&stopped, "allreduce", "diloco");
    assert_eq!(std::fs::read_to_string(&first_log).unwrap(), log_before);
    assert_eq!(
        std::fs::metadata(&first_log).unwrap().modified().unwrap(),
        mtime_before,
        "the first run was not rerun"
    );

    tests::assert_succeeded(&Command::new(bin).args(flags("alone")).output().unwrap());
    let summary = |dir: &str| series::csv_rows(&root.join(dir).join("summary.csv"));
    let (resumed_rows, alone_rows) = (summary("stopped"), summary("alone"));
    assert_eq!(resumed_rows.len(), 3);
    for (a, b) in resumed_rows.iter().zip(&alone_rows) {
        for key in [
            "strategy",
            "final_train_loss",
            "final_val_loss",
            "val_accuracy",
            "bytes_sent_per_node",
            "status",
        ] {
            assert_eq!(a[key], b[key], "{}: {key}", a["strategy"]);
        }
        assert_eq!(a["status"], "finished");
    }
    // The continued run's every step, and its evaluations, as the run left alone.
    for column in ["step", "train_loss", "lr", "bytes_sent"] {
        assert_eq!(
            series::train_column(&runs.join("diloco"), column),
            series::train_column(&root.join("alone/runs/diloco"), column),
            "{column}"
        );
    }
    std::fs::remove_dir_all(&root).ok();
}

/// `--resume` where no comparison ran is refused, naming the folder, before any data loads.
#[test]
fn resume_without_an_earlier_comparison_names_the_folder() {
    let missing = series::temp_dir("compare-nothing");
    let e = compare::run(&argv(&["--resume", missing.to_str().unwrap()]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "--resume {}: nothing to resume",
            missing.display()
        )),
        "{e}"
    );
}
