//! `--charge-as PARAMS`: a small model trained for its loss curve and charged on the
//! simulated clock as a model of PARAMS parameters. Its bytes and compute are checked
//! against the closed forms; bad counts are refused naming the flag.

use gym_core::comm::{CollectiveOp, Group, Network, ReduceOp};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("proxy", name)
}

/// Runs `binary` with `flags`, logging into `logs` as the run `run`.
fn run(binary: &str, logs: &Path, flags: &[&str]) -> Output {
    Command::new(binary)
        .args(["--no-progress", "--run-name", "run", "--val-size", "0"])
        .arg("--log-dir")
        .arg(logs)
        .args(flags)
        .output()
        .expect("the binary runs")
}

fn summary(logs: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(logs.join("run/summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Checks a proxy run of `steps` steps of AllReduce on `k` nodes of `flops_per_s`, each
/// node's step `tokens` tokens, charged as `params` parameters over `network`: every
/// node sends `2(k−1)/k · 4·params` bytes a step (an f32 gradient of `params` values in a
/// ring), computes `6·params·tokens / flops_per_s` seconds a step, and communicates for
/// the network's all-reduce time of `4·params` bytes.
fn check_closed_forms(
    s: &serde_json::Value,
    (k, steps, tokens): (usize, usize, f64),
    params: u64,
    network: &str,
    flops_per_s: f64,
) {
    let close = |got: f64, want: f64, what: &str| {
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{what}: {got} vs {want}\n{s}"
        );
    };
    assert_eq!(s["charged_as_params"], params);
    let real = s["params"].as_u64().unwrap();
    assert!(real > 0 && real != params, "{s}");
    let payload = 4 * params;
    let per_step = 2 * (k as u64 - 1) * payload / k as u64;
    assert_eq!(
        s["bytes_sent_per_node"].as_f64(),
        Some((steps as u64 * per_step) as f64)
    );
    assert_eq!(s["bytes_received_per_node"], s["bytes_sent_per_node"]);
    let compute = steps as f64 * 6.0 * params as f64 * tokens / flops_per_s;
    close(
        s["simulated_compute_s"].as_f64().unwrap(),
        compute,
        "compute",
    );
    let net: Network = network.parse().unwrap();
    let op = CollectiveOp::AllReduce(ReduceOp::Mean);
    let comm = steps as f64 * net.collective_time(op, &Group::world(k), payload);
    close(
        s["simulated_comm_s"].as_f64().unwrap(),
        comm,
        "communication",
    );
    close(
        s["simulated_time_s"].as_f64().unwrap(),
        compute + comm,
        "time",
    );
}

/// MNIST charged as 1B parameters: bytes `2(k−1)/k × 4 B × 1e9` per step per node, compute
/// `6e9 ×` examples per node step (an example is one token) over the node's FLOP/s; the
/// printed summary labels the figures as a proxy's.
#[test]
fn charge_as_mnist_counts_and_times_a_billion_parameters() {
    let logs = temp_dir("mnist");
    let mnist = tests::shared_data("mnist");
    let out = run(
        env!("CARGO_BIN_EXE_mnist"),
        &logs,
        &[
            "--strategy",
            "allreduce",
            "--num-nodes",
            "4",
            "--max-steps",
            "2",
            "--batch-size",
            "16",
            "--network",
            "1gbit:10ms",
            "--node-tflops",
            "10",
            "--charge-as",
            "1B",
            "--data-dir",
            mnist.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    tests::assert_succeeded(&out);
    let s = summary(&logs);
    check_closed_forms(&s, (4, 2, 16.0), 1_000_000_000, "1gbit:10ms", 10e12);
    for line in ["simulated time", "bytes per node"] {
        let printed = stdout.lines().find(|l| l.starts_with(line)).unwrap();
        assert!(
            printed.ends_with("(proxy: charged as 1B parameters)"),
            "{printed}"
        );
    }
    std::fs::remove_dir_all(&logs).ok();
}

/// nanoGPT charged as 124M parameters: a token is a position, so a node's step computes
/// `6 · 124M · batch · block` FLOPs.
#[test]
fn charge_as_nanogpt_charges_six_n_per_position() {
    let logs = temp_dir("gpt");
    let shakespeare = tests::shared_data("shakespeare");
    let out = run(
        env!("CARGO_BIN_EXE_nanogpt"),
        &logs,
        &[
            "--strategy",
            "allreduce",
            "--num-nodes",
            "2",
            "--max-steps",
            "2",
            "--batch-size",
            "4",
            "--block-size",
            "16",
            "--n-layer",
            "1",
            "--n-head",
            "2",
            "--n-embd",
            "16",
            "--num-tokens",
            "4",
            "--network",
            "100mbit:50ms",
            "--node-tflops",
            "h100",
            "--charge-as",
            "124M",
            "--data-dir",
            shakespeare.to_str().unwrap(),
        ],
    );
    tests::assert_succeeded(&out);
    let s = summary(&logs);
    check_closed_forms(
        &s,
        (2, 2, 4.0 * 16.0),
        124_000_000,
        "100mbit:50ms",
        989e12 * 0.4,
    );
    std::fs::remove_dir_all(&logs).ok();
}

/// A count that is zero, negative, not finite or unreadable, a proxy without a network, and
/// a proxy on measured compute are refused before any data is read, naming the flag, by
/// every binary that trains.
#[test]
fn charge_as_bad_counts_are_refused_naming_the_flag() {
    let net = ["--network", "1gbit:10ms"];
    let cases: [(&[&str], &str); 7] = [
        (&["--charge-as", "0"], "is zero"),
        (&["--charge-as=-7B"], "is negative"),
        (&["--charge-as", "inf"], "not a finite"),
        (&["--charge-as", "NaN"], "not a finite"),
        (&["--charge-as", "seven"], "not a parameter count"),
        (
            &["--node-tflops", "measured", "--charge-as", "1B"],
            "measured",
        ),
        (&["--charge-as", "1B"], "--charge-as needs --network"),
    ];
    for binary in [
        env!("CARGO_BIN_EXE_mnist"),
        env!("CARGO_BIN_EXE_nanogpt"),
        env!("CARGO_BIN_EXE_cifar"),
    ] {
        for (i, (flags, says)) in cases.iter().enumerate() {
            let with_net = if says.contains("needs --network") {
                &[][..]
            } else {
                &net[..]
            };
            let logs = temp_dir(&format!("bad-{i}"));
            let out = run(
                binary,
                &logs,
                &[with_net, flags, &["--data-dir", "/nonexistent"]].concat(),
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{binary} {flags:?}: accepted");
            assert!(
                stderr.contains("--charge-as") && stderr.contains(says),
                "{binary} {flags:?}: {stderr}"
            );
            assert!(
                !logs.join("run").exists(),
                "{binary} {flags:?}: a run folder"
            );
        }
    }
}

/// A comparison of proxies says so under its table: what the bytes and times are charged
/// as, and whose the losses are.
#[test]
fn charge_as_a_comparison_labels_its_times_as_a_proxys() {
    let out = temp_dir("compare");
    let mnist = tests::shared_data("mnist");
    let done = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--strategies", "allreduce,diloco", "-H", "1"])
        .args(["--num-nodes", "2", "--batch-size", "16", "--max-steps", "2"])
        .args(["--val-size", "0", "--no-progress"])
        .args(["--network", "1gbit:10ms", "--charge-as", "7e9"])
        .arg("--data-dir")
        .arg(mnist)
        .arg("--out-dir")
        .arg(&out)
        .output()
        .expect("the compare binary runs");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(
        table.contains("Proxy: bytes sent and simulated times are charged as 7B parameters")
            && table.contains("the losses are those of the model trained"),
        "{table}"
    );
    std::fs::remove_dir_all(&out).ok();
}
