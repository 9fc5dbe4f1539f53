//! Every preset in `examples/configs/` loads and trains a few steps with the command it names
//! in its header, and its keys reach the run: a flag renamed or removed breaks a preset here,
//! not silently in a user's hands. Each run is shrunk on the command line (steps, sizes),
//! which overrides the file; every other key of the file is checked against the run's
//! resolved configuration.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The keys the test overrides to keep the runs tiny, with their command-line flags.
const SHRINK: &[(&str, &str)] = &[
    ("max_steps", "2"),
    ("val_size", "8"),
    ("val_interval", "1"),
    ("warmup_steps", "1"),
    ("block_size", "16"),
];

fn presets() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the presets are in {}", dir.display());
    files
}

/// The binary a preset's header runs it with (`--bin NAME`).
fn binary_of(text: &str) -> &str {
    let at = text
        .find("--bin ")
        .expect("a preset's header names its binary");
    text[at + 6..].split_whitespace().next().unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-preset-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The flags that shrink a run of the keys the preset sets, plus `extra`.
fn shrink(table: &toml::Table, extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = SHRINK
        .iter()
        .filter(|(key, _)| table.contains_key(*key))
        .flat_map(|(key, value)| [format!("--{}", key.replace('_', "-")), value.to_string()])
        .collect();
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

/// Every top-level key of the preset that the test did not override, as the run resolved
/// it (`resolved`, its configuration as JSON): the same value.
fn keys_reach_the_run(
    name: &str,
    table: &toml::Table,
    resolved: &serde_json::Value,
    skip: &[&str],
) {
    let mut checked = 0;
    for (key, value) in table {
        if value.is_table() || SHRINK.iter().any(|(k, _)| k == key) || skip.contains(&key.as_str())
        {
            continue;
        }
        let want = serde_json::to_value(value).unwrap();
        let got = &resolved[key];
        let same = match (&want, got) {
            // Some flags are f32 (weight decay): their precision.
            (serde_json::Value::Number(a), serde_json::Value::Number(b)) => {
                let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
                (a - b).abs() <= 1e-6 * a.abs()
            }
            _ => &want == got,
        };
        assert!(
            same,
            "{name}: `{key}` is {want} in the preset, {got} in the run"
        );
        checked += 1;
    }
    assert!(checked >= 3, "{name}: only {checked} keys checked");
}

fn argv(words: impl IntoIterator<Item = String>) -> Vec<OsString> {
    words.into_iter().map(OsString::from).collect()
}

#[test]
fn every_preset_loads_and_trains_a_few_steps_with_its_keys() {
    for file in presets() {
        let name = file.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let out = scratch(&name);
        let config = file.to_string_lossy().to_string();
        match binary_of(&text) {
            "sweep" => {
                let data = tests::shared_data("shakespeare");
                let mut words = vec!["sweep".into(), "--config".into(), config];
                words.extend(shrink(&table, &["--no-progress"]));
                words.extend(["--data-dir".into(), data.to_string_lossy().into()]);
                words.extend(["--out-dir".into(), out.to_string_lossy().into()]);
                let sweep = examples::sweep::run(&argv(words)).unwrap();
                // DiLoCo on every node count, AllReduce on one node (its override).
                let nodes = table["nodes"].as_array().unwrap().len();
                assert_eq!(sweep.cells.len(), nodes + 1, "{name}");
                for cell in &sweep.cells {
                    assert_eq!(cell.report.train.last().unwrap().step, 1, "{name}");
                }
                let diloco = sweep
                    .cells
                    .iter()
                    .find(|c| c.sync_interval.is_some())
                    .unwrap();
                assert_eq!(
                    diloco.sync_interval,
                    table["sync_interval"].as_integer().map(|h| h as usize),
                    "{name}"
                );
            }
            "compare" => {
                let data = tests::shared_data("mnist");
                let mut words = vec!["compare".into(), "--config".into(), config];
                // The CNN at batch 256 is slow on 2 cores: a batch of 16.
                words.extend(shrink(&table, &["--no-progress", "--batch-size", "16"]));
                words.extend(["--data-dir".into(), data.to_string_lossy().into()]);
                words.extend(["--out-dir".into(), out.to_string_lossy().into()]);
                let comparison = examples::compare::run(&argv(words)).unwrap();
                let strategies = table["strategies"].as_array().unwrap();
                assert_eq!(comparison.outcomes.len(), strategies.len(), "{name}");
                for outcome in &comparison.outcomes {
                    assert_eq!(outcome.report.train.last().unwrap().step, 1, "{name}");
                    let resolved = serde_json::to_value(&outcome.args).unwrap();
                    // A strategy's own override (DeMo's lr) has the last word.
                    keys_reach_the_run(&name, &table, &resolved, &["batch_size", "lr"]);
                }
            }
            "nanogpt" => {
                // OpenWebText as nanoGPT's prepare.py writes it (u16 token ids), small, with
                // a small BPE tokenizer in place of GPT-2's (which is downloaded).
                let data = out.join("owt");
                std::fs::create_dir_all(&data).unwrap();
                let text = tests::shared_data("shakespeare").join("input.txt");
                let head = std::fs::read_to_string(text).unwrap()[..50_000].to_string();
                std::fs::write(out.join("text.txt"), head).unwrap();
                let tokenizer =
                    gym_data::Gpt2Tokenizer::train(&[out.join("text.txt")], 500).unwrap();
                let vocab = tokenizer.vocab_size() as u32;
                tokenizer.save(&out.join("tokenizer.json")).unwrap();
                let tokens: Vec<u8> = (0..200_000u32)
                    .flat_map(|i| ((i * 7919 % vocab) as u16).to_le_bytes())
                    .collect();
                std::fs::write(data.join("train.bin"), &tokens).unwrap();
                std::fs::write(data.join("val.bin"), &tokens[..20_000]).unwrap();
                let logs = out.join("logs");
                let mut words = vec!["--config".to_string(), config];
                // The GPT-2 base model is 124M parameters: two layers of 32 for the test.
                words.extend(shrink(
                    &table,
                    &[
                        "--no-progress",
                        "--n-layer",
                        "2",
                        "--n-head",
                        "2",
                        "--n-embd",
                        "32",
                        "--batch-size",
                        "2",
                        "--run-name",
                        "preset",
                    ],
                ));
                let run = Command::new(env!("CARGO_BIN_EXE_nanogpt"))
                    .args(&words)
                    .arg("--data-dir")
                    .arg(&data)
                    .arg("--log-dir")
                    .arg(&logs)
                    .arg("--tokenizer")
                    .arg(out.join("tokenizer.json"))
                    .output()
                    .unwrap();
                assert!(
                    run.status.success(),
                    "{name}: {}",
                    String::from_utf8_lossy(&run.stderr)
                );
                let saved = std::fs::read_to_string(logs.join("preset/run_config.toml"))
                    .expect("the run saves its configuration");
                let resolved: toml::Table = saved.parse().unwrap();
                let resolved = serde_json::to_value(resolved).unwrap();
                keys_reach_the_run(&name, &table, &resolved, &["batch_size"]);
            }
            other => panic!("{name}: no case for `--bin {other}`; add one to this test"),
        }
        std::fs::remove_dir_all(&out).ok();
    }
}
