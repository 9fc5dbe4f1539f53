//! The `sweep` command end to end on real MNIST (a few steps): a grid timed on two
//! networks, its table, CSV and plots.

use examples::cli::StrategyName;
use std::ffi::{OsStr, OsString};
use std::process::Command;

mod series;

fn argv(words: &[impl AsRef<OsStr>]) -> Vec<OsString> {
    series::argv("sweep", words)
}

#[test]
fn a_sweep_times_every_cell_of_its_grid() {
    let out = series::temp_dir("sweep-grid");
    let flags = [
        "--strategies",
        "allreduce,diloco",
        "--nodes",
        "1,2,4",
        "--sync-intervals",
        "4",
        "--networks",
        "datacenter,100mbit:50ms",
        "--global-batch",
        "32",
        "--max-steps",
        "8",
        "--val-interval",
        "4",
        "--val-size",
        "128",
        "--target-loss",
        "5",
        "--no-progress",
    ];
    let sweep = examples::sweep::run(&argv(&series::on_mnist(&flags, &out))).unwrap();
    // 2 strategies × 1 interval × 2 networks × 3 node counts.
    assert_eq!(sweep.cells.len(), 12);
    for c in &sweep.cells {
        assert_eq!(c.report.num_nodes, c.nodes);
        assert_eq!(c.summary.num_nodes, c.nodes);
        // Equal total examples: 32 per step over all nodes.
        assert_eq!(c.report.train[0].examples_seen, 32, "{}", c.name());
        assert!(c.summary.simulated_time_s.unwrap() > 0.0);
        // The first evaluation (before any step) is under the target: reached at time 0.
        assert_eq!(c.summary.time_to_target_s, Some(0.0), "{}", c.name());
        assert_eq!(c.sync_interval.is_some(), c.strategy == named("diloco"));
    }
    // AllReduce on K nodes of 32/K examples is one node of 32: the same losses whatever K
    // and whatever the network; only the simulated time differs.
    let allreduce: Vec<_> = sweep
        .cells
        .iter()
        .filter(|c| c.strategy == named("allreduce"))
        .collect();
    for c in &allreduce {
        let (a, b) = (
            c.summary.final_val_loss.unwrap(),
            allreduce[0].summary.final_val_loss.unwrap(),
        );
        assert!((a - b).abs() < 1e-4, "{}: {a} vs {b}", c.name());
    }
    let time = |k: usize, net: &str| {
        allreduce
            .iter()
            .find(|c| c.nodes == k && c.network == net)
            .unwrap()
            .summary
            .simulated_time_s
            .unwrap()
    };
    assert_eq!(
        time(1, "datacenter"),
        time(1, "100mbit:50ms"),
        "one node sends nothing"
    );
    assert!(time(4, "100mbit:50ms") > 10.0 * time(4, "datacenter"));
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("| allreduce") || l.starts_with("| diloco"))
            .count(),
        12
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 13);
    for svg in [
        "simulated_time.svg",
        "final_loss.svg",
        "time_to_target.svg",
        "val_loss_vs_time_datacenter.svg",
        "val_loss_vs_time_100mbit_50ms.svg",
    ] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap_or_else(|e| panic!("{svg}: {e}"));
        assert!(text.contains("allreduce"), "{svg} has a legend");
    }
    std::fs::remove_dir_all(out).ok();
}

/// The registered strategy called `name`.
fn named(name: &str) -> StrategyName {
    StrategyName::named(name).unwrap()
}

