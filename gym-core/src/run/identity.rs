//! A run's identity ([`Identity`]): what a checkpoint must agree on with the run that
//! resumes it, and the check that names the first difference.

use crate::error::{GymError, Result};
use serde::{Deserialize, Serialize};

/// What a checkpoint must agree on with the run that resumes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// The strategy's name.
    pub strategy: String,
    /// The strategy's settings, as `config.json` holds them.
    pub strategy_config: String,
    /// The model's type.
    pub model: String,
    /// Path and shape of every trainable parameter.
    pub parameters: Vec<(String, Vec<usize>)>,
    /// The trainer settings that shape the run (seed, nodes, batch, steps, simulation…).
    pub trainer: String,
}

impl Identity {
    /// Refuses a checkpoint whose identity differs from this run's, naming the difference.
    pub fn check(&self, saved: &Identity) -> Result<()> {
        let refuse = |what: String| {
            Err(GymError::Checkpoint(format!(
                "it is from another run configuration: {what}"
            )))
        };
        if saved.strategy != self.strategy {
            return refuse(format!(
                "strategy `{}` where this run is `{}`",
                saved.strategy, self.strategy
            ));
        }
        if saved.model != self.model {
            return refuse(format!(
                "model `{}` where this run is `{}`",
                saved.model, self.model
            ));
        }
        if saved.parameters != self.parameters {
            let first = saved
                .parameters
                .iter()
                .zip(&self.parameters)
                .find(|(a, b)| a != b);
            return refuse(match first {
                Some((a, b)) => format!(
                    "parameter `{}` {:?} where this run has `{}` {:?}",
                    a.0, a.1, b.0, b.1
                ),
                None => format!(
                    "{} trainable parameters where this run has {}",
                    saved.parameters.len(),
                    self.parameters.len()
                ),
            });
        }
        // Every differing setting, of the strategy and of the trainer, in one message.
        let differences: Vec<String> = [
            ("strategy", &saved.strategy_config, &self.strategy_config),
            ("trainer", &saved.trainer, &self.trainer),
        ]
        .into_iter()
        .filter(|(_, saved, here)| !same_settings(saved, here))
        .map(|(what, saved, here)| format!("{what} settings {}", differing(saved, here)))
        .collect();
        if !differences.is_empty() {
            return refuse(format!(
                "the checkpoint was written with {}",
                differences.join("; ")
            ));
        }
        Ok(())
    }
}

/// Whether two settings (JSON) agree, a field that one lacks and the other holds as `null`
/// counting as the same: a setting added later with no value keeps older checkpoints usable.
fn same_settings(a: &str, b: &str) -> bool {
    fn without_nulls(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(fields) => fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
            serde_json::Value::Array(items) => items.into_iter().map(without_nulls).collect(),
            other => other,
        }
    }
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).map(without_nulls);
    match (parse(a), parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Every field where settings `saved` and `here` (JSON) differ, by dotted path, as
/// "`sync_interval` = 20, this run has 50"; a field one lacks is `absent`.
fn differing(saved: &str, here: &str) -> String {
    use serde_json::Value;
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let (u, v) = (
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                    );
                    let at = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&at, u, v, out);
                }
            }
            _ if a != b => {
                let show = |v: &Value| {
                    if v.is_null() {
                        "absent".to_string()
                    } else {
                        v.to_string()
                    }
                };
                out.push(format!("`{path}` = {}, this run has {}", show(a), show(b)));
            }
            _ => {}
        }
    }
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::String(s.into()));
    let mut out = Vec::new();
    walk("", &parse(saved), &parse(here), &mut out);
    out.join("; ")
}
