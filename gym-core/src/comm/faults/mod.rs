//! Fault schedules: nodes that crash, leave and rejoin, or run slow, and wide-area links
//! that are cut for a while.
//!
//! Nodes run in lockstep over optimizer steps `0..max_steps`, so every fault is expressed
//! in steps: "at `S`" means before step `S` runs. A [`FaultSchedule`] is what the user asked
//! for (flags or a file, see its [`FromStr`] grammar); [`FaultTimeline::resolve`] checks it
//! against one run (its nodes, steps and islands), draws the random faults from the run's
//! seed, and answers per-step questions: who is present, whom a node can reach, who leaves
//! and who comes back (and from whom it takes the current state), how fast a node computes.
//!
//! Random faults are drawn from the seed, the rank and the step alone, so a run's faults do
//! not depend on how its node threads interleave.

use crate::error::{GymError, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// Steps a randomly failed node stays away when a `random` entry does not say
/// (`random:RATE/h` is `random:RATE/h,down=10`).
pub const DEFAULT_DOWN_STEPS: usize = 10;

/// The stream tag of random fault draws ("FAUL"), so they share no stream with other draws
/// from the same seed.
const FAULT_STREAM: u64 = 0x4641_554C;

/// One scheduled fault. Steps are optimizer steps; "at" means before step `at` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Node `rank` crashes before step `at` and never returns.
    Crash {
        /// The node.
        rank: usize,
        /// The first step it misses.
        at: usize,
    },
    /// Node `rank` leaves before step `at` and is back for step `at + steps`.
    Leave {
        /// The node.
        rank: usize,
        /// The first step it misses.
        at: usize,
        /// How many steps it misses (at least 1).
        steps: usize,
    },
    /// Node `rank` computes at `factor` times its speed for steps `at..at + steps`
    /// (factor > 0; 0.5 = half speed).
    Slow {
        /// The node.
        rank: usize,
        /// The first slow step.
        at: usize,
        /// How many steps it is slow (at least 1).
        steps: usize,
        /// Its speed relative to normal during those steps.
        factor: f64,
    },
    /// The wide-area link between islands `a` and `b` is down for steps `at..at + steps`.
    Cut {
        /// One island.
        a: usize,
        /// The other island.
        b: usize,
        /// The first step without the link.
        at: usize,
        /// How many steps the link is down (at least 1).
        steps: usize,
    },
}

impl Fault {
    /// The step before which the fault starts.
    pub fn at(&self) -> usize {
        match *self {
            Fault::Crash { at, .. }
            | Fault::Leave { at, .. }
            | Fault::Slow { at, .. }
            | Fault::Cut { at, .. } => at,
        }
    }

    /// The first step after the fault (`usize::MAX` for a crash): it is active for steps
    /// `at()..end()`.
    fn end(&self) -> usize {
        match *self {
            Fault::Crash { .. } => usize::MAX,
            Fault::Leave { at, steps, .. }
            | Fault::Slow { at, steps, .. }
            | Fault::Cut { at, steps, .. } => at.saturating_add(steps),
        }
    }

    /// Position of the kind in the sort order of resolved events.
    fn kind_order(&self) -> u8 {
        match self {
            Fault::Crash { .. } => 0,
            Fault::Leave { .. } => 1,
            Fault::Slow { .. } => 2,
            Fault::Cut { .. } => 3,
        }
    }

    /// The rank the fault concerns (island `a` for a cut), for sorting.
    fn subject(&self) -> usize {
        match *self {
            Fault::Crash { rank, .. } | Fault::Leave { rank, .. } | Fault::Slow { rank, .. } => {
                rank
            }
            Fault::Cut { a, .. } => a,
        }
    }

    /// The form of this kind of entry in the schedule grammar.
    fn form(&self) -> &'static str {
        match self {
            Fault::Crash { .. } => CRASH_FORM,
            Fault::Leave { .. } => LEAVE_FORM,
            Fault::Slow { .. } => SLOW_FORM,
            Fault::Cut { .. } => CUT_FORM,
        }
    }

    /// Checks what can be checked without knowing the run: durations of at least one step,
    /// a usable slow-down factor, a cut between two different islands. The parser and
    /// [`FaultTimeline::resolve`] (for schedules built in code or read from JSON) share it.
    fn check_shape(&self) -> std::result::Result<(), &'static str> {
        match *self {
            Fault::Crash { .. } => Ok(()),
            Fault::Leave { steps: 0, .. } => Err("a leave lasts at least one step"),
            Fault::Slow { steps: 0, .. } => Err("a slow-down lasts at least one step"),
            Fault::Slow { factor, .. } if !(factor.is_finite() && factor > 0.0) => {
                Err("the speed factor must be a finite number above 0")
            }
            Fault::Cut { steps: 0, .. } => Err("a cut lasts at least one step"),
            Fault::Cut { a, b, .. } if a == b => Err("a cut joins two different islands"),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Fault {
    /// The entry in the schedule grammar (`crash:1@5`, `leave:1@5+3`, `slow:3@20+30x0.5`,
    /// `cut:0-1@10+5`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // f64's Display is the shortest decimal that parses back to the same value, so
        // factors round-trip exactly.
        match *self {
            Fault::Crash { rank, at } => write!(f, "crash:{rank}@{at}"),
            Fault::Leave { rank, at, steps } => write!(f, "leave:{rank}@{at}+{steps}"),
            Fault::Slow {
                rank,
                at,
                steps,
                factor,
            } => write!(f, "slow:{rank}@{at}+{steps}x{factor}"),
            Fault::Cut { a, b, at, steps } => write!(f, "cut:{a}-{b}@{at}+{steps}"),
        }
    }
}

