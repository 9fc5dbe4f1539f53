//! `--network FILE`: a shipped network file drives the simulated clock of a short MNIST run,
//! and a bad file or a flag that contradicts it is refused before any node starts, naming
//! the field and the line.

use gym_core::comm::network::NetworkFile;
use gym_core::comm::{CollectiveOp, Group, ReduceOp};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root, where `examples/networks/` is.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("netfile", name)
}

/// Runs `mnist` from the repository root for 2 steps of AllReduce with `extra` flags.
fn mnist(log_dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mnist"))
        .current_dir(repo_root())
        .args(["--max-steps", "2", "--batch-size", "16", "--val-size", "0"])
        .args(["--no-progress", "--run-name", "run"])
        .args(tests::mnist_and_logs(log_dir))
        .args(extra)
        .output()
        .expect("the mnist binary runs")
}

/// A run on `examples/networks/consumer-internet.toml` (12 nodes in 3 regions) is charged the
/// hierarchical all-reduce of the file's network for each of its 2 steps.
#[test]
fn a_network_file_drives_the_simulated_clock() {
    let logs = temp_dir("run");
    let out = mnist(
        &logs,
        &[
            "--num-nodes",
            "12",
            "--network",
            "examples/networks/consumer-internet.toml",
        ],
    );
    tests::assert_succeeded(&out);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("run/summary.json")).unwrap())
            .unwrap();
    let (k, steps) = (12.0, 2.0);
    // The ring counts 2(k−1)/k of the buffer sent per all-reduce.
    let sent = summary["bytes_sent_per_node"].as_f64().unwrap();
    let n = sent / steps / (2.0 * (k - 1.0) / k);
    let file =
        NetworkFile::read(&repo_root().join("examples/networks/consumer-internet.toml")).unwrap();
    let per_step = file.network().collective_time(
        CollectiveOp::AllReduce(ReduceOp::Mean),
        &Group::world(12),
        n.round() as u64,
    );
    let comm = summary["simulated_comm_s"].as_f64().unwrap();
    assert!(
        (comm - steps * per_step).abs() <= 1e-3 * comm,
        "communication {comm} s, want {} s",
        steps * per_step
    );
    // Four wide steps across the 3 regions, each at least the slowest hop's 223 ms.
    assert!(per_step > 4.0 * 0.223, "{per_step}");
    std::fs::remove_dir_all(&logs).ok();
}

#[test]
fn bad_network_files_and_contradicting_flags_are_refused() {
    let dir = temp_dir("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let good = "source = \"a test\"\nregions = [\"a\", \"b\"]\nlatency_ms = [[1, 50], [50, 1]]\n\
                bandwidth_gbit = [[10, 1], [1, 10]]\n[[nodes]]\nregion = \"a\"\n[[nodes]]\nregion = \"b\"\n";
    assert!(NetworkFile::parse(good, "good").is_ok());
    let zero = file(
        "zero.toml",
        &good.replace("[[10, 1], [1, 10]]", "[[10, 0], [1, 10]]"),
    );
    let mars = file(
        "mars.toml",
        &good.replace("region = \"b\"", "region = \"mars\""),
    );
    let away = file(
        "away.toml",
        &format!("{good}availability = [[0.0, 60.0], [120.0, 1e9]]\n"),
    );
    let cases: [(Vec<&str>, &[&str]); 6] = [
        (
            vec!["--num-nodes", "2", "--network", &zero],
            &["bandwidth_gbit[0][1]", "line 4", "above 0"],
        ),
        (
            vec!["--num-nodes", "2", "--network", &mars],
            &["nodes[1].region", "line 8", "`mars`"],
        ),
        (
            vec!["--num-nodes", "2", "--network", &away],
            &["availability", "line 9", "not yet run"],
        ),
        (
            vec!["--num-nodes", "4", "--network", "consumer-internet"],
            &["12 nodes", "has 4", "line"],
        ),
        (
            vec![
                "--num-nodes",
                "16",
                "--network",
                "halos",
                "--topology",
                "relay",
            ],
            &["--topology", "sets the topology"],
        ),
        (
            vec![
                "--num-nodes",
                "16",
                "--network",
                "halos",
                "--node-speed",
                "1",
            ],
            &["--node-speed", "one place"],
        ),
    ];
    for (flags, says) in cases {
        let logs = temp_dir("bad-run");
        let out = mnist(&logs, &flags);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: accepted");
        for s in says {
            assert!(stderr.contains(s), "{flags:?}: no `{s}` in {stderr}");
        }
        assert!(
            !logs.join("run").exists(),
            "{flags:?}: a run folder was made"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
