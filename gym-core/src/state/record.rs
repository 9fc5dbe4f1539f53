//! The state a strategy keeps between steps, as named values: what a checkpoint saves and
//! a resumed run loads back ([`Strategy::save_state`](crate::Strategy::save_state)).
//! Strategies declare their state as typed records ([`fields`](super::fields)), which are
//! written into this container.

use crate::error::{GymError, Result};
use burn::tensor::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Named state: flat f32 tensors, byte buffers (Burn's optimizer records) and numbers.
/// Keys are paths; [`child`](Self::child) and [`insert_child`](Self::insert_child) nest a
/// component's state under a prefix (`module0/outer/master`).
///
/// A missing key or a tensor of the wrong length is a [`GymError::Checkpoint`] naming it, so
/// a checkpoint from another configuration is refused rather than half-loaded.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StateDict {
    tensors: BTreeMap<String, Vec<f32>>,
    bytes: BTreeMap<String, serde_bytes::ByteBuf>,
    numbers: BTreeMap<String, u64>,
    /// Where a [`child`](Self::child) sits in its parent, for error messages.
    #[serde(skip)]
    prefix: String,
}

/// Equal contents (wherever the states sit).
impl PartialEq for StateDict {
    fn eq(&self, other: &Self) -> bool {
        self.tensors == other.tensors && self.bytes == other.bytes && self.numbers == other.numbers
    }
}

impl StateDict {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty() && self.bytes.is_empty() && self.numbers.is_empty()
    }

    /// Stores host values.
    pub fn put_values(&mut self, key: &str, values: Vec<f32>) {
        self.tensors.insert(key.to_string(), values);
    }

    /// The host values stored under `key`.
    pub fn values(&self, key: &str) -> Result<&[f32]> {
        self.tensors
            .get(key)
            .map(Vec::as_slice)
            .ok_or_else(|| self.missing(key))
    }

    /// Stores a byte buffer.
    pub fn put_bytes(&mut self, key: &str, bytes: Vec<u8>) {
        self.bytes
            .insert(key.to_string(), serde_bytes::ByteBuf::from(bytes));
    }

    /// The byte buffer stored under `key`.
    pub fn bytes(&self, key: &str) -> Result<&[u8]> {
        self.bytes
            .get(key)
            .map(|b| b.as_slice())
            .ok_or_else(|| self.missing(key))
    }

    /// Stores a counter.
    pub fn put_u64(&mut self, key: &str, value: u64) {
        self.numbers.insert(key.to_string(), value);
    }

    /// The counter stored under `key`.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.numbers
            .get(key)
            .copied()
            .ok_or_else(|| self.missing(key))
    }

    /// Stores a float exactly (its bits).
    pub fn put_f64(&mut self, key: &str, value: f64) {
        self.put_u64(key, value.to_bits());
    }

    /// The float stored under `key`.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.u64(key).map(f64::from_bits)
    }

    /// Nests `child` under `prefix`.
    pub fn insert_child(&mut self, prefix: &str, child: StateDict) {
        let key = |k: String| format!("{prefix}/{k}");
        self.tensors
            .extend(child.tensors.into_iter().map(|(k, v)| (key(k), v)));
        self.bytes
            .extend(child.bytes.into_iter().map(|(k, v)| (key(k), v)));
        self.numbers
            .extend(child.numbers.into_iter().map(|(k, v)| (key(k), v)));
    }

    /// The state nested under `prefix` (empty if there is none).
    pub fn child(&self, prefix: &str) -> StateDict {
        let start = format!("{prefix}/");
        fn under<V: Clone>(map: &BTreeMap<String, V>, start: &str) -> BTreeMap<String, V> {
            map.iter()
                .filter_map(|(k, v)| k.strip_prefix(start).map(|k| (k.to_string(), v.clone())))
                .collect()
        }
        StateDict {
            tensors: under(&self.tensors, &start),
            bytes: under(&self.bytes, &start),
            numbers: under(&self.numbers, &start),
            prefix: format!("{}{start}", self.prefix),
        }
    }
}