/// The scaling experiment's rules from a config file: `[at_nodes.K]` flags for the cells of
/// K nodes only, a strategy's `[overrides]` giving it node counts of its own, and a list on
/// the command line replacing the file's list; `--x-axis examples` plots against examples.
#[test]
fn per_node_count_rules_and_lists_from_the_command_line() {
    let (out, config) = series::with_config(
        "sweep-rules",
        r#"
strategies = ["allreduce", "diloco", "sparta"]
nodes = [1, 2, 4]
networks = ["datacenter"]
global_batch = 16
max_steps = 4
lr = 1e-3
warmup_steps = 2
val_interval = 2
val_size = 32
x_axis = "examples"
[overrides.allreduce]
nodes = [1]
[at_nodes.1]
lr = 5e-4
warmup_steps = 4
"#,
    );
    let flags = [
        "--config",
        config.to_str().unwrap(),
        "--strategies",
        "allreduce,diloco",
        "--nodes",
        "1,2",
        "--no-progress",
    ];
    let sweep = examples::sweep::run(&argv(&series::on_mnist(&flags, &out))).unwrap();
    let cells: Vec<(String, usize)> = sweep
        .cells
        .iter()
        .map(|c| (c.strategy.as_str().to_string(), c.nodes))
        .collect();
    // The command line's lists replace the file's; AllReduce runs on its own node count.
    assert_eq!(
        cells,
        [("allreduce", 1), ("diloco", 1), ("diloco", 2)].map(|(s, k)| (s.to_string(), k))
    );
    for c in &sweep.cells {
        let lr = c.report.train[0].lr;
        // Warmup starts at lr / W: 5e-4 / 4 on one node, 1e-3 / 2 on two.
        let expected = if c.nodes == 1 { 5e-4 / 4.0 } else { 1e-3 / 2.0 };
        assert!((lr - expected).abs() < 1e-12, "{}: lr {lr}", c.name());
    }
    let plot = std::fs::read_to_string(out.join("val_loss.svg")).unwrap();
    assert!(plot.contains("examples seen (all nodes)"));
    std::fs::remove_dir_all(&out).ok();
}

/// Ctrl-C during the second cell: status 130, `results.csv` holds the first cell finished and
/// the second interrupted; the printed `--resume` command skips the first and continues the
/// second from its checkpoint, and the table then equals the sweep left alone's, simulated
/// clocks included (the same code as `compare`'s, in `examples::series`).
#[test]
fn ctrl_c_stops_a_sweep_and_resume_ends_it_as_the_sweep_left_alone() {
    let root = series::temp_dir("sweep");
    let flags = |out: &str| -> Vec<String> {
        let flags = [
            "--strategies",
            "allreduce,diloco",
            "--nodes",
            "2",
            "--sync-intervals",
            "10",
            "--networks",
            "datacenter",
            "--global-batch",
            "32",
            "--max-steps",
            "300",
            "--val-interval",
            "100",
            "--val-size",
            "64",
            "--no-progress",
        ];
        series::on_mnist(&flags, &root.join(out))
    };
    let bin = env!("CARGO_BIN_EXE_sweep");
    let (first, second) = ("allreduce-k2-datacenter", "diloco-H10-k2-datacenter");
    let runs = root.join("stopped/runs");
    let stopped = series::interrupted(
        bin,
        &flags("stopped"),
        &runs.join(second).join("train.csv"),
        5,
    );
    let rows = series::csv_rows(&root.join("stopped/results.csv"));
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["status"], "finished");
    assert!(
        rows[1]["status"].starts_with("interrupted at step "),
        "{rows:?}"
    );
    assert_eq!(series::checkpoints(&runs.join(second)).len(), 1);
    let table = std::fs::read_to_string(root.join("stopped/results.md")).unwrap();
    assert!(table.contains("| diloco (interrupted at step "), "{table}");

    let first_log = std::fs::read_to_string(runs.join(first).join("train.csv")).unwrap();
    series::resume_series(&stopped, first, second);
    assert_eq!(
        std::fs::read_to_string(runs.join(first).join("train.csv")).unwrap(),
        first_log
    );

    tests::assert_succeeded(&Command::new(bin).args(flags("alone")).output().unwrap());
    let resumed_rows = series::csv_rows(&root.join("stopped/results.csv"));
    assert_eq!(
        resumed_rows,
        series::csv_rows(&root.join("alone/results.csv"))
    );
    assert!(resumed_rows.iter().all(|r| r["status"] == "finished"));
    assert_eq!(
        series::train_column(&runs.join(second), "sim_time_s"),
        series::train_column(&root.join("alone/runs").join(second), "sim_time_s")
    );
    std::fs::remove_dir_all(&root).ok();
}
