//! The strategies of the product, one [`Entry`] each: its name, what it is, the flags it
//! reads and how they build it. The example binaries' `--strategy`, `--help`, `--config`
//! keys, `compare` and `sweep` all read [`STRATEGIES`](crate::STRATEGIES); a strategy
//! declares its own flags in its own file, next to its configuration.
//!
//! A flag that several strategies read is declared once, in a [`Shared`] group
//! ([`shared`]): each strategy names the groups it reads, and the command line holds each
//! group once. Flags are the TOML keys of a run configuration (`num_nodes = 4` is
//! `--num-nodes 4`), so they are derived here too.

pub mod shared;

use clap::{ArgMatches, Args, Command, FromArgMatches};
use gym_core::{GymError, StrategyConfig};
use serde::Serialize;
use std::collections::BTreeSet;

pub use shared::{
    CompressionArgs, OptimizerArgs, OptimizerName, OuterArgs, QuorumArgs, SelectorName, SpartaArgs,
    SyncArgs, below_one, fraction, non_negative, positive,
};

/// A group of flags that several strategies read, declared once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shared {
    /// Each node's own optimizer: `--optimizer`, `--lr`, `--weight-decay`, the schedule,
    /// `--max-norm` ([`OptimizerArgs`]). Every strategy reads it.
    Optimizer,
    /// `-H`/`--sync-interval` ([`SyncArgs`]).
    Sync,
    /// `--outer-lr`, `--outer-momentum` ([`OuterArgs`]).
    Outer,
    /// `--compression` ([`CompressionArgs`]).
    Compression,
    /// Decoupled DiLoCo's quorum: `--min-quorum`, `--grace`, `--fastest` ([`QuorumArgs`]).
    /// Refused for a strategy that does not read it.
    Quorum,
    /// SPARTA's sparse averaging: `--p-sparta`, `--sparta-sync-interval`,
    /// `--sparta-selector`.
    Sparta,
}

impl Shared {
    fn heading(self) -> &'static str {
        match self {
            Shared::Optimizer => "Inner optimizer",
            Shared::Sync => "Synchronisation",
            Shared::Outer => "Outer optimizer",
            Shared::Compression => "Compression",
            Shared::Quorum => "Quorum (Decoupled DiLoCo)",
            Shared::Sparta => "SPARTA",
        }
    }

    fn augment(self, command: Command) -> Command {
        match self {
            Shared::Optimizer => OptimizerArgs::augment_args(command),
            Shared::Sync => SyncArgs::augment_args(command),
            Shared::Outer => OuterArgs::augment_args(command),
            Shared::Compression => CompressionArgs::augment_args(command),
            Shared::Quorum => QuorumArgs::augment_args(command),
            Shared::Sparta => SpartaArgs::augment_args(command),
        }
    }

    fn json(self, matches: &ArgMatches) -> serde_json::Value {
        match self {
            Shared::Optimizer => json::<OptimizerArgs>(matches),
            Shared::Sync => json::<SyncArgs>(matches),
            Shared::Outer => json::<OuterArgs>(matches),
            Shared::Compression => json::<CompressionArgs>(matches),
            Shared::Quorum => json::<QuorumArgs>(matches),
            Shared::Sparta => json::<SpartaArgs>(matches),
        }
    }
}

/// One strategy of the product.
pub struct Entry {
    /// Its name on the command line and in logs, e.g. `sparta-diloco`.
    pub name: &'static str,
    /// What it is, in one line (`--strategy`'s help).
    pub about: &'static str,
    /// The shared flag groups it reads ([`Shared::Optimizer`] is read by every strategy
    /// and need not be named).
    pub uses: &'static [Shared],
    /// Its own flags, under a heading of its own (`None`: it has none).
    pub flags: Option<OwnFlags>,
    /// Builds its configuration from the parsed flags; refuses settings it cannot run
    /// with, naming the flag.
    pub build: fn(&Flags) -> Result<Box<dyn StrategyConfig>, String>,
}

