//! The `plan` binary: closed forms at sizes nothing here could train, its JSON, a sweep's
//! table and chart, bad input refused naming the flag, and the 10,000-node case.

use gym_core::comm::{CollectiveOp, Group, Network, ReduceOp, cost};
use std::process::{Command, Output};

fn plan(flags: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plan"))
        .args(flags)
        .output()
        .expect("plan runs")
}

fn json(flags: &[&str]) -> serde_json::Value {
    let mut all = flags.to_vec();
    all.push("--json");
    let out = plan(&all);
    tests::assert_succeeded(&out);
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// DiLoCo on 7B parameters and 64 nodes with jitter-free compute from tokens: every round
/// is H steps of 6·N·T/K FLOPs at peak × MFU, then one f32 ring all-reduce of 4N bytes on
/// the network, so the totals are closed forms.
#[test]
fn a_7b_diloco_plan_equals_the_closed_form() {
    let (n, k, h, tokens_per_step, rounds) = (7e9, 64usize, 100usize, 4_194_304.0, 5usize);
    let steps = (h * rounds).to_string();
    let v = json(&[
        "--params",
        "7B",
        "--num-nodes",
        "64",
        "--strategy",
        "diloco",
        "-H",
        "100",
        "--steps",
        &steps,
        "--tokens-per-step",
        "4194304",
        "--node-tflops",
        "h100",
        "--mfu",
        "0.4",
        "--network",
        "10gbit:30ms",
    ]);
    let step_s = 6.0 * n * tokens_per_step / k as f64 / (989e12 * 0.4);
    let network: Network = "10gbit:30ms".parse().unwrap();
    let sync_s = network.collective_time(
        CollectiveOp::AllReduce(ReduceOp::Mean),
        &Group::world(k),
        (4.0 * n) as u64,
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    assert!(
        close(f(&v, "simulated_compute_s"), step_s * (h * rounds) as f64),
        "{v}"
    );
    assert!(
        close(f(&v, "simulated_comm_s"), sync_s * rounds as f64),
        "{v}"
    );
    assert!(close(
        f(&v, "simulated_time_s"),
        (step_s * h as f64 + sync_s) * rounds as f64
    ));
    let ring = 2.0 * (k - 1) as f64 / k as f64 * 4.0 * n;
    assert!(
        close(f(&v, "bytes_sent_per_node"), ring * rounds as f64),
        "{v}"
    );
    let cu = step_s * h as f64 / (step_s * h as f64 + sync_s);
    assert!(close(f(&v, "compute_utilisation"), cu), "{v}");
    assert!(close(
        f(&v, "tokens_per_s"),
        tokens_per_step * (h * rounds) as f64 / f(&v, "simulated_time_s")
    ));
    assert_eq!(v["round_steps"], 100);
    assert_eq!(v["num_nodes"], 64);
}

/// `--tokens` sets the steps; the same plan from `--steps` is the same.
#[test]
fn tokens_give_the_steps() {
    let common = [
        "--params",
        "1.3B",
        "--num-nodes",
        "8",
        "--strategy",
        "allreduce",
        "--tokens-per-step",
        "1M",
        "--node-tflops",
        "312",
        "--network",
        "100gbit:1ms",
    ];
    let mut by_tokens = json(&[&common[..], &["--tokens", "20M"]].concat());
    let mut by_steps = json(&[&common[..], &["--steps", "20"]].concat());
    for v in [&mut by_tokens, &mut by_steps] {
        let v = v.as_object_mut().unwrap();
        v.remove("wall_time_s");
        v.remove("peak_rss_bytes");
    }
    assert_eq!(by_tokens, by_steps);
    assert_eq!(by_tokens["steps"], 20);
}

/// A sweep over bandwidths and strategies prints one row per combination and draws the
/// compute utilisation against the bandwidth; DiLoCo's rises with the bandwidth and stays
/// above AllReduce's.
#[test]
fn a_sweep_prints_a_table_and_draws_utilisation_against_bandwidth() {
    let out_dir = std::env::temp_dir().join(format!("gym-plan-sweep-{}", std::process::id()));
    std::fs::remove_dir_all(&out_dir).ok();
    // The plan the sweep varies, and the single plans below check it against.
    let setup = [
        "--params",
        "1B",
        "--num-nodes",
        "16",
        "--steps",
        "200",
        "--step-seconds",
        "1",
        "-H",
        "50",
    ];
    let sweep = [
        "--sweep",
        "strategy=allreduce,diloco",
        "--sweep",
        "network=100mbit:50ms,1gbit:50ms,10gbit:50ms",
        "--out-dir",
        out_dir.to_str().unwrap(),
    ];
    let out = plan(&[&setup[..], &sweep].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    tests::assert_succeeded(&out);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| strategy"))
        .collect();
    assert_eq!(rows.len(), 6, "{text}");
    let svg = std::fs::read_to_string(out_dir.join("utilisation_vs_bandwidth.svg")).unwrap();
    assert!(svg.contains("diloco") && svg.contains("allreduce"));
    assert!(out_dir.join("results.md").exists());
    let cu = |strategy: &str, network: &str| {
        let single = [&setup[..], &["--strategy", strategy, "--network", network]].concat();
        f(&json(&single), "compute_utilisation")
    };
    let d: Vec<f64> = ["100mbit:50ms", "1gbit:50ms", "10gbit:50ms"]
        .iter()
        .map(|n| cu("diloco", n))
        .collect();
    assert!(d[0] < d[1] && d[1] < d[2], "{d:?}");
    assert!(cu("allreduce", "1gbit:50ms") < d[1]);
    std::fs::remove_dir_all(&out_dir).ok();
}

#[test]
fn bad_input_is_refused_naming_the_flag_before_any_work() {
    let refused = |flags: &[&str], needle: &str| {
        let out = plan(flags);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(err.contains(needle), "{flags:?}: {err}");
    };
    let ok = ["--num-nodes", "4", "--steps", "10", "--step-seconds", "1"];
    for bad in ["0", "-7B", "nan", "inf", "seven"] {
        refused(&[&["--params", bad][..], &ok].concat(), "--params");
    }
    // Each case: flags after `--params 1B`, one of them bad or missing, and the flag (or
    // words) the refusal names.
    let alone: &[(&[&str], &str)] = &[
        (
            &["--num-nodes", "0", "--steps", "10", "--step-seconds", "1"],
            "--num-nodes",
        ),
        (&["--steps", "0", "--step-seconds", "1"], "--steps"),
        (&["--steps", "10", "--step-seconds", "0"], "--step-seconds"),
        (
            &["--steps", "10", "--step-seconds", "nan"],
            "--step-seconds",
        ),
        (
            &["--steps", "10", "--tokens-per-step", "1M", "--mfu", "1.5"],
            "--mfu",
        ),
        (
            &[
                "--steps",
                "10",
                "--tokens-per-step",
                "1M",
                "--node-tflops",
                "fast",
            ],
            "--node-tflops",
        ),
        (
            &["--tokens", "1B", "--step-seconds", "1"],
            "--tokens-per-step",
        ),
    ];
    // The same, the bad flags after `--params 1B` and a plan that is otherwise whole (`ok`).
    let after_ok: &[(&[&str], &str)] = &[
        (&["--network", "1parsec:1ms"], "--network"),
        (&["--faults", "crash:9@5"], "--faults"),
        (&["--faults", "bogus"], "--faults"),
        (&["--sweep", "network="], "no values"),
        (&["--sweep", "network"], "KEY=V1,V2"),
        (
            &["--strategy", "diloco", "--compression", "powersgd:2"],
            "PowerSGD",
        ),
        // A network file's node count must be the plan's.
        (&["--network", "halos"], "--network"),
    ];
    let base = ["--params", "1B"];
    for &(flags, needle) in alone {
        refused(&[&base[..], flags].concat(), needle);
    }
    for &(flags, needle) in after_ok {
        refused(&[&base[..], &ok, flags].concat(), needle);
    }
}

/// The plan the fault and quorum tests vary: DiLoCo (H = 10) on 8 nodes of a 100M model, 50
/// steps of a second each, on a 1 Gbit/s, 50 ms network.
const DILOCO_100M: [&str; 14] = [
    "--params",
    "100M",
    "--num-nodes",
    "8",
    "--strategy",
    "diloco",
    "-H",
    "10",
    "--steps",
    "50",
    "--step-seconds",
    "1",
    "--network",
    "1gbit:50ms",
];

/// A plan under faults: a node that leaves and rejoins costs goodput (its time away, the
/// state it receives, the work it drops), printed and in the JSON; strategies that keep
/// transfers in flight across steps plan under faults too.
#[test]
fn a_plan_runs_faults_and_prints_goodput() {
    let base = DILOCO_100M;
    let clean = json(&base);
    let faulty = json(&[&base[..], &["--faults", "leave:3@12+10;slow:5@0+50x0.5"]].concat());
    assert!(f(&faulty, "goodput") < f(&clean, "goodput"), "{faulty}");
    assert!(f(&faulty, "simulated_time_s") > f(&clean, "simulated_time_s"));
    // The rejoin's broadcast: the model, the inner AdamW's two moments, the master and the
    // outer momentum, 5 bytes each per parameter, to node 3 (received, so the mean grows).
    let extra = f(&faulty, "bytes_received_per_node") - f(&clean, "bytes_received_per_node");
    assert!(extra > 0.0, "{faulty}");
    // Node 3 is away for steps 12 to 21 and drops the two steps of its round before it.
    assert_eq!(faulty["node_steps_lost"], 12, "{faulty}");
    assert_eq!(faulty["elastic"]["node_steps_absent"], 10, "{faulty}");
    assert_eq!(faulty["elastic"]["rejoins"], 1, "{faulty}");
    assert_eq!(clean["node_steps_lost"], 0, "{clean}");
    let out = plan(&[&base[..], &["--faults", "crash:1@5"]].concat());
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("goodput") && text.contains("node-steps lost"),
        "{text}"
    );
    // Fragments in flight (Streaming DiLoCo) and delayed means (SPARTA) plan under faults.
    for strategy in [
        &[
            "--strategy",
            "streaming-diloco",
            "-H",
            "10",
            "--overlap",
            "2",
        ][..],
        &["--strategy", "sparta", "--sparta-delay", "2"],
    ] {
        // Without DiLoCo's `-H 10`.
        let mut flags = base.to_vec();
        flags.drain(4..8);
        flags.extend(strategy);
        let clean = json(&flags);
        flags.extend(["--faults", "leave:3@12+10"]);
        let faulty = json(&flags);
        assert!(f(&faulty, "goodput") < f(&clean, "goodput"), "{faulty}");
        assert!(f(&faulty, "node_steps_lost") >= 10.0, "{faulty}");
    }
}

/// DiLoCo's quorum flags plan: the outer steps leave out the nodes that arrive late on the
/// planned clocks (here node 7, at half speed), whose rounds are lost, so the goodput falls
/// below the compute utilisation; a bad quorum is refused naming its flag.
#[test]
fn a_plan_takes_diloco_s_quorum() {
    let base = [&DILOCO_100M[..], &["--node-speed", "1,1,1,1,1,1,1,0.5"]].concat();
    let all = json(&base);
    for quorum in [
        &["--min-quorum", "7", "--grace", "0.5"][..],
        &["--fastest", "7"],
    ] {
        let late = json(&[&base[..], quorum].concat());
        // Five rounds, each dropping node 7's ten steps.
        assert_eq!(late["node_steps_lost"], 50, "{quorum:?}: {late}");
        assert_eq!(
            late["elastic"]["node_steps_discarded"], 50,
            "{quorum:?}: {late}"
        );
        assert!(
            f(&late, "goodput") < f(&late, "compute_utilisation"),
            "{quorum:?}: {late}"
        );
        // Nobody waits for the slow node: the run is shorter than waiting for everyone.
        assert!(
            f(&late, "simulated_time_s") < f(&all, "simulated_time_s"),
            "{quorum:?}: {late} vs {all}"
        );
    }
    // A grace window that covers the slow node takes it in: nothing lost.
    let wide = json(&[&base[..], &["--min-quorum", "7", "--grace", "100"]].concat());
    assert_eq!(wide["node_steps_lost"], 0, "{wide}");
    // With faults too.
    let faulty = [&base[..], &["--fastest", "6", "--faults", "leave:2@12+10"]].concat();
    assert!(json(&faulty)["node_steps_lost"].as_u64().unwrap() > 50);
    let out = plan(&[&base[..], &["--min-quorum", "0"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--min-quorum"),
        "{err}"
    );
}

/// `--model` gives the shapes, computed from GPT-2 small's sizes (its published 124,439,808
/// parameters): PowerSGD plans every step as its three all-reduces (the vectors' exact
/// mean, then the sums of every matrix's `P` and `Q` at rank 4), DeMo as one all-gather of
/// every tensor's top-32 DCT coefficients per chunk (u16 indices for 64×64 chunks), their
/// bytes and seconds written out here from the sizes; by `--params` alone both are refused,
/// naming the flag and `--model`.
#[test]
fn a_model_s_shapes_plan_powersgd_and_demo_by_their_closed_forms() {
    use gym_strategies::demo::dct::chunk_size;
    let (l, d, t, v, k, steps) = (12u64, 768u64, 1024u64, 50257u64, 8usize, 3u64);
    let network: Network = "1gbit:10ms".parse().unwrap();
    let world = Group::world(k);
    let common = [
        "--model",
        "gpt:12,12,768,1024,50257",
        "--num-nodes",
        "8",
        "--steps",
        "3",
        "--step-seconds",
        "1",
        "--network",
        "1gbit:10ms",
    ];
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    // PowerSGD, rank 4: every matrix compresses.
    let vectors = l * 13 * d + 2 * d;
    let p = 4 * (v + t + 7 * l * d);
    let q = 4 * (2 * d + 9 * l * d);
    let calls = [
        (CollectiveOp::AllReduce(ReduceOp::Mean), 4 * vectors),
        (CollectiveOp::AllReduce(ReduceOp::Sum), 4 * p),
        (CollectiveOp::AllReduce(ReduceOp::Sum), 4 * q),
    ];
    let v_ = json(
        &[
            &common[..],
            &["--strategy", "powersgd", "--powersgd-rank", "4"],
        ]
        .concat(),
    );
    assert_eq!(v_["params"], 124_439_808u64, "{v_}");
    assert_eq!(v_["model"], "gpt:12,12,768,1024,50257");
    let sent: u64 = calls.iter().map(|&(op, b)| cost(op, &world, 0, b).0).sum();
    assert_eq!(f(&v_, "bytes_sent_per_node"), (steps * sent) as f64, "{v_}");
    let comm: f64 = calls
        .iter()
        .map(|&(op, b)| network.collective_time(op, &world, b))
        .sum();
    assert!(
        close(f(&v_, "simulated_comm_s"), steps as f64 * comm),
        "{v_}"
    );
    // DeMo: per tensor, chunks of up to 64×64 (the vocabulary's 50257 rows in chunks of
    // 29), 32 coefficients each, a u8 index for chunks of at most 256 and u16 beyond.
    let mut matrices = vec![(v, d), (t, d)];
    for _ in 0..l {
        matrices.extend([(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]);
    }
    // Every vector has d elements: one row.
    matrices.extend((0..vectors / d).map(|_| (1, d)));
    let mut payload = 0u64;
    for (rows, cols) in matrices {
        let (cr, cc) = (
            chunk_size(rows as usize, 64) as u64,
            chunk_size(cols as usize, 64) as u64,
        );
        let chunk = cr * cc;
        let index = if chunk <= 256 { 1 } else { 2 };
        payload += rows * cols / chunk * 32.min(chunk) * (index + 4);
    }
    let demo = json(&[&common[..], &["--strategy", "demo"]].concat());
    let gather = CollectiveOp::AllGatherBytes;
    assert_eq!(
        f(&demo, "bytes_sent_per_node"),
        (steps * cost(gather, &world, 0, payload).0) as f64,
        "{demo}"
    );
    let time = network.collective_time(gather, &world, payload);
    assert!(
        close(f(&demo, "simulated_comm_s"), steps as f64 * time),
        "{demo}"
    );
    // By size alone: refused, naming the flag and the way out.
    for strategy in ["powersgd", "demo"] {
        let out = plan(&[
            "--params",
            "124M",
            "--strategy",
            strategy,
            "--steps",
            "3",
            "--step-seconds",
            "1",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{strategy}: {err}");
        assert!(
            err.contains("--params") && err.contains("shapes") && err.contains("--model"),
            "{strategy}: {err}"
        );
    }
    // A 6.7B GPT on 1,000 nodes: shapes from the sizes, nothing allocated.
    let big = json(&[
        "--model",
        "gpt:32,32,4096,2048,50257",
        "--num-nodes",
        "1000",
        "--strategy",
        "powersgd",
        "--steps",
        "5",
        "--step-seconds",
        "1",
    ]);
    assert_eq!(big["params"], 6_658_404_352u64, "{big}");
    if let Some(rss) = big["peak_rss_bytes"].as_f64() {
        assert!(rss < 256e6, "{big}");
    }
    // A bad spec names the flag.
    let out = plan(&["--model", "gpt:12,5,768,1024,50257", "--steps", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--model") && err.contains("n_head"), "{err}");
}
