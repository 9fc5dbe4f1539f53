//! The golden set: what users' runs produce, kept bit for bit across refactorings.
//!
//! Every strategy on MNIST (the MLP) and on the nanoGPT set-up, without and with a
//! simulated network (stragglers and jitter included), under a fault schedule (a node that
//! leaves and rejoins from a peer, a slow node, a crash), and resumed from a checkpoint; a
//! few codecs besides. Each run is the example binary as a user runs it. What is kept of a
//! run: every field of `summary.json` that does not measure this machine's speed, every
//! column of `train.csv` and `validation.csv` likewise (as a hash of its text), the
//! strategy's section of `config.json`, `faults.json`, and the keys of `run_config.toml`.
//! A later build must give every kept value again; it may add fields, columns and keys.
//!
//! Recorded once with `GOLDEN_RECORD=1 cargo test --release -p examples --test golden`
//! (the file `golden.json` beside this one); a change of results is a new recording, made
//! on purpose, with its reason in the commit.
//!
//! Bit for bit holds on the machine type the set was recorded on (named in the file as
//! `recorded_on`). Another CPU rounds differently in its matrix products (`gemm` picks its
//! kernels and blocking by the CPU's vectors and caches), so elsewhere the test passes over
//! the CSV columns that hold fractions (losses, accuracies, the learning rate, simulated
//! times), holds the summaries' numbers with a fraction to [`ELSEWHERE`] of the recorded
//! ones and everything else exactly; it says which of the two it did.

use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Fields and columns that measure the machine, not the run.
const WALL_CLOCK: &[&str] = &[
    "wall_time_s",
    "startup_s",
    "fit_time_s",
    "loop_its_per_s",
    "compute_ms_per_step",
    "strategy_ms_per_step",
    "peak_rss_bytes",
    "step_time_s",
    "its_per_s",
    "compute_s",
    "strategy_s",
    // Names the run folder, which the resumed run's differs in.
    "run_name",
];

/// The key of `golden.json` that names the machine type it was recorded on.
const RECORDED_ON: &str = "recorded_on";

/// The relative difference allowed in a summary's numbers on another machine type. On an
/// emulated AVX2 CPU (`qemu-x86_64 -cpu max`, against this set's AVX-512 recording) the
/// largest was 5.6·10⁻⁶ (a final loss after 8 steps); this leaves room for a validation
/// example or two changing class. `GOLDEN_BITS=1` compares bit for bit anyway, listing
/// every value that moved.
const ELSEWHERE: f64 = 1e-3;

/// What decides how this machine's kernels round: the widest vector extensions that `gemm`
/// chooses its matrix kernels by (AVX-512F, else AVX2 with FMA). Not the CPU's vendor or
/// model: the whole set, recorded on an AMD Zen 5 (family 0x1a, model 0x2), is the same to
/// the bit on an Intel Emerald Rapids (family 0x6, model 0xcf), both with AVX-512 but with
/// other caches.
fn platform() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let vectors = [
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
        ];
        let vectors: Vec<&str> = vectors
            .iter()
            .filter(|(_, has)| *has)
            .map(|(name, _)| *name)
            .collect();
        format!("x86_64: {}", vectors.join(" "))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// The strategies, each with flags that make it act within the runs' 8 steps.
const STRATEGIES: &[(&str, &[&str])] = &[
    ("allreduce", &[]),
    ("diloco", &["-H", "2"]),
    ("fedavg", &["-H", "2", "--island-size", "2"]),
    ("sparta", &["--p-sparta", "0.05"]),
    (
        "sparta-diloco",
        &[
            "--p-sparta",
            "0.05",
            "--sparta-sync-interval",
            "2",
            "-H",
            "4",
        ],
    ),
    ("demo", &["--lr", "1e-3"]),
    ("streaming-diloco", &["-H", "4", "--fragments", "2"]),
    ("sparseloco", &["-H", "2", "--topk", "16"]),
    ("muloco", &["-H", "2"]),
    ("desloc", &["-H", "2"]),
    ("noloco", &["-H", "2"]),
    ("async-diloco", &["-H", "2"]),
    ("powersgd", &["--powersgd-rank", "2"]),
];