/// A strategy's own flags: a clap [`Args`] struct of its file, shown under `heading`.
#[derive(Clone, Copy)]
pub struct OwnFlags {
    /// The `--help` heading they appear under.
    pub heading: &'static str,
    /// Adds them to a command line ([`Args::augment_args`]).
    pub augment: fn(Command) -> Command,
    /// Their parsed values as JSON, for the run configuration a run saves.
    pub json: fn(&ArgMatches) -> serde_json::Value,
}

impl OwnFlags {
    /// The flags of `A`, under `heading`.
    pub const fn of<A: Args + FromArgMatches + Serialize>(heading: &'static str) -> Option<Self> {
        Some(OwnFlags {
            heading,
            augment: A::augment_args,
            json: json::<A>,
        })
    }
}

impl Entry {
    /// Whether it reads `group`.
    pub fn reads(&self, group: Shared) -> bool {
        group == Shared::Optimizer || self.uses.contains(&group)
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The entry for `name`, or an error that lists the registered names.
pub fn find(name: &str) -> Result<&'static Entry, GymError> {
    crate::STRATEGIES
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| {
            GymError::InvalidConfig(format!(
                "`{name}` is not a registered strategy; the strategies are {}",
                names(|_| true)
            ))
        })
}

/// The names of the entries that `pick` keeps, as a user reads them: `a, b and c`.
pub fn names(pick: impl Fn(&Entry) -> bool) -> String {
    let all: Vec<&str> = crate::STRATEGIES
        .iter()
        .filter(|e| pick(e))
        .map(|e| e.name)
        .collect();
    match all.split_last() {
        None => String::new(),
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// The flags of every registered strategy, parsed: flattened into a binary's command line
/// (`#[command(flatten)]`), each shared group once, then each strategy's own under its
/// heading.
#[derive(Debug, Clone, Default)]
pub struct StrategyFlags {
    matches: ArgMatches,
}

/// What a strategy's `build` reads its flags from.
pub struct Flags<'a> {
    matches: &'a ArgMatches,
}

impl Flags<'_> {
    /// The group of flags `A` (a shared group, or the strategy's own).
    pub fn get<A: FromArgMatches>(&self) -> Result<A, String> {
        A::from_arg_matches(self.matches).map_err(|e| e.to_string())
    }
}

impl StrategyFlags {
    /// Builds `entry`'s configuration from these flags. A flag of a group the strategy
    /// does not read is refused if the group is strict ([`Shared::Quorum`]).
    pub fn build(&self, entry: &Entry) -> Result<Box<dyn StrategyConfig>, String> {
        self.check(entry)?;
        (entry.build)(&Flags {
            matches: &self.matches,
        })
    }

    /// Checks the flags that only some strategies take: the quorum flags need a strategy
    /// that reads them, and a usable rule. The error names the flag and the strategy.
    pub fn check(&self, entry: &Entry) -> Result<(), String> {
        let quorum = QuorumArgs::from_arg_matches(&self.matches).map_err(|e| e.to_string())?;
        let Some(flag) = quorum.given() else {
            return Ok(());
        };
        if !entry.reads(Shared::Quorum) {
            return Err(format!(
                "{flag}: {} has no quorum (only {} wait for one)",
                entry.name,
                names(|e| e.reads(Shared::Quorum))
            ));
        }
        quorum.rule().map(|_| ())
    }

    /// Forgets the flags of strict groups that `entry` does not read, so that one command
    /// line can run several strategies (`compare`, `sweep`) and each run records only what
    /// applied to it.
    pub fn retain_for(&mut self, entry: &Entry) {
        if !entry.reads(Shared::Quorum) {
            for id in QuorumArgs::IDS {
                let _ = self.matches.try_remove_one::<usize>(id);
                let _ = self.matches.try_remove_one::<f64>(id);
            }
        }
    }

    /// The group of flags `A` (a shared group, or a strategy's own), as parsed.
    pub fn get<A: FromArgMatches>(&self) -> Result<A, String> {
        A::from_arg_matches(&self.matches).map_err(|e| e.to_string())
    }

    /// Whether the flag with clap id `id` was given on the command line (or in a file).
    pub fn given(&self, id: &str) -> bool {
        matches!(
            self.matches.value_source(id),
            Some(clap::parser::ValueSource::CommandLine)
        )
    }
}

