//! A logger of one's own: a `RunMonitor` given to `Trainer::with_monitor` receives every
//! step's, evaluation's and correlation's record, in step order, as the run goes. This one writes
//! them as JSON lines to a file of its own; read back, they are the run's report.

use gym_core::metrics::RunMonitor;
use gym_core::{CorrelationRecord, NodeData, SimulatedTime, TrainRecord, Trainer};
use gym_core::{TrainerConfig, ValRecord};
use gym_strategies::DiLoCoConfig;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tests::{Synthetic, SyntheticBatcher, small_mlp};

/// Writes each record as one JSON line: `{"train": …}`, `{"validation": …}` or
/// `{"correlation": …}`.
struct JsonLines {
    file: Mutex<std::fs::File>,
    nodes_seen: Mutex<Vec<usize>>,
}

impl RunMonitor for JsonLines {
    fn step(&self, record: &TrainRecord, nodes: &[SimulatedTime]) {
        let line = serde_json::json!({ "train": record });
        writeln!(self.file.lock().unwrap(), "{line}").unwrap();
        self.nodes_seen.lock().unwrap().push(nodes.len());
    }

    fn validation(&self, record: &ValRecord) {
        let line = serde_json::json!({ "validation": record });
        writeln!(self.file.lock().unwrap(), "{line}").unwrap();
    }

    fn correlation(&self, record: &CorrelationRecord) {
        let line = serde_json::json!({ "correlation": record });
        writeln!(self.file.lock().unwrap(), "{line}").unwrap();
    }
}

#[test]
fn a_monitor_of_ones_own_logs_every_record_the_report_holds() {
    let path = std::env::temp_dir().join(format!("gym-monitor-{}.jsonl", std::process::id()));
    let logger = Arc::new(JsonLines {
        file: Mutex::new(std::fs::File::create(&path).unwrap()),
        nodes_seen: Mutex::new(Vec::new()),
    });
    let data = NodeData::shared(Synthetic::new(512, 16, 4, 1), Synthetic::new(64, 16, 4, 2));
    let config = TrainerConfig::new(3)
        .with_max_steps(Some(9))
        .with_batch_size(8)
        .with_val_size(Some(32))
        .with_val_interval(3)
        .with_correlation_interval(Some(3));
    let out = Trainer::new(config)
        .with_monitor(logger.clone())
        .fit(small_mlp, &DiLoCoConfig::new(), &data, &SyntheticBatcher)
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
    fn expected<R: serde::Serialize>(kind: &str, records: &[R]) -> Vec<String> {
        records
            .iter()
            .map(|r| serde_json::json!({ kind: r }).to_string())
            .collect()
    }
    // Every step once, in order, as the report has it (and each with every node's time).
    let train = &out.report.train;
    assert_eq!(lines("train"), expected("train", train));
    assert_eq!(out.report.train.len(), 9);
    assert_eq!(*logger.nodes_seen.lock().unwrap(), vec![3; 9]);
    // Every evaluation, the final one included.
    let validation = &out.report.validation;
    assert!(validation.len() >= 3, "{validation:?}");
    assert_eq!(lines("validation"), expected("validation", validation));
    // Every correlation measured.
    let correlation = &out.report.correlation;
    assert_eq!(correlation.len(), 3, "{correlation:?}");
    assert_eq!(lines("correlation"), expected("correlation", correlation));
    std::fs::remove_file(&path).ok();
}
