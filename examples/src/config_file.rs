//! Run configurations read from TOML or JSON files (`--config FILE`), whose keys are the
//! flags' names, and the resolved configuration a run saves (`run_config.toml`).

use clap::{FromArgMatches, Parser};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A bad `--config` file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or JSON, or holds a value no flag can take.
    #[error("config file {path}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// Flags read from a run-configuration file.
///
/// Each top-level key is a flag, in snake or kebab case (`num_nodes = 4` is
/// `--num-nodes 4`); `true` is a bare switch (`cosine = true`), `false` leaves it off; an
/// array is a comma-separated list (`strategies = ["allreduce", "diloco"]`). A table
/// `[overrides.<strategy>]` holds flags for one strategy only (used by `compare`, e.g. DeMo's
/// own learning rate). The file is TOML unless its name ends in `.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigFile {
    /// The file the flags came from.
    pub path: Option<PathBuf>,
    /// Its top-level flags, as command-line words.
    pub flags: Vec<String>,
    /// Per strategy name: the flags of its `[overrides.<strategy>]` table.
    pub overrides: BTreeMap<String, Vec<String>>,
}

impl ConfigFile {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |why: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        let value: serde_json::Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?
        } else {
            let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
            serde_json::to_value(table).map_err(|e| invalid(e.to_string()))?
        };
        let serde_json::Value::Object(mut top) = value else {
            return Err(invalid("expected a table of flags".into()));
        };
        let mut overrides = BTreeMap::new();
        if let Some(o) = top.remove("overrides") {
            let serde_json::Value::Object(o) = o else {
                return Err(invalid("`overrides` must be a table of tables".into()));
            };
            for (strategy, flags) in o {
                let serde_json::Value::Object(flags) = flags else {
                    return Err(invalid(format!("`overrides.{strategy}` must be a table")));
                };
                let words = flag_words(&flags).map_err(invalid)?;
                overrides.insert(strategy.replace('_', "-"), words);
            }
        }
        Ok(ConfigFile {
            path: Some(path.to_path_buf()),
            flags: flag_words(&top).map_err(invalid)?,
            overrides,
        })
    }

    /// The flags of the overrides table of `label` (a strategy's name, or a `compare`
    /// variant's label; none if it has no table).
    pub fn overrides_for(&self, label: &str) -> &[String] {
        self.overrides.get(label).map_or(&[], Vec::as_slice)
    }
}

/// A table of flags as command-line words.
fn flag_words(table: &serde_json::Map<String, serde_json::Value>) -> Result<Vec<String>, String> {
    use serde_json::Value;
    let scalar = |key: &str, v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!("`{key}`: {other} is not a flag value")),
    };
    let mut words = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            Value::Bool(true) => words.push(flag),
            Value::Bool(false) | Value::Null => {}
            Value::Array(items) => {
                let items = items
                    .iter()
                    .map(|v| scalar(key, v))
                    .collect::<Result<Vec<_>, _>>()?;
                words.extend([flag, items.join(",")]);
            }
            Value::Object(_) => return Err(format!("`{key}` is a table; flags are values")),
            v => words.extend([flag, scalar(key, v)?]),
        }
    }
    Ok(words)
}

/// Parses `T` from `argv` (program name first) with `command` (`T::command()`, possibly
/// with other defaults), after the flags of its `--config FILE`: the command line wins
/// over the file. Returns the file too, for per-strategy overrides.
pub fn try_parse_from<T: FromArgMatches>(
    command: &clap::Command,
    argv: &[OsString],
) -> Result<(T, ConfigFile), clap::Error> {
    let file = match config_path(argv) {
        Some(path) => ConfigFile::load(&path)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?,
        None => ConfigFile::default(),
    };
    Ok((parse_with(command, argv, &file, &[])?, file))
}

/// Parses `T` from `argv` with `file`'s flags first and `extra` flags last (they win).
pub fn parse_with<T: FromArgMatches>(
    command: &clap::Command,
    argv: &[OsString],
    file: &ConfigFile,
    extra: &[String],
) -> Result<T, clap::Error> {
    // A flag given twice (in the file, then on the command line) takes its last value.
    let matches = command
        .clone()
        .args_override_self(true)
        .try_get_matches_from(with_flags_first(argv, &file.flags, extra))?;
    T::from_arg_matches(&matches)
}

/// Parses the process's command line as [`try_parse_from`] does, exiting with clap's
/// message on an error.
pub fn parse<T: Parser>() -> (T, ConfigFile) {
    parse_command(&T::command())
}

/// [`parse`] with a customised `command` (other defaults, say).
pub fn parse_command<T: FromArgMatches>(command: &clap::Command) -> (T, ConfigFile) {
    let argv: Vec<OsString> = std::env::args_os().collect();
    try_parse_from(command, &argv).unwrap_or_else(|e| e.exit())
}

fn with_flags_first(argv: &[OsString], flags: &[String], extra: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = argv.iter().take(1).cloned().collect();
    args.extend(flags.iter().map(OsString::from));
    args.extend(argv.iter().skip(1).cloned());
    args.extend(extra.iter().map(OsString::from));
    args
}

/// The value of `--config FILE` or `--config=FILE` in `argv`.
fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let mut words = argv.iter().skip(1).map(|w| w.to_string_lossy());
    while let Some(w) = words.next() {
        if w == "--" {
            break;
        }
        if w == "--config" {
            return words.next().map(|p| PathBuf::from(p.as_ref()));
        }
        if let Some(p) = w.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    None
}

/// Writes `args` as `run_config.toml` into `dir`: the resolved configuration of a run,
/// which `--config` reads back.
pub fn save_run_config<A: Serialize>(args: &A, dir: &Path) -> std::io::Result<PathBuf> {
    // Through JSON, to drop unset options (TOML has no null).
    let mut value = serde_json::to_value(args).map_err(std::io::Error::other)?;
    if let serde_json::Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
    }
    let text = toml::to_string(&value).map_err(std::io::Error::other)?;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("run_config.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_become_flags() {
        let table = serde_json::json!({
            "num_nodes": 4,
            "lr": 1e-3,
            "cosine": true,
            "no_progress": false,
            "strategies": ["allreduce", "demo"],
            "run-name": "x",
        });
        let words = flag_words(table.as_object().unwrap()).unwrap();
        let expected = [
            "--cosine",
            "--lr",
            "0.001",
            "--num-nodes",
            "4",
            "--run-name",
            "x",
            "--strategies",
            "allreduce,demo",
        ];
        assert_eq!(words, expected);
        let nested = serde_json::json!({ "a": { "b": 1 } });
        assert!(flag_words(nested.as_object().unwrap()).is_err());
    }

    #[test]
    fn the_config_path_is_found_in_either_spelling() {
        let argv = |w: &[&str]| w.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            config_path(&argv(&["p", "--lr", "1", "--config", "a.toml"])),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            config_path(&argv(&["p", "--config=b.json"])),
            Some(PathBuf::from("b.json"))
        );
        assert_eq!(config_path(&argv(&["p", "--", "--config", "c"])), None);
        assert_eq!(
            config_path(&argv(&["--config"])),
            None,
            "argv[0] is the program"
        );
    }
}