/// Codecs on the strategies that average through one.
const CODECS: &[(&str, &[&str])] = &[
    (
        "allreduce-int8",
        &["--strategy", "allreduce", "--compression", "int8"],
    ),
    (
        "diloco-topk-ef",
        &[
            "--strategy",
            "diloco",
            "-H",
            "2",
            "--compression",
            "topk:64/1024,ef",
        ],
    ),
    (
        "fedavg-randomk",
        &[
            "--strategy",
            "fedavg",
            "-H",
            "2",
            "--compression",
            "randomk:0.1+int8",
        ],
    ),
    (
        "diloco-quorum",
        &[
            "--strategy",
            "diloco",
            "-H",
            "2",
            "--min-quorum",
            "3",
            "--grace",
            "0.01",
            "--network",
            "100mbit:20ms",
            "--node-speed",
            "1,0.8,1,0.6",
        ],
    ),
];

const NETWORK: &[&str] = &[
    "--network",
    "100mbit:20ms",
    "--node-speed",
    "1,0.8,1,0.6",
    "--jitter",
    "0.1",
];

const FAULTS: &[&str] = &["--faults", "slow:2@1+3x0.5;leave:1@3+2;crash:3@6"];

fn mnist_flags() -> Vec<String> {
    let data = tests::shared_data("mnist");
    [
        "--model",
        "mlp",
        "--num-nodes",
        "4",
        "--max-steps",
        "8",
        "--batch-size",
        "16",
        "--val-size",
        "64",
        "--val-interval",
        "4",
        "--seed",
        "7",
        "--no-progress",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--data-dir".to_string(), data.display().to_string()])
    .collect()
}

fn gpt_flags() -> Vec<String> {
    let data = tests::shared_data("shakespeare");
    [
        "--num-nodes",
        "4",
        "--max-steps",
        "8",
        "--batch-size",
        "8",
        "--block-size",
        "16",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--val-size",
        "32",
        "--val-interval",
        "4",
        "--seed",
        "7",
        "--no-progress",
        "--num-tokens",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--data-dir".to_string(), data.display().to_string()])
    .collect()
}

/// One run of the set: a binary and its flags, and whether it resumes a first run.
struct Case {
    name: String,
    binary: &'static str,
    flags: Vec<String>,
    /// Runs first with checkpoints every 4 steps, then again from the step-4 checkpoint;
    /// the second run is the one kept.
    resumed: bool,
}

fn cases() -> Vec<Case> {
    let strings = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut cases = Vec::new();
    for &(strategy, own) in STRATEGIES {
        let with = |base: Vec<String>, extra: &[&str]| {
            let mut flags = base;
            flags.extend(strings(&["--strategy", strategy]));
            flags.extend(strings(own));
            flags.extend(strings(extra));
            flags
        };
        let variants: [(&str, &'static str, Vec<String>, bool); 6] = [
            ("mnist", "mnist", with(mnist_flags(), &[]), false),
            ("mnist-net", "mnist", with(mnist_flags(), NETWORK), false),
            (
                "mnist-faults",
                "mnist",
                with(mnist_flags(), &[NETWORK, FAULTS].concat()),
                false,
            ),
            ("mnist-resumed", "mnist", with(mnist_flags(), NETWORK), true),
            ("gpt", "nanogpt", with(gpt_flags(), &[]), false),
            ("gpt-net", "nanogpt", with(gpt_flags(), NETWORK), false),
        ];
        for (variant, binary, flags, resumed) in variants {
            cases.push(Case {
                name: format!("{variant}/{strategy}"),
                binary,
                flags,
                resumed,
            });
        }
    }
    for &(name, flags) in CODECS {
        let mut all = mnist_flags();
        all.extend(strings(flags));
        cases.push(Case {
            name: format!("mnist-codec/{name}"),
            binary: "mnist",
            flags: all,
            resumed: false,
        });
    }
    cases
}

fn binary(name: &str) -> &'static str {
    match name {
        "mnist" => env!("CARGO_BIN_EXE_mnist"),
        "nanogpt" => env!("CARGO_BIN_EXE_nanogpt"),
        other => panic!("no binary {other}"),
    }
}

/// Runs `case` in `dir` and returns what the golden set keeps of it.
fn run(case: &Case, dir: &Path) -> Result<Value, String> {
    let go = |run_name: &str, extra: &[String]| -> Result<PathBuf, String> {
        let out = Command::new(binary(case.binary))
            .args(&case.flags)
            .args([
                "--log-dir",
                &dir.display().to_string(),
                "--run-name",
                run_name,
            ])
            .args(extra)
            .output()
            .map_err(|e| format!("{}: cannot start: {e}", case.name))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}): {}",
                case.name,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(dir.join(run_name))
    };
    let folder = if case.resumed {
        let first = go("first", &["--checkpoint-interval".into(), "4".into()])?;
        let checkpoint = first.join("checkpoint-000000004.safetensors");
        go(
            "run",
            &["--resume".into(), checkpoint.display().to_string()],
        )?
    } else {
        go("run", &[])?
    };
    kept(&folder)
}

