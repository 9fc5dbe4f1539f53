//! Values of flags that are neither a number nor a name: a minibatch size that may be
//! `auto`, a number of bytes with its unit, and the value parsers that check a spec (a
//! network, a fault schedule, a duration) and keep it as written.

use crate::networks::network_file;
use gym_core::GymError;
use gym_core::comm::network::Network;
use gym_core::faults::FaultSchedule;
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

/// A value parser that checks a spec parses as `T` and keeps it as written (so that the
/// run configuration saves the spec the user gave).
pub(super) fn checked<T: FromStr<Err = String>>(spec: &str) -> Result<String, String> {
    spec.parse::<T>().map(|_| spec.to_string())
}

/// The value parser of `--call-overhead`: a duration (`300us`), kept as written.
pub(super) fn checked_duration(spec: &str) -> Result<String, String> {
    gym_core::comm::network::parse_latency(spec).map(|_| spec.to_string())
}

/// The value parser of `--network`: a network file (shipped or a path) that reads and
/// checks, or a link spec; kept as written, as [`checked`] does.
pub(super) fn checked_network(spec: &str) -> Result<String, String> {
    match network_file(spec) {
        Some(file) => file.map(|_| spec.to_string()).map_err(|e| e.to_string()),
        None => checked::<Network>(spec).map_err(|e| {
            format!(
                "{e}; or a network file: a path ending in .toml, or one of {}",
                crate::networks::network_file_names()
            )
        }),
    }
}

/// The value parser of `--faults`: checks that the argument reads as a fault schedule (a
/// file or a spec) and keeps it as written, as [`checked`] does.
pub(super) fn checked_faults(arg: &str) -> Result<String, String> {
    match FaultSchedule::from_arg(arg) {
        Ok(_) => Ok(arg.to_string()),
        // clap names the flag and the value; the kind of error adds nothing.
        Err(GymError::InvalidConfig(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

/// `spec` parsed as `T`, or an error naming `flag`.
pub(super) fn parsed<T: FromStr<Err = String>>(flag: &str, spec: &str) -> Result<T, String> {
    spec.parse().map_err(|e| format!("{flag}: {e}"))
}