impl FromArgMatches for StrategyFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(StrategyFlags {
            matches: matches.clone(),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.matches = matches.clone();
        Ok(())
    }
}

impl Args for StrategyFlags {
    fn augment_args(mut command: Command) -> Command {
        let groups: BTreeSet<Shared> = crate::STRATEGIES
            .iter()
            .flat_map(|e| e.uses.iter().copied())
            .chain([Shared::Optimizer])
            .collect();
        for group in groups {
            command = group.augment(command.next_help_heading(group.heading()));
            if group == Shared::Optimizer {
                continue;
            }
            // Each shared flag says which strategies read it.
            let readers = names(|e| e.reads(group));
            let ids: Vec<String> = group
                .augment(Command::new("ids"))
                .get_arguments()
                .map(|a| a.get_id().to_string())
                .collect();
            for id in ids {
                command = command.mut_arg(id, |arg| {
                    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                    let help = help.trim_end_matches('.');
                    arg.help(format!("{help}. Read by {readers}."))
                });
            }
        }
        for entry in crate::STRATEGIES {
            if let Some(own) = entry.flags {
                command = (own.augment)(command.next_help_heading(own.heading));
            }
        }
        command.next_help_heading(None)
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

impl StrategyFlags {
    /// The flags `entry` reads (the shared groups it uses and its own), as one flat object
    /// with the run configuration's keys: what describes a run of that strategy.
    pub fn json_for(&self, entry: &Entry) -> serde_json::Map<String, serde_json::Value> {
        let groups: BTreeSet<Shared> = entry
            .uses
            .iter()
            .copied()
            .chain([Shared::Optimizer])
            .collect();
        let own = entry.flags.map(|own| (own.json)(&self.matches));
        let mut read = serde_json::Map::new();
        for value in groups.into_iter().map(|g| g.json(&self.matches)).chain(own) {
            if let serde_json::Value::Object(fields) = value {
                read.extend(fields);
            }
        }
        read
    }
}

/// Every group's and strategy's flags, as one flat object (the run configuration's keys).
impl Serialize for StrategyFlags {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let groups: BTreeSet<Shared> = crate::STRATEGIES
            .iter()
            .flat_map(|e| e.uses.iter().copied())
            .chain([Shared::Optimizer])
            .collect();
        let own = crate::STRATEGIES
            .iter()
            .filter_map(|e| e.flags.map(|own| (own.json)(&self.matches)));
        let mut all = serde_json::Map::new();
        for value in groups.into_iter().map(|g| g.json(&self.matches)).chain(own) {
            if let serde_json::Value::Object(fields) = value {
                all.extend(fields);
            }
        }
        all.serialize(serializer)
    }
}

/// The group of flags `A` in `matches`, as JSON.
pub fn json<A: FromArgMatches + Serialize>(matches: &ArgMatches) -> serde_json::Value {
    A::from_arg_matches(matches)
        .ok()
        .and_then(|a| serde_json::to_value(a).ok())
        .unwrap_or_default()
}

/// Serialises a [`clap::ValueEnum`] as its name on the command line (`shuffled-sequential`),
/// so that a saved run configuration reads back as flags.
pub fn value_name<T: clap::ValueEnum, S: serde::Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let name = value
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    serializer.serialize_str(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry's flags alone, as a binary flattens them.
    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        flags: StrategyFlags,
    }