/// What the golden set keeps of the run in `folder`.
fn kept(folder: &Path) -> Result<Value, String> {
    let read = |name: &str| {
        std::fs::read_to_string(folder.join(name))
            .map_err(|e| format!("{}: {e}", folder.join(name).display()))
    };
    let json = |name: &str| -> Result<Value, String> {
        serde_json::from_str(&read(name)?).map_err(|e| format!("{name}: {e}"))
    };
    let mut summary = json("summary.json")?;
    if let Some(fields) = summary.as_object_mut() {
        for wall in WALL_CLOCK {
            fields.remove(*wall);
        }
    }
    let config = json("config.json")?;
    let mut out = Map::new();
    out.insert("summary".into(), summary);
    out.insert("strategy".into(), config["strategy"].clone());
    for csv in ["train.csv", "validation.csv"] {
        out.insert(csv.into(), columns(&read(csv)?));
    }
    if folder.join("faults.json").exists() {
        out.insert("faults.json".into(), json("faults.json")?);
    }
    let run_config: toml::Table = read("run_config.toml")?
        .parse()
        .map_err(|e| format!("run_config.toml: {e}"))?;
    out.insert(
        "run_config_keys".into(),
        Value::Array(
            run_config
                .keys()
                .map(|k| Value::String(k.clone()))
                .collect(),
        ),
    );
    Ok(Value::Object(out))
}

/// Each column of a CSV file but the wall-clock ones, as a hash of its cells' text, and
/// under `FRACTIONS` the names of those that hold a number with a fraction (the losses, the
/// learning rate): the columns that another machine type may round differently.
fn columns(text: &str) -> Value {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let mut hashes: Vec<u64> = vec![FNV_OFFSET; header.len()];
    let mut fractions = vec![false; header.len()];
    let mut rows = 0u64;
    for line in lines {
        rows += 1;
        for (i, cell) in line.split(',').enumerate().take(header.len()) {
            hashes[i] = fnv(hashes[i], cell.as_bytes());
            hashes[i] = fnv(hashes[i], b"\n");
            fractions[i] |= cell.parse::<f64>().is_ok_and(|x| x.fract() != 0.0);
        }
    }
    let mut map = Map::new();
    map.insert("rows".into(), rows.into());
    let mut with_fractions = Vec::new();
    for ((name, hash), fraction) in header.iter().zip(hashes).zip(fractions) {
        if !WALL_CLOCK.contains(name) {
            map.insert((*name).into(), format!("{hash:016x}").into());
            if fraction {
                with_fractions.push(Value::from(*name));
            }
        }
    }
    map.insert(FRACTIONS.into(), Value::Array(with_fractions));
    Value::Object(map)
}

/// The key of a CSV's kept columns that lists those holding fractions.
const FRACTIONS: &str = "columns_with_fractions";

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// How `got` is held to `want`.
#[derive(Clone, Copy, PartialEq)]
enum Match {
    /// The machine type of the recording: every value, bit for bit.
    Bits,
    /// Another machine type: the columns with fractions are not compared (the summary
    /// holds their final values), and numbers with a fraction within [`ELSEWHERE`].
    Rounding,
}