/// Random faults: every node fails as a Poisson process in its modelled compute time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RandomFaults {
    /// Failures per node-hour of simulated compute time.
    pub rate_per_hour: f64,
    /// Steps a failed node stays away; `None`: it crashes for good.
    pub down_steps: Option<usize>,
}

impl RandomFaults {
    /// Checks the rate and the down time.
    fn check(&self) -> std::result::Result<(), &'static str> {
        if !(self.rate_per_hour.is_finite() && self.rate_per_hour >= 0.0) {
            return Err("the rate must be a finite number of failures per hour, at least 0");
        }
        if self.down_steps == Some(0) {
            return Err("a failed node stays away at least one step");
        }
        Ok(())
    }
}

impl fmt::Display for RandomFaults {
    /// The entry in the schedule grammar, the down time always spelled out
    /// (`random:2.5/h,down=20`, `random:1/h,crash`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "random:{}/h", self.rate_per_hour)?;
        match self.down_steps {
            Some(n) => write!(f, ",down={n}"),
            None => write!(f, ",crash"),
        }
    }
}

/// What the user asked for (flags or a file). `Default` = no faults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultSchedule {
    /// The scheduled faults, in the order they were written.
    pub faults: Vec<Fault>,
    /// Random faults on top of the scheduled ones, if any.
    pub random: Option<RandomFaults>,
}

const CRASH_FORM: &str = "crash:RANK@STEP";
const LEAVE_FORM: &str = "leave:RANK@STEP+STEPS";
const SLOW_FORM: &str = "slow:RANK@STEP+STEPSxFACTOR";
const CUT_FORM: &str = "cut:ISLAND-ISLAND@STEP+STEPS";
const RANDOM_FORM: &str = "random:RATE/h, random:RATE/h,down=STEPS or random:RATE/h,crash";

/// One parsed entry of a schedule.
enum Entry {
    Fault(Fault),
    Random(RandomFaults),
}

/// "`entry` is not a fault: write FORM".
fn not_a_fault(entry: &str, form: &str) -> String {
    format!("`{entry}` is not a fault: write {form}")
}

/// Parses one entry (trimmed, comment already removed).
fn parse_entry(entry: &str) -> std::result::Result<Entry, String> {
    let Some((kind, rest)) = entry.split_once(':') else {
        return Err(unknown_entry(entry));
    };
    let kind = kind.trim();
    // The form of this kind; every malformed entry of the kind names it.
    let form = match kind {
        "crash" => CRASH_FORM,
        "leave" => LEAVE_FORM,
        "slow" => SLOW_FORM,
        "cut" => CUT_FORM,
        "random" => RANDOM_FORM,
        _ => return Err(unknown_entry(entry)),
    };
    let bad = || not_a_fault(entry, form);
    let count = |s: &str| s.trim().parse::<usize>().map_err(|_| bad());
    let number = |s: &str| s.trim().parse::<f64>().map_err(|_| bad());
    // "S+N" of the kinds that last some steps.
    let span = |s: &str| -> std::result::Result<(usize, usize), String> {
        let (at, steps) = s.split_once('+').ok_or_else(bad)?;
        Ok((count(at)?, count(steps)?))
    };

    if kind == "random" {
        let (rate, option) = match rest.split_once(',') {
            Some((rate, option)) => (rate, Some(option.trim())),
            None => (rest, None),
        };
        let rate = number(rate.trim().strip_suffix("/h").ok_or_else(bad)?)?;
        let down_steps = match option {
            None => Some(DEFAULT_DOWN_STEPS),
            Some("crash") => None,
            Some(option) => {
                let n = option.strip_prefix("down").ok_or_else(bad)?;
                let n = n.trim_start().strip_prefix('=').ok_or_else(bad)?;
                Some(count(n)?)
            }
        };
        let random = RandomFaults {
            rate_per_hour: rate,
            down_steps,
        };
        random
            .check()
            .map_err(|why| format!("`{entry}` is not a fault: {why} (write {form})"))?;
        return Ok(Entry::Random(random));
    }

    let (subject, when) = rest.split_once('@').ok_or_else(bad)?;
    let fault = match kind {
        "crash" => Fault::Crash {
            rank: count(subject)?,
            at: count(when)?,
        },
        "leave" => {
            let (at, steps) = span(when)?;
            Fault::Leave {
                rank: count(subject)?,
                at,
                steps,
            }
        }
        "slow" => {
            let (at, rest) = when.split_once('+').ok_or_else(bad)?;
            let (steps, factor) = rest.split_once('x').ok_or_else(bad)?;
            Fault::Slow {
                rank: count(subject)?,
                at: count(at)?,
                steps: count(steps)?,
                factor: number(factor)?,
            }
        }
        _ => {
            let (a, b) = subject.split_once('-').ok_or_else(bad)?;
            let (at, steps) = span(when)?;
            Fault::Cut {
                a: count(a)?,
                b: count(b)?,
                at,
                steps,
            }
        }
    };
    fault
        .check_shape()
        .map_err(|why| format!("`{entry}` is not a fault: {why} (write {form})"))?;
    Ok(Entry::Fault(fault))
}

