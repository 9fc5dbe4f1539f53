//! Loggers: the built-in JSON-lines logger and one of one's own, given to
//! `Trainer::with_logger`, receive every step's, evaluation's and correlation's record, in
//! step order, as the run goes; a logger that fails ends the run with its error, and the
//! others still get every record.

use gym_core::metrics::{JsonLinesLogger, RunLogger};
use gym_core::{GymError, NodeData, SimulatedTime, TrainRecord, Trainer, TrainerConfig};
use gym_strategies::DiLoCoConfig;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tests::{Example, Synthetic, SyntheticBatcher, small_mlp};

/// A logger of one's own: keeps how many nodes each step reported, and fails at
/// `fail_at` (a full disk, a closed socket).
struct Steps {
    nodes_seen: Mutex<Vec<usize>>,
    fail_at: Option<usize>,
}

impl RunLogger for Steps {
    fn step(&self, record: &TrainRecord, nodes: &[SimulatedTime]) -> gym_core::Result<()> {
        self.nodes_seen.lock().unwrap().push(nodes.len());
        match self.fail_at {
            Some(step) if step == record.step => Err(GymError::Data(format!(
                "the log server went away at step {step}"
            ))),
            _ => Ok(()),
        }
    }
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gym-{name}-{}.jsonl", std::process::id()))
}

fn trainer() -> Trainer {
    Trainer::new(
        TrainerConfig::new(3)
            .with_max_steps(Some(9))
            .with_batch_size(8)
            .with_val_size(Some(32))
            .with_val_interval(3)
            .with_correlation_interval(Some(3)),
    )
}

fn data() -> NodeData<Example> {
    NodeData::shared(Synthetic::new(512, 16, 4, 1), Synthetic::new(64, 16, 4, 2))
}

/// `records` as the JSON-lines logger writes them: `{"kind": record}`, one per line.
fn expected<R: serde::Serialize>(kind: &str, records: &[R]) -> Vec<String> {
    records
        .iter()
        .map(|r| serde_json::json!({ kind: r }).to_string())
        .collect()
}

#[test]
fn the_json_lines_logger_and_ones_own_get_every_record_the_report_holds() {
    let path = temp("loggers");
    let own = Arc::new(Steps {
        nodes_seen: Mutex::new(Vec::new()),
        fail_at: None,
    });
    let out = trainer()
        .with_logger(Arc::new(JsonLinesLogger::create(&path).unwrap()))
        .with_logger(own.clone())
        .fit(small_mlp, &DiLoCoConfig::new(), &data(), &SyntheticBatcher)
        .unwrap();

    // The file's lines, against the report's records written the same way (JSON text, so
    // that every float is compared to the bit).
    let text = std::fs::read_to_string(&path).unwrap();
    let lines = |kind: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{{\"{kind}\"")))
            .map(String::from)
            .collect()
    };
    // Every step once, in order, as the report has it, and each with every node's time.
    let train = &out.report.train;
    assert_eq!(train.len(), 9);
    assert_eq!(lines("train"), expected("train", train));
    assert_eq!(*own.nodes_seen.lock().unwrap(), vec![3; 9]);
    // Every evaluation, the final one included.
    let validation = &out.report.validation;
    assert!(validation.len() >= 3, "{validation:?}");
    assert_eq!(lines("validation"), expected("validation", validation));
    // Every correlation measured.
    let correlation = &out.report.correlation;
    assert_eq!(correlation.len(), 3, "{correlation:?}");
    assert_eq!(lines("correlation"), expected("correlation", correlation));
    // In the order the run completed them: the evaluation before training, then every
    // 3 steps a measurement and an evaluation of the replicas after them.
    let order: Vec<&str> = text
        .lines()
        .map(|l| &l[2..l.find("\":").unwrap()])
        .collect();
    let round = ["train", "train", "train", "correlation", "validation"];
    let expected: Vec<&str> = std::iter::once("validation")
        .chain(round.iter().copied().cycle().take(15))
        .collect();
    assert_eq!(order, expected);
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_failing_logger_ends_the_run_with_its_error_and_the_others_get_every_record() {
    let path = temp("loggers-failing");
    let failing = Arc::new(Steps {
        nodes_seen: Mutex::new(Vec::new()),
        fail_at: Some(4),
    });
    let Err(err) = trainer()
        .with_logger(failing.clone())
        .with_logger(Arc::new(JsonLinesLogger::create(&path).unwrap()))
        .fit(small_mlp, &DiLoCoConfig::new(), &data(), &SyntheticBatcher)
    else {
        panic!("a run whose logger failed succeeded");
    };
    assert!(
        err.to_string()
            .contains("the log server went away at step 4"),
        "{err}"
    );
    // The failing logger was not dropped, and the logger after it missed nothing.
    assert_eq!(failing.nodes_seen.lock().unwrap().len(), 9);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("{\"train\"")).count(),
        9
    );
    std::fs::remove_file(&path).ok();
}
