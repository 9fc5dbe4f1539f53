//! `nanogpt --dataset wikitext-2` as a user runs it, with a GPT-2-style tokenizer trained on
//! WikiText-2 (GPT-2's own is not in the shared data): the first validation loss is that of
//! a uniform guess over the vocabulary, training lowers it, the run folder keeps the
//! tokenizer and its loss plot (against the examples seen), and `--sample-from` decodes
//! through it. Character-only flags and missing data are refused.

use gym_data::Gpt2Tokenizer;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-gpt2-cli-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The first `bytes` of a WikiText-2 file, cut at a line's end.
fn head(split: &str, bytes: usize) -> String {
    let path = tests::shared_data("text/wikitext-2").join(format!("{split}.txt"));
    let text = std::fs::read_to_string(path).unwrap();
    let end = text[..bytes].rfind('\n').unwrap() + 1;
    text[..end].to_string()
}

fn nanogpt(args: &[&str], paths: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nanogpt"));
    command.args(args);
    for (flag, path) in paths {
        command.arg(flag).arg(path);
    }
    command.output().expect("nanogpt runs")
}

#[test]
fn nanogpt_trains_on_wikitext_in_bpe() {
    let dir = scratch("wikitext");
    let data = dir.join("wikitext-2");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("train.txt"), head("valid", 300_000)).unwrap();
    std::fs::write(data.join("valid.txt"), head("test", 40_000)).unwrap();
    let tokenizer = Gpt2Tokenizer::train(&[data.join("train.txt")], 1000).unwrap();
    let vocab = tokenizer.vocab_size();
    let tokenizer_file = dir.join("tokenizer.json");
    tokenizer.save(&tokenizer_file).unwrap();
    let logs = dir.join("logs");
    let flags = [
        "--dataset",
        "wikitext",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "32",
        "--block-size",
        "32",
        "--batch-size",
        "8",
        "--num-nodes",
        "2",
        "--max-steps",
        "40",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "5",
        "--val-size",
        "64",
        "--val-interval",
        "40",
        "--num-tokens",
        "20",
        "--no-progress",
        "--run-name",
        "run",
        "--x-axis",
        "examples",
    ];
    let out = nanogpt(
        &flags,
        &[
            ("--tokenizer", &tokenizer_file),
            ("--data-dir", &data),
            ("--log-dir", &logs),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("vocabulary {vocab}")), "{stderr}");
    let run = logs.join("run");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["dataset"], "wikitext-2 (GPT-2 BPE)");
    // Step 0's loss is a uniform guess's, ln(vocabulary); 40 steps lower it well below.
    let validation = std::fs::read_to_string(run.join("validation.csv")).unwrap();
    let first: f64 = validation
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .nth(4)
        .unwrap()
        .parse()
        .unwrap();
    let uniform = (vocab as f64).ln();
    assert!(
        (first - uniform).abs() < 0.3,
        "{first} vs ln {vocab} = {uniform}"
    );
    let last = summary["final_val_loss"].as_f64().unwrap();
    assert!(last < uniform - 1.0, "{last}");
    // Its loss plot runs against the examples seen.
    let plot = std::fs::read_to_string(run.join("loss.svg")).unwrap();
    assert!(plot.contains("examples seen (all nodes)") && plot.contains("validation loss"));
    // The run keeps its tokenizer, and sampling from the run decodes through it.
    assert!(run.join("tokenizer.json").is_file());
    let out = nanogpt(
        &["--prompt", "The", "--num-tokens", "10"],
        &[("--sample-from", &run)],
    );
    tests::assert_succeeded(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("── sample ──\nThe"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn character_flags_and_missing_data_are_refused() {
    let dir = scratch("refused");
    // A missing tokenizer names itself.
    let out = nanogpt(
        &["--dataset", "owt"],
        &[("--data-dir", &dir), ("--tokenizer", &dir.join("t.json"))],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("t.json"));
    // With this binary's defaults, OpenWebText says what the original trains instead.
    assert!(
        stderr.contains("the original trains GPT-2 base (124M) for 30,000"),
        "{stderr}"
    );
    let out = nanogpt(
        &[
            "--dataset",
            "owt",
            "--model-size",
            "base",
            "--max-steps",
            "30000",
        ],
        &[("--data-dir", &dir), ("--tokenizer", &dir.join("t.json"))],
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note: OpenWebText"));
    let tokenizer = Gpt2Tokenizer::train(
        &[tests::shared_data("text/wikitext-2").join("test.txt")],
        300,
    )
    .unwrap();
    let file = dir.join("tokenizer.json");
    tokenizer.save(&file).unwrap();
    let out = nanogpt(
        &["--dataset", "owt"],
        &[("--data-dir", &dir), ("--tokenizer", &file)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("train.bin") && stderr.contains("prepare.py"),
        "{stderr}"
    );
    let out = nanogpt(
        &["--dataset", "wikitext-2"],
        &[("--text-file", &file), ("--tokenizer", &file)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--text-file is character text"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}