/// Where `got` lacks or changes something of `want` (new fields in `got` are fine), as
/// `path: want -> got` lines.
fn differences(path: &str, want: &Value, got: &Value, held: Match, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let rounded = |key: &String| {
                held == Match::Rounding
                    && g.get(FRACTIONS)
                        .and_then(Value::as_array)
                        .is_some_and(|names| names.iter().any(|n| n == key.as_str()))
            };
            for (key, w) in w {
                let here = format!("{path}.{key}");
                match g.get(key) {
                    Some(_) if rounded(key) => {}
                    Some(g) => differences(&here, w, g, held, out),
                    None => out.push(format!("{here}: missing")),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if path.ends_with("run_config_keys") => {
            for key in w {
                if !g.contains(key) {
                    out.push(format!("{path}: no key {key}"));
                }
            }
        }
        // Integers fall through to the exact comparison below.
        (Value::Number(w), Value::Number(g))
            if held == Match::Rounding && w.is_f64() && g.is_f64() =>
        {
            let (w, g) = (
                w.as_f64().unwrap_or(f64::NAN),
                g.as_f64().unwrap_or(f64::NAN),
            );
            let within = (w - g).abs() <= ELSEWHERE * w.abs().max(g.abs());
            if !within {
                out.push(format!("{path}: {w} -> {g} (beyond {ELSEWHERE:e})"));
            }
        }
        (w, g) if w != g => out.push(format!("{path}: {w} -> {g}")),
        _ => {}
    }
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden.json")
}

#[test]
fn every_result_of_the_golden_set_is_unchanged() {
    let root = std::env::temp_dir().join(format!("gym-golden-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let cases = cases();
    // Two runs at a time: the machines here have two cores, and each run's nodes take
    // turns on them anyway.
    let results: BTreeMap<String, Result<Value, String>> = std::thread::scope(|s| {
        let chunks: Vec<&[Case]> = cases.chunks(cases.len().div_ceil(2)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let root = &root;
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|case| {
                            let dir = root.join(case.name.replace('/', "-"));
                            (case.name.clone(), run(case, &dir))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a runner thread"))
            .collect()
    });
    let mut failures: Vec<String> = results
        .values()
        .filter_map(|r| r.as_ref().err().cloned())
        .collect();
    assert!(failures.is_empty(), "runs failed:\n{}", failures.join("\n"));
    let got: Map<String, Value> = results
        .into_iter()
        .map(|(name, r)| (name, r.expect("checked")))
        .collect();
    std::fs::remove_dir_all(&root).ok();

    let here = platform();
    if std::env::var_os("GOLDEN_RECORD").is_some() {
        let mut got = got;
        got.insert(RECORDED_ON.into(), here.into());
        let text = serde_json::to_string_pretty(&Value::Object(got)).expect("serialises");
        std::fs::write(golden_path(), text + "\n").expect("golden.json is written");
        return;
    }
    let mut want: Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(golden_path()).expect("golden.json is readable"),
    )
    .expect("golden.json is JSON");
    let recorded_on = want.remove(RECORDED_ON);
    let held = if recorded_on.as_ref().and_then(Value::as_str) == Some(here.as_str()) {
        eprintln!("golden set: recorded on this machine type ({here}), compared bit for bit");
        Match::Bits
    } else if std::env::var_os("GOLDEN_BITS").is_some() {
        // Lists every value another machine type rounds differently.
        eprintln!("golden set: GOLDEN_BITS set, compared bit for bit on {here}");
        Match::Bits
    } else {
        eprintln!(
            "golden set: recorded on {}, this is {here}: the CSV columns with fractions \
             are not compared, the summaries' fractions within {ELSEWHERE:e}",
            recorded_on.unwrap_or(Value::Null)
        );
        Match::Rounding
    };
    for (name, want) in &want {
        match got.get(name) {
            Some(got) => differences(name, want, got, held, &mut failures),
            None => failures.push(format!("{name}: no longer run")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences from the golden set:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The comparison itself, on made-up values: bit for bit on the recording's machine type;
/// elsewhere the columns with fractions are passed over and a summary's fraction may move
/// by less than [`ELSEWHERE`], but never an integer, a string or a column without fractions.
#[test]
fn another_machine_type_is_held_to_everything_but_the_rounding() {
    let run = |loss: f64, steps: u64, loss_hash: &str, step_hash: &str| {
        serde_json::json!({
            "summary": { "final_train_loss": loss, "steps": steps, "strategy": "diloco" },
            "train.csv": { "rows": steps, "train_loss": loss_hash, "step": step_hash,
                           FRACTIONS: ["train_loss"] },
        })
    };
    let want = run(2.0, 8, "aaaa", "1111");
    let count = |got: &Value, held| {
        let mut out = Vec::new();
        differences("run", &want, got, held, &mut out);
        out.len()
    };
    let rounded = run(2.0 * (1.0 + ELSEWHERE / 2.0), 8, "bbbb", "1111");
    assert_eq!(count(&want, Match::Bits), 0);
    assert_eq!(count(&rounded, Match::Bits), 2, "the loss and its column");
    assert_eq!(count(&rounded, Match::Rounding), 0);
    let moved = run(2.0 * (1.0 + 2.0 * ELSEWHERE), 8, "aaaa", "1111");
    assert_eq!(
        count(&moved, Match::Rounding),
        1,
        "a loss beyond the rounding"
    );
    let steps = run(2.0, 9, "aaaa", "1111");
    assert_eq!(
        count(&steps, Match::Rounding),
        2,
        "an integer, in the summary and rows"
    );
    let column = run(2.0, 8, "aaaa", "2222");
    assert_eq!(
        count(&column, Match::Rounding),
        1,
        "a column without fractions"
    );
    let mut renamed = want.clone();
    renamed["summary"]["strategy"] = "fedavg".into();
    assert_eq!(count(&renamed, Match::Rounding), 1, "a string");
}
