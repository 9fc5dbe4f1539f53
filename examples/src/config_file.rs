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
/// own learning rate), and a table `[at_nodes.<K>]` flags for the runs of K nodes only (used
/// by `sweep`, e.g. the DiLoCo scaling experiment's learning rate per node count). The file
/// is TOML unless its name ends in `.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigFile {
    /// The file the flags came from.
    pub path: Option<PathBuf>,
    /// Its top-level flags, as command-line words.
    pub flags: Vec<String>,
    /// Per strategy name: the flags of its `[overrides.<strategy>]` table.
    pub overrides: BTreeMap<String, Vec<String>>,
    /// Per node count: the flags of its `[at_nodes.<K>]` table.
    pub at_nodes: BTreeMap<usize, Vec<String>>,
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
        let mut at_nodes = BTreeMap::new();
        if let Some(o) = top.remove("at_nodes") {
            let serde_json::Value::Object(o) = o else {
                return Err(invalid("`at_nodes` must be a table of tables".into()));
            };
            for (k, flags) in o {
                let nodes: usize = k
                    .parse()
                    .map_err(|_| invalid(format!("`at_nodes.{k}`: `{k}` is not a node count")))?;
                let serde_json::Value::Object(flags) = flags else {
                    return Err(invalid(format!("`at_nodes.{k}` must be a table")));
                };
                at_nodes.insert(nodes, flag_words(&flags).map_err(invalid)?);
            }
        }
        Ok(ConfigFile {
            path: Some(path.to_path_buf()),
            flags: flag_words(&top).map_err(invalid)?,
            overrides,
            at_nodes,
        })
    }

    /// The flags of the `[at_nodes.<K>]` table of `nodes` (none if it has no table).
    pub fn at_nodes_for(&self, nodes: usize) -> &[String] {
        self.at_nodes.get(&nodes).map_or(&[], Vec::as_slice)
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
        .try_get_matches_from(with_flags_first(command, argv, &file.flags, extra))?;
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

/// The program name, then `flags` (a file's), the command line's flags and `extra`, each
/// source's flags dropping the same flags of the sources before it: a list flag on the
/// command line replaces the file's list rather than adding to it, and a file's value the
/// command line replaces is never parsed.
fn with_flags_first(
    command: &clap::Command,
    argv: &[OsString],
    flags: &[String],
    extra: &[String],
) -> Vec<OsString> {
    let file: Vec<OsString> = flags.iter().map(OsString::from).collect();
    let extra: Vec<OsString> = extra.iter().map(OsString::from).collect();
    let (file, line, extra) = (
        flag_groups(command, &file),
        flag_groups(command, argv.get(1..).unwrap_or_default()),
        flag_groups(command, &extra),
    );
    let named = |groups: &[FlagGroup]| -> Vec<String> {
        groups.iter().filter_map(|g| g.name.clone()).collect()
    };
    let (later_than_file, later_than_line) =
        ([named(&line), named(&extra)].concat(), named(&extra));
    let keep = |groups: Vec<FlagGroup>, later: &[String]| {
        groups
            .into_iter()
            .filter(|g| g.name.as_ref().is_none_or(|n| !later.contains(n)))
            .flat_map(|g| g.words)
            .collect::<Vec<_>>()
    };
    let mut args: Vec<OsString> = argv.iter().take(1).cloned().collect();
    args.extend(keep(file, &later_than_file));
    args.extend(keep(line, &later_than_line));
    args.extend(extra.into_iter().flat_map(|g| g.words));
    args
}

/// A flag and the values after it (or words before any flag: `name` is `None`).
struct FlagGroup {
    /// The flag's long name (`sync-interval` for `-H` too).
    name: Option<String>,
    words: Vec<OsString>,
}

/// `words` cut into flags with their values. A word is a flag when it starts with `--`
/// followed by a name, or with `-` followed by a letter (`-H`); `-0.5` is a value. After a
/// bare `--` everything is a value.
fn flag_groups(command: &clap::Command, words: &[OsString]) -> Vec<FlagGroup> {
    let long_of = |word: &str| -> Option<String> {
        if let Some(long) = word.strip_prefix("--") {
            let long = long.split('=').next().unwrap_or_default();
            return (!long.is_empty()).then(|| long.to_string());
        }
        let short = word.strip_prefix('-')?.chars().next()?;
        if !short.is_ascii_alphabetic() {
            return None;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_short() == Some(short));
        Some(
            arg.and_then(|a| a.get_long())
                .map_or(format!("-{short}"), str::to_string),
        )
    };
    let mut groups: Vec<FlagGroup> = Vec::new();
    let mut rest = false;
    for word in words {
        let text = word.to_string_lossy();
        let name = if rest { None } else { long_of(&text) };
        rest |= text == "--";
        match (name, groups.last_mut()) {
            (None, Some(last)) => last.words.push(word.clone()),
            (name, _) => groups.push(FlagGroup {
                name,
                words: vec![word.clone()],
            }),
        }
    }
    groups
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
    let text = run_config_text(args)?;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("run_config.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The text [`save_run_config`] writes for `args` (to tell whether a saved run had the
/// same flags).
pub fn run_config_text<A: Serialize>(args: &A) -> std::io::Result<String> {
    // Through JSON, to drop unset options (TOML has no null).
    let mut value = serde_json::to_value(args).map_err(std::io::Error::other)?;
    if let serde_json::Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
    }
    toml::to_string(&value).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_sources_replace_a_flag_rather_than_add_to_it() {
        let command = clap::Command::new("t").arg(
            clap::Arg::new("sync-interval")
                .short('H')
                .long("sync-interval"),
        );
        let words = |w: &[&str]| w.iter().map(OsString::from).collect::<Vec<_>>();
        let file: Vec<String> = [
            "--strategies",
            "a,b,c",
            "--lr",
            "1e-3",
            "--cosine",
            "--sync-interval",
            "20",
            "--shift",
            "-0.5",
        ]
        .map(String::from)
        .to_vec();
        let argv = words(&["prog", "--strategies", "a", "-H", "5"]);
        let extra = ["--lr".to_string(), "2e-3".to_string()];
        let merged = with_flags_first(&command, &argv, &file, &extra);
        assert_eq!(
            merged,
            words(&[
                "prog",
                "--cosine",
                "--shift",
                "-0.5",
                "--strategies",
                "a",
                "-H",
                "5",
                "--lr",
                "2e-3"
            ])
        );
        // `--name=value` is the flag `name`; after `--` nothing is a flag.
        let argv = words(&["prog", "--lr=5", "--", "--cosine"]);
        let merged = with_flags_first(&command, &argv, &file, &[]);
        assert_eq!(
            merged,
            words(&[
                "prog",
                "--strategies",
                "a,b,c",
                "--cosine",
                "--sync-interval",
                "20",
                "--shift",
                "-0.5",
                "--lr=5",
                "--",
                "--cosine"
            ])
        );
    }

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