    fn parse(args: &[&str]) -> StrategyFlags {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("gym").chain(args.iter().copied()))
            .expect("parses")
            .flags
    }

    #[test]
    fn the_flags_of_every_strategy_form_one_command_line() {
        // clap's own checks (duplicate ids, conflicting or missing references): a group
        // declared twice, or two strategies with one flag, fail here.
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_strategy_builds_from_the_defaults_under_its_own_name() {
        let flags = parse(&[]);
        let mut seen = BTreeSet::new();
        for entry in crate::STRATEGIES {
            assert!(seen.insert(entry.name), "{} registered twice", entry.name);
            let config = flags.build(entry).expect(entry.name);
            assert_eq!(config.name(), entry.name);
        }
    }

    #[test]
    fn flags_reach_the_configuration_and_the_saved_run_configuration() {
        let flags = parse(&["-H", "7", "--outer-lr", "0.5", "--fragments", "3"]);
        let diloco = flags.build(find("diloco").unwrap()).unwrap().to_json();
        assert_eq!(diloco["communicator"]["sync_interval"], 7);
        assert_eq!(diloco["communicator"]["outer_lr"], 0.5);
        let streaming = flags
            .build(find("streaming-diloco").unwrap())
            .unwrap()
            .to_json();
        assert_eq!(streaming["fragments"], 3);
        let saved = serde_json::to_value(&flags).unwrap();
        assert_eq!(saved["sync_interval"], 7);
        assert_eq!(saved["fragments"], 3);
        assert_eq!(
            saved["sparta_selector"], "random",
            "enums as their flag values"
        );
    }

    #[test]
    fn nesterov_sets_the_outer_sgd_as_the_originals_flag_and_is_refused_where_unused() {
        // The outer SGD's momentum settings, wherever the configuration's JSON holds them.
        fn momentum_of(v: &serde_json::Value) -> Option<serde_json::Value> {
            match v {
                serde_json::Value::Object(map) => map
                    .get("momentum")
                    .filter(|m| m.is_object())
                    .cloned()
                    .or_else(|| map.values().find_map(momentum_of)),
                _ => None,
            }
        }
        let outer = |args: &[&str]| {
            let diloco = parse(args)
                .build(find("diloco").unwrap())
                .unwrap()
                .to_json();
            momentum_of(&diloco["communicator"]["outer_optimizer"]).expect("an outer SGD")
        };
        assert_eq!(outer(&[])["nesterov"], true, "DiLoCo's default");
        for (args, nesterov) in [
            (&["--nesterov", "false"][..], false),
            (&["--nesterov", "False"], false),
            (&["--nesterov"], true),
            (&["--nesterov", "True"], true),
        ] {
            let momentum = outer(args);
            assert_eq!(momentum["nesterov"], nesterov, "{args:?}");
            assert_eq!(
                momentum["momentum"], 0.9,
                "{args:?}: the default momentum kept"
            );
        }
        let heavy_ball = outer(&["--nesterov=false", "--outer-momentum", "0.5"]);
        assert_eq!(heavy_ball["momentum"], 0.5);
        assert_eq!(heavy_ball["nesterov"], false);
        let e = parse(&["--nesterov"])
            .build(find("noloco").unwrap())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("--nesterov") && e.contains("NoLoCo"), "{e}");
    }

    #[test]
    fn a_strategy_reads_its_groups_and_its_own_flags_only() {
        let flags = parse(&["-H", "7", "--fragments", "3"]);
        let allreduce = flags.json_for(find("allreduce").unwrap());
        assert!(allreduce.contains_key("lr"), "{allreduce:?}");
        assert!(!allreduce.contains_key("sync_interval"), "{allreduce:?}");
        assert!(!allreduce.contains_key("fragments"), "{allreduce:?}");
        let streaming = flags.json_for(find("streaming-diloco").unwrap());
        assert_eq!(streaming["sync_interval"], 7);
        assert_eq!(streaming["fragments"], 3);
        assert_eq!(streaming["lr"], allreduce["lr"]);
    }

    #[test]
    fn an_unregistered_name_and_a_quorum_without_one_are_refused_by_name() {
        let e = find("diloko").unwrap_err().to_string();
        assert!(e.contains("`diloko` is not a registered strategy"), "{e}");
        assert!(
            e.contains("allreduce, diloco") && e.contains("powersgd"),
            "{e}"
        );
        let flags = parse(&["--min-quorum", "3"]);
        let e = flags.build(find("allreduce").unwrap()).err().unwrap();
        assert!(
            e.starts_with("--min-quorum: allreduce has no quorum"),
            "{e}"
        );
        assert!(flags.build(find("diloco").unwrap()).is_ok());
        let e = parse(&["--min-quorum", "0"]).check(find("diloco").unwrap());
        assert!(e.unwrap_err().starts_with("--min-quorum:"));
    }
}