/// The error for an entry of no known kind, listing every form.
fn unknown_entry(entry: &str) -> String {
    format!(
        "`{entry}` is not a fault: write {CRASH_FORM}, {LEAVE_FORM}, {SLOW_FORM}, {CUT_FORM}, \
         {RANDOM_FORM}"
    )
}

/// Parses a schedule; an error comes with the 1-based line it is on.
fn parse_schedule(text: &str) -> std::result::Result<FaultSchedule, (usize, String)> {
    let mut schedule = FaultSchedule::default();
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = line.split_once('#').map_or(line, |(code, _comment)| code);
        for entry in line.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            match parse_entry(entry).map_err(|e| (line_number, e))? {
                Entry::Fault(fault) => schedule.faults.push(fault),
                Entry::Random(random) => {
                    if schedule.random.is_some() {
                        return Err((
                            line_number,
                            format!("`{entry}`: a schedule holds at most one random entry"),
                        ));
                    }
                    schedule.random = Some(random);
                }
            }
        }
    }
    Ok(schedule)
}

impl FromStr for FaultSchedule {
    type Err = String;

    /// Entries separated by `;` or newlines; blank entries and `#` comments (to the end of
    /// the line) are ignored. Entries: `crash:RANK@STEP`, `leave:RANK@STEP+STEPS`,
    /// `slow:RANK@STEP+STEPSxFACTOR`, `cut:ISLAND-ISLAND@STEP+STEPS`, and at most one
    /// `random:RATE/h` (failures per node-hour), optionally followed by `,down=STEPS`
    /// (default 10) or `,crash`. Example: `leave:1@5+3; slow:3@20+30x0.5; random:2.5/h`.
    fn from_str(spec: &str) -> std::result::Result<Self, String> {
        parse_schedule(spec).map_err(|(line, message)| {
            // A line number only helps when there is more than one line.
            if spec.trim_end().contains('\n') {
                format!("line {line}: {message}")
            } else {
                message
            }
        })
    }
}

impl fmt::Display for FaultSchedule {
    /// The schedule in its grammar, entries joined by `;` (the random entry last); it parses
    /// back to an equal schedule.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut separator = "";
        for fault in &self.faults {
            write!(f, "{separator}{fault}")?;
            separator = ";";
        }
        if let Some(random) = &self.random {
            write!(f, "{separator}{random}")?;
        }
        Ok(())
    }
}

impl FaultSchedule {
    /// The schedule named by a command-line argument: the contents of the file `arg` if
    /// there is one (UTF-8, in the same grammar, typically one entry a line), otherwise
    /// `arg` itself parsed as a spec.
    ///
    /// A file that cannot be read is a [`GymError::Io`] naming it; a spec or file that does
    /// not parse is [`GymError::InvalidConfig`] (naming the file and the line for a file).
    pub fn from_arg(arg: &str) -> Result<FaultSchedule> {
        let path = Path::new(arg);
        if path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|e| GymError::io(path, e))?;
            return parse_schedule(&text).map_err(|(line, message)| {
                GymError::InvalidConfig(format!(
                    "fault schedule {}, line {line}: {message}",
                    path.display()
                ))
            });
        }
        arg.parse().map_err(|message: String| {
            // Someone who meant a file but mistyped its name sees why it was parsed as a spec.
            let hint = if arg.contains(':') {
                String::new()
            } else {
                format!(" (and there is no file `{arg}`)")
            };
            GymError::InvalidConfig(format!("fault schedule: {message}{hint}"))
        })
    }

    /// Whether the schedule holds no fault and no random entry.
    pub fn is_empty(&self) -> bool {
        self.faults.is_empty() && self.random.is_none()
    }
}

mod timeline;

pub use timeline::{FaultTimeline, Rejoin};

#[cfg(test)]
mod tests;
