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
        if !same_settings(&saved.strategy_config, &self.strategy_config) {
            return refuse(format!(
                "strategy settings {} where this run has {}",
                differing(&saved.strategy_config, &self.strategy_config),
                differing(&self.strategy_config, &saved.strategy_config)
            ));
        }
        if !same_settings(&saved.trainer, &self.trainer) {
            return refuse(format!(
                "trainer settings {} where this run has {}",
                differing(&saved.trainer, &self.trainer),
                differing(&self.trainer, &saved.trainer)
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

/// The fields of JSON object `a` that differ from `b`'s, as `key = value` pairs.
fn differing(a: &str, b: &str) -> String {
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap_or_default();
    let (a, b) = (parse(a), parse(b));
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => a
            .iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, v)| format!("`{k}` = {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => a.to_string(),
    }
}