impl StateDict {
    /// The values, byte buffers and counters, by key: what a checkpoint file writes.
    pub(crate) fn parts(&self) -> StateParts<'_> {
        (&self.tensors, &self.bytes, &self.numbers)
    }

    /// A state from what [`parts`](Self::parts) gave.
    pub(crate) fn from_parts(
        tensors: BTreeMap<String, Vec<f32>>,
        bytes: BTreeMap<String, Vec<u8>>,
        numbers: BTreeMap<String, u64>,
    ) -> Self {
        StateDict {
            tensors,
            bytes: bytes
                .into_iter()
                .map(|(k, v)| (k, serde_bytes::ByteBuf::from(v)))
                .collect(),
            numbers,
            prefix: String::new(),
        }
    }

    /// Whether anything is stored under `prefix/`.
    pub fn has_child(&self, prefix: &str) -> bool {
        let start = format!("{prefix}/");
        fn under<V>(map: &BTreeMap<String, V>, start: &str) -> bool {
            map.range(start.to_string()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(start))
        }
        under(&self.tensors, &start) || under(&self.bytes, &start) || under(&self.numbers, &start)
    }

    /// The largest `i` for which something is stored under `{key}{i}` (a value, or a child
    /// `{key}{i}/…`), if any.
    pub fn indices(&self, key: &str) -> Option<usize> {
        let index = |k: &String| -> Option<usize> {
            let rest = k.strip_prefix(key)?;
            let digits = rest.split('/').next()?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        };
        let all = self
            .tensors
            .keys()
            .chain(self.bytes.keys())
            .chain(self.numbers.keys());
        all.filter_map(index).max()
    }

    /// `key`'s full path from the outermost state, for error messages.
    pub fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn missing(&self, key: &str) -> GymError {
        GymError::Checkpoint(format!(
            "no `{}` in the saved state: it comes from another strategy or configuration",
            self.path(key)
        ))
    }
}

/// A state's values, byte buffers and counters, by key.
pub(crate) type StateParts<'a> = (
    &'a BTreeMap<String, Vec<f32>>,
    &'a BTreeMap<String, serde_bytes::ByteBuf>,
    &'a BTreeMap<String, u64>,
);

/// Burn writes an optimizer's record in the order of a `HashMap` of parameters, and the
/// alignment padding between tensors follows that order: the same state would encode to
/// different bytes (and lengths) from run to run. Rewritten with its tensors sorted by name,
/// the same state is the same bytes, so a node's state sent to a rejoining peer has the same
/// size in every run of a seed, and checkpoints of the same state are identical.
pub(super) fn canonical_record(bytes: Bytes) -> std::result::Result<Bytes, burn_pack::Error> {
    let reader = burn_pack::Reader::from_bytes(bytes)?;
    let scalars = reader.scalars().clone();
    let metadata = reader.metadata().clone();
    let mut tensors = reader.into_tensors()?;
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut writer = burn_pack::Writer::new(tensors);
    for (key, value) in &scalars {
        writer = writer.with_scalar(key, *value);
    }
    for (key, value) in &metadata {
        writer = writer.with_metadata(key, value);
    }
    writer.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_state_round_trips_and_names_what_is_missing() {
        let mut child = StateDict::new();
        child.put_values("e", vec![1.0, -0.0, f32::MIN_POSITIVE]);
        child.put_u64("calls", 7);
        child.put_f64("lr", 0.1 + 0.2);
        let mut state = StateDict::new();
        state.insert_child("module0", child.clone());
        assert_eq!(state.child("module0"), child);
        assert!(state.child("module1").is_empty());
        let back = state.child("module0").values("e").unwrap().to_vec();
        assert_eq!(back[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(state.child("module0").f64("lr").unwrap(), 0.1 + 0.2);
        assert!(state.has_child("module0") && !state.has_child("module1"));
        let err = state.child("module0").u64("steps").unwrap_err();
        assert!(err.to_string().contains("`module0/steps`"), "{err}");
        let err = state.u64("calls").unwrap_err();
        assert!(err.to_string().contains("`calls`"), "{err}");
    }
}
