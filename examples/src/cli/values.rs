//! Values of flags that are neither a number nor a name: a minibatch size that may be
//! `auto`, and a number of bytes with its unit.

use serde::Serialize;
use std::str::FromStr;

/// `--minibatch-size`: a number of examples, or `auto` (the minibatch probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinibatchSize {
    /// Find the largest that fits ([`Trainer::probe_minibatch`](gym_core::Trainer::probe_minibatch)).
    Auto,
    /// This many examples per forward pass.
    Examples(usize),
}

impl FromStr for MinibatchSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(MinibatchSize::Auto),
            n => n
                .parse()
                .map(MinibatchSize::Examples)
                .map_err(|_| format!("`{n}` is neither a number of examples nor `auto`")),
        }
    }
}

impl Serialize for MinibatchSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MinibatchSize::Auto => s.serialize_str("auto"),
            MinibatchSize::Examples(n) => s.serialize_u64(*n as u64),
        }
    }
}

/// A number of bytes: `123`, `512KiB`, `1.5GiB`, `2GB` (binary and decimal units).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{s}` (B, KiB, MiB, GiB, KB, MB, GB)"
            ));
        }
    };
    match number.parse::<f64>() {
        Ok(v) if v > 0.0 && (v * scale).is_finite() => Ok((v * scale).round() as u64),
        _ => Err(format!("`{s}` is not a positive number of bytes")),
    }
}
