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

use crate::collective::Group;
use crate::error::{GymError, Result};
use crate::rng::derive_seed;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
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

/// Where one or more nodes come back at a step, and from whom they take the current state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejoin {
    /// A node that was present (on the side that carries on) at the previous step and is in
    /// the same component now; `None` when nobody in the component was.
    pub source: Option<usize>,
    /// The nodes that come back, in rank order.
    pub ranks: Vec<usize>,
}

/// The schedule resolved for one run: every fault at its steps, random ones drawn from the
/// seed.
///
/// It serializes as its run's shape and its events; the per-step tables are rebuilt from
/// them when it is read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "TimelineRecord", into = "TimelineRecord")]
pub struct FaultTimeline {
    num_nodes: usize,
    max_steps: usize,
    island_size: Option<usize>,
    /// Scheduled and drawn faults, sorted by step, kind, then rank.
    events: Vec<Fault>,
    /// Per rank: the steps it is absent, as sorted, disjoint, non-adjacent `start..end`
    /// ranges (a crash runs to `usize::MAX`).
    absent: Vec<Vec<(usize, usize)>>,
    /// Per rank: its slow-downs as `(start, end, factor)`.
    slow: Vec<Vec<(usize, usize, f64)>>,
    /// Link cuts as `(a, b, start, end)` with `a < b`.
    cuts: Vec<(usize, usize, usize, usize)>,
}

/// What a [`FaultTimeline`] is written as.
#[derive(Serialize, Deserialize)]
struct TimelineRecord {
    num_nodes: usize,
    max_steps: usize,
    island_size: Option<usize>,
    events: Vec<Fault>,
}

impl From<TimelineRecord> for FaultTimeline {
    fn from(r: TimelineRecord) -> Self {
        FaultTimeline::build(r.num_nodes, r.max_steps, r.island_size, r.events)
    }
}

impl From<FaultTimeline> for TimelineRecord {
    fn from(t: FaultTimeline) -> Self {
        TimelineRecord {
            num_nodes: t.num_nodes,
            max_steps: t.max_steps,
            island_size: t.island_size,
            events: t.events,
        }
    }
}

/// Sorts `ranges` and merges overlapping or adjacent ones.
fn merge(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Whether `step` lies in one of the sorted, disjoint `ranges`.
fn in_ranges(ranges: &[(usize, usize)], step: usize) -> bool {
    let i = ranges.partition_point(|&(start, _)| start <= step);
    i > 0 && ranges[i - 1].1 > step
}

impl FaultTimeline {
    /// A timeline without faults for `num_nodes` nodes.
    pub fn none(num_nodes: usize, max_steps: usize) -> Self {
        FaultTimeline::build(num_nodes, max_steps, None, Vec::new())
    }

    /// Builds the per-step tables from `events` (already checked, or read back from a run),
    /// sorting the events. Events about ranks outside the run are kept but affect nothing.
    fn build(
        num_nodes: usize,
        max_steps: usize,
        island_size: Option<usize>,
        mut events: Vec<Fault>,
    ) -> Self {
        // Stable, so equal keys keep the order they were given in.
        events.sort_by_key(|f| (f.at(), f.kind_order(), f.subject()));
        let mut absent = vec![Vec::new(); num_nodes];
        let mut slow = vec![Vec::new(); num_nodes];
        let mut cuts = Vec::new();
        for fault in &events {
            let (start, end) = (fault.at(), fault.end());
            match *fault {
                Fault::Crash { rank, .. } | Fault::Leave { rank, .. } => {
                    if let Some(ranges) = absent.get_mut(rank) {
                        ranges.push((start, end));
                    }
                }
                Fault::Slow { rank, factor, .. } => {
                    if let Some(ranges) = slow.get_mut(rank) {
                        ranges.push((start, end, factor));
                    }
                }
                Fault::Cut { a, b, .. } => cuts.push((a.min(b), a.max(b), start, end)),
            }
        }
        FaultTimeline {
            num_nodes,
            max_steps,
            island_size,
            events,
            absent: absent.into_iter().map(merge).collect(),
            slow,
            cuts,
        }
    }

    /// Resolves `schedule` for a run of `num_nodes` nodes over steps `0..max_steps`.
    ///
    /// `island_size`: ranks per island when the network has islands (island of rank `r` =
    /// `r / island_size`), needed by `cut`. `step_seconds(rank, step)`: the node's modelled
    /// compute seconds of that step, needed by random faults (`None` when time is not
    /// simulated: then a random entry is an error).
    ///
    /// Random faults: for each rank in order, the steps are walked from 0; at each step the
    /// node is present (given the scheduled faults and those drawn so far) it fails before
    /// that step with probability `1 − exp(−rate/3600 · step_seconds(rank, step))`, drawn
    /// from a generator seeded by `(seed, rank, step)` alone. A failure is a
    /// `Leave { steps: down }` (which may run past the last step) or a `Crash`; no draws are
    /// made while the node is away. A drawn fault that would leave no node present at some
    /// step is not applied (the node carries on and draws again at the next step), so random
    /// faults never stop a run. Non-positive or NaN step times never fail.
    ///
    /// Errors ([`GymError::InvalidConfig`], naming the entry): a rank or island that does
    /// not exist, a fault starting at or after `max_steps`, a cut without islands, a
    /// malformed entry (zero steps, a bad factor or rate), scheduled faults that leave no
    /// node present at some step, a random entry without simulated time.
    pub fn resolve(
        schedule: &FaultSchedule,
        num_nodes: usize,
        max_steps: usize,
        seed: u64,
        island_size: Option<usize>,
        step_seconds: Option<&dyn Fn(usize, usize) -> f64>,
    ) -> Result<Self> {
        let invalid =
            |fault: &Fault, why: String| GymError::InvalidConfig(format!("`{fault}`: {why}"));
        if island_size == Some(0) {
            return Err(GymError::InvalidConfig(
                "islands hold at least one rank (island size 0)".into(),
            ));
        }
        let num_islands = island_size.map(|size| num_nodes.div_ceil(size));
        for fault in &schedule.faults {
            fault
                .check_shape()
                .map_err(|why| invalid(fault, format!("{why} (write {})", fault.form())))?;
            if let Fault::Crash { rank, .. } | Fault::Leave { rank, .. } | Fault::Slow { rank, .. } =
                *fault
                && rank >= num_nodes
            {
                return Err(invalid(
                    fault,
                    format!("rank {rank} does not exist in a run of {num_nodes} nodes"),
                ));
            }
            if let Fault::Cut { a, b, .. } = *fault {
                let Some(num_islands) = num_islands else {
                    return Err(invalid(
                        fault,
                        "a link cut needs a network with islands (`--topology islands:SIZE:WAN`)"
                            .into(),
                    ));
                };
                if let Some(island) = [a, b].into_iter().find(|&i| i >= num_islands) {
                    return Err(invalid(
                        fault,
                        format!(
                            "island {island} does not exist: the network has {num_islands} \
                             islands (0..{num_islands})"
                        ),
                    ));
                }
            }
            if fault.at() >= max_steps {
                return Err(invalid(
                    fault,
                    format!(
                        "step {} is not in the run, which has {max_steps} steps (0..{max_steps})",
                        fault.at()
                    ),
                ));
            }
        }

        // How many nodes are absent at each step, from the scheduled faults (each node's
        // ranges merged first, so overlapping faults of one node count once).
        let scheduled =
            FaultTimeline::build(num_nodes, max_steps, island_size, schedule.faults.clone());
        let mut absent_count = vec![0usize; max_steps];
        for ranges in &scheduled.absent {
            for &(start, end) in ranges {
                for count in &mut absent_count[start.min(max_steps)..end.min(max_steps)] {
                    *count += 1;
                }
            }
        }
        if num_nodes > 0
            && let Some(step) = absent_count.iter().position(|&n| n == num_nodes)
        {
            let culprits: Vec<String> = schedule
                .faults
                .iter()
                .filter(|f| matches!(f, Fault::Crash { .. } | Fault::Leave { .. }))
                .filter(|f| f.at() <= step && step < f.end())
                .map(|f| format!("`{f}`"))
                .collect();
            return Err(GymError::InvalidConfig(format!(
                "the fault schedule ({}) leaves no node present at step {step}",
                culprits.join(", ")
            )));
        }

        let mut events = schedule.faults.clone();
        if let Some(random) = &schedule.random {
            random
                .check()
                .map_err(|why| GymError::InvalidConfig(format!("`{random}`: {why}")))?;
            let step_seconds = step_seconds.ok_or_else(|| {
                GymError::InvalidConfig(format!(
                    "`{random}`: random faults need simulated time (a rate per hour of \
                     compute means nothing without it)"
                ))
            })?;
            if random.rate_per_hour > 0.0 {
                for rank in 0..num_nodes {
                    draw_rank(
                        random,
                        rank,
                        seed,
                        &scheduled.absent[rank],
                        &mut absent_count,
                        num_nodes,
                        step_seconds,
                        &mut events,
                    );
                }
            }
        }
        Ok(FaultTimeline::build(
            num_nodes,
            max_steps,
            island_size,
            events,
        ))
    }

    /// Whether there are no events at all.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The resolved events (what gets written with the run), sorted by step, kind (crash,
    /// leave, slow, cut), then rank.
    pub fn events(&self) -> &[Fault] {
        &self.events
    }

    /// The number of nodes of the run.
    pub fn num_nodes(&self) -> usize {
        self.num_nodes
    }

    /// The number of steps of the run.
    pub fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// Whether node `rank` takes part in `step` (false for ranks outside the run).
    pub fn is_present(&self, rank: usize, step: usize) -> bool {
        self.absent
            .get(rank)
            .is_some_and(|ranges| !in_ranges(ranges, step))
    }

    /// The island of `rank` (all ranks share island 0 without islands).
    fn island(&self, rank: usize) -> usize {
        match self.island_size {
            Some(size) if size > 0 => rank / size,
            _ => 0,
        }
    }

    /// The component of every rank at `step`, named by its lowest rank; `None` for absent
    /// ranks.
    ///
    /// Present nodes on one island always reach each other; two islands are linked unless
    /// a cut between them is active, and reach each other through any chain of links.
    /// Only islands with a present node relay: a link leads to the nodes of an island, and
    /// an island whose nodes are all away has nobody to forward through it.
    fn components(&self, step: usize) -> Vec<Option<usize>> {
        let present: Vec<bool> = (0..self.num_nodes)
            .map(|r| self.is_present(r, step))
            .collect();
        let cut: HashSet<(usize, usize)> = self
            .cuts
            .iter()
            .filter(|&&(_, _, start, end)| start <= step && step < end)
            .map(|&(a, b, _, _)| (a, b))
            .collect();
        if cut.is_empty() {
            let first = present.iter().position(|&p| p);
            return present
                .iter()
                .map(|&p| if p { first } else { None })
                .collect();
        }

        // Islands with a present node, ascending (ranks are, and islands grow with them).
        let mut islands: Vec<usize> = (0..self.num_nodes)
            .filter(|&r| present[r])
            .map(|r| self.island(r))
            .collect();
        islands.dedup();
        let num_islands = islands.last().map_or(0, |&i| i + 1);
        // Components of the complement of the cut graph: walk from an island to every
        // not-yet-reached island it is not cut from. Each check either reaches an island
        // (once per island) or hits a cut pair, so this is linear in islands plus cuts.
        let mut component = vec![usize::MAX; num_islands];
        let mut unreached = islands;
        let mut next_component = 0;
        while !unreached.is_empty() {
            let start = unreached.remove(0);
            component[start] = next_component;
            let mut frontier = vec![start];
            while let Some(u) = frontier.pop() {
                let (linked, rest): (Vec<usize>, Vec<usize>) = unreached
                    .into_iter()
                    .partition(|&v| !cut.contains(&(u.min(v), u.max(v))));
                for &v in &linked {
                    component[v] = next_component;
                }
                frontier.extend(linked);
                unreached = rest;
            }
            next_component += 1;
        }
        // Name components by their lowest rank, met first in rank order.
        let mut lowest = vec![None; next_component];
        (0..self.num_nodes)
            .map(|r| present[r].then(|| *lowest[component[self.island(r)]].get_or_insert(r)))
            .collect()
    }

    /// The connected components of present nodes at `step`, ordered by their lowest rank.
    pub fn groups(&self, step: usize) -> Vec<Group> {
        let mut by_label: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (rank, label) in self.components(step).into_iter().enumerate() {
            if let Some(label) = label {
                by_label.entry(label).or_default().push(rank);
            }
        }
        by_label.into_values().map(Group::new).collect()
    }

    /// The present nodes `rank` can reach at `step`, itself included: its connected
    /// component of present nodes, where islands are connected unless a cut between them
    /// is active (transitively, through islands with a present node). An empty group when
    /// `rank` is absent.
    pub fn members(&self, rank: usize, step: usize) -> Group {
        let components = self.components(step);
        match components.get(rank).copied().flatten() {
            Some(label) => Group::new(
                components
                    .iter()
                    .enumerate()
                    .filter(|&(_, &l)| l == Some(label))
                    .map(|(r, _)| r),
            ),
            None => Group::new(Vec::new()),
        }
    }

    /// Nodes that come back before `step`, with the node each takes the current state from.
    ///
    /// A node comes back when it is present at `step` but was absent at `step - 1`, or was
    /// present at both but at `step - 1` on another side of a cut than its component's main
    /// side. For each component `C` of present nodes at `step`, its members present at
    /// `step - 1` are grouped by their component then; the main side is the largest group
    /// (ties: the one holding the lowest rank), `source` is its lowest rank, and `ranks` are
    /// the members of `C` not on it. When no member of `C` was present at `step - 1`,
    /// `source` is `None` and `ranks` are all of `C`. Only components with a node coming
    /// back have an entry, ordered by their lowest rank; step 0 has none.
    pub fn rejoins(&self, step: usize) -> Vec<Rejoin> {
        if step == 0 {
            return Vec::new();
        }
        let before = self.components(step - 1);
        let mut rejoins = Vec::new();
        for group in self.groups(step) {
            // C's members present at step - 1, by their component then.
            let mut sides: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &r in group.members() {
                if let Some(label) = before[r] {
                    sides.entry(label).or_default().push(r);
                }
            }
            // Sides hold ascending ranks, so side[0] is its lowest.
            let main = sides
                .values()
                .max_by(|x, y| x.len().cmp(&y.len()).then(y[0].cmp(&x[0])));
            let rejoin = match main {
                None => Rejoin {
                    source: None,
                    ranks: group.members().to_vec(),
                },
                Some(main) => Rejoin {
                    source: Some(main[0]),
                    ranks: group
                        .members()
                        .iter()
                        .copied()
                        .filter(|r| !main.contains(r))
                        .collect(),
                },
            };
            if !rejoin.ranks.is_empty() {
                rejoins.push(rejoin);
            }
        }
        rejoins
    }

    /// Nodes present at `step - 1` and absent at `step` (none at step 0), in rank order.
    pub fn departures(&self, step: usize) -> Vec<usize> {
        if step == 0 {
            return Vec::new();
        }
        (0..self.num_nodes)
            .filter(|&r| self.is_present(r, step - 1) && !self.is_present(r, step))
            .collect()
    }

    /// Product of the factors of the slow-downs active for `rank` at `step` (1.0 if none).
    pub fn speed_factor(&self, rank: usize, step: usize) -> f64 {
        self.slow.get(rank).map_or(1.0, |ranges| {
            ranges
                .iter()
                .filter(|&&(start, end, _)| start <= step && step < end)
                .map(|&(_, _, factor)| factor)
                .product()
        })
    }

    /// Node-steps during which nodes are absent (summed over ranks and steps before
    /// `max_steps`).
    pub fn absent_node_steps(&self) -> usize {
        self.absent
            .iter()
            .flatten()
            .map(|&(start, end)| end.min(self.max_steps).saturating_sub(start))
            .sum()
    }
}

/// Draws the random faults of `rank` (see [`FaultTimeline::resolve`]), appending them to
/// `events` and counting the steps they take it away in `absent_count`.
///
/// `scheduled` is the rank's absence from scheduled faults; `absent_count` counts every
/// rank's absence so far (scheduled for all, drawn for the ranks before this one).
#[allow(clippy::too_many_arguments)]
fn draw_rank(
    random: &RandomFaults,
    rank: usize,
    seed: u64,
    scheduled: &[(usize, usize)],
    absent_count: &mut [usize],
    num_nodes: usize,
    step_seconds: &dyn Fn(usize, usize) -> f64,
    events: &mut Vec<Fault>,
) {
    let max_steps = absent_count.len();
    let mut present: Vec<bool> = (0..max_steps).map(|s| !in_ranges(scheduled, s)).collect();
    // A step where this rank is the only present node cannot lose it. Those steps stay the
    // same while the rank's own faults are drawn: the other ranks do not change, and a
    // fault is only applied if it spares them. `next_sole[s]`: the first such step ≥ s.
    let mut next_sole = vec![max_steps; max_steps + 1];
    for s in (0..max_steps).rev() {
        let sole = present[s] && absent_count[s] + 1 == num_nodes;
        next_sole[s] = if sole { s } else { next_sole[s + 1] };
    }
    let rate_per_second = random.rate_per_hour / 3600.0;
    let mut step = 0;
    while step < max_steps {
        if !present[step] {
            step += 1;
            continue;
        }
        let seconds = step_seconds(rank, step);
        if seconds.is_nan() || seconds <= 0.0 {
            step += 1;
            continue;
        }
        // 1 − exp(−x), accurate for the tiny x of short steps.
        let p = -(-rate_per_second * seconds).exp_m1();
        let stream = derive_seed(seed, &[FAULT_STREAM, rank as u64, step as u64]);
        let u: f64 = ChaCha8Rng::seed_from_u64(stream).random();
        if u >= p {
            step += 1;
            continue;
        }
        let end = match random.down_steps {
            Some(down) => step.saturating_add(down).min(max_steps),
            None => max_steps,
        };
        if next_sole[step] < end {
            // It would leave nobody: the node carries on.
            step += 1;
            continue;
        }
        for s in step..end {
            if present[s] {
                present[s] = false;
                absent_count[s] += 1;
            }
        }
        match random.down_steps {
            Some(down) => events.push(Fault::Leave {
                rank,
                at: step,
                steps: down,
            }),
            None => {
                events.push(Fault::Crash { rank, at: step });
                return;
            }
        }
        step = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(spec: &str) -> FaultSchedule {
        spec.parse()
            .unwrap_or_else(|e| panic!("`{spec}` should parse: {e}"))
    }

    fn timeline(spec: &str, nodes: usize, steps: usize, islands: Option<usize>) -> FaultTimeline {
        FaultTimeline::resolve(&schedule(spec), nodes, steps, 7, islands, None)
            .unwrap_or_else(|e| panic!("`{spec}` should resolve: {e}"))
    }

    fn resolve_err(spec: &str, nodes: usize, steps: usize, islands: Option<usize>) -> String {
        match FaultTimeline::resolve(&schedule(spec), nodes, steps, 7, islands, None) {
            Err(GymError::InvalidConfig(message)) => message,
            other => panic!("`{spec}` should be an invalid configuration, got {other:?}"),
        }
    }

    fn ranks(g: &Group) -> Vec<usize> {
        g.members().to_vec()
    }

    #[test]
    fn elastic_spec_parses_every_kind_and_round_trips() {
        let s = schedule(
            " crash:1@5; leave:2@3+4\n\n slow:0@1+2x0.5 ;; cut:0-1@2+2 # a comment; crash:9@9\n\
             random:2.5/h,down=20",
        );
        assert_eq!(
            s.faults,
            vec![
                Fault::Crash { rank: 1, at: 5 },
                Fault::Leave {
                    rank: 2,
                    at: 3,
                    steps: 4
                },
                Fault::Slow {
                    rank: 0,
                    at: 1,
                    steps: 2,
                    factor: 0.5
                },
                Fault::Cut {
                    a: 0,
                    b: 1,
                    at: 2,
                    steps: 2
                },
            ]
        );
        assert_eq!(
            s.random,
            Some(RandomFaults {
                rate_per_hour: 2.5,
                down_steps: Some(20)
            })
        );
        let text = s.to_string();
        assert_eq!(
            text,
            "crash:1@5;leave:2@3+4;slow:0@1+2x0.5;cut:0-1@2+2;random:2.5/h,down=20"
        );
        assert_eq!(schedule(&text), s);

        // Defaults and the other random forms, and factors that need every digit.
        let r = schedule("random:1/h").random.unwrap();
        assert_eq!(r.down_steps, Some(DEFAULT_DOWN_STEPS));
        let s = schedule("random:0.1/h,crash;slow:3@20+30x0.3333333333333333");
        assert_eq!(s.random.as_ref().unwrap().down_steps, None);
        assert_eq!(schedule(&s.to_string()), s);
        let s = schedule("slow:0@0+1x1e-7; random:1e-9/h");
        assert_eq!(schedule(&s.to_string()), s);

        // Nothing at all.
        for empty in ["", "  ;\n# only a comment\n;", "\n\n"] {
            let s = schedule(empty);
            assert!(s.is_empty(), "{empty:?}");
            assert_eq!(s.to_string(), "");
        }
        assert!(!schedule("random:0/h").is_empty());
    }

    #[test]
    fn elastic_spec_errors_quote_the_entry_and_the_form() {
        let cases = [
            (
                "leave:1@5",
                "`leave:1@5` is not a fault: write leave:RANK@STEP+STEPS",
            ),
            ("crash:1", "`crash:1` is not a fault: write crash:RANK@STEP"),
            ("crash:x@2", "write crash:RANK@STEP"),
            ("crash:-1@2", "write crash:RANK@STEP"),
            ("leave:1@5+0", "a leave lasts at least one step"),
            ("slow:1@5+3", "write slow:RANK@STEP+STEPSxFACTOR"),
            ("slow:1@5+0x0.5", "a slow-down lasts at least one step"),
            (
                "slow:1@5+3x0",
                "the speed factor must be a finite number above 0",
            ),
            ("slow:1@5+3x-1", "the speed factor must be"),
            ("slow:1@5+3xinf", "the speed factor must be"),
            ("slow:1@5+3xNaN", "the speed factor must be"),
            ("cut:0@5+3", "write cut:ISLAND-ISLAND@STEP+STEPS"),
            ("cut:1-1@5+3", "a cut joins two different islands"),
            ("cut:0-1@5+0", "a cut lasts at least one step"),
            ("random:2", "write random:RATE/h"),
            ("random:-1/h", "the rate must be a finite number"),
            ("random:inf/h", "the rate must be a finite number"),
            ("random:1/h,down=0", "stays away at least one step"),
            ("random:1/h,down=x", "write random:RATE/h"),
            ("random:1/h,sometimes", "write random:RATE/h"),
            (
                "explode:1@2",
                "`explode:1@2` is not a fault: write crash:RANK@STEP, leave:",
            ),
            ("crash 1@2", "`crash 1@2` is not a fault"),
            (
                "random:1/h; random:2/h",
                "`random:2/h`: a schedule holds at most one random entry",
            ),
        ];
        for (spec, want) in cases {
            let err = spec.parse::<FaultSchedule>().unwrap_err();
            assert!(err.contains(want), "`{spec}`: {err}");
            assert!(!err.contains("line"), "`{spec}`: {err}");
        }
        // The line is named once there are several.
        let err = "crash:1@2\ncrash:1".parse::<FaultSchedule>().unwrap_err();
        assert!(err.starts_with("line 2: `crash:1`"), "{err}");
    }

    #[test]
    fn elastic_schedules_load_from_files_with_line_numbers() {
        let dir = std::env::temp_dir();
        let unique = format!(
            "gym-faults-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "");
        let good = dir.join(format!("{unique}-good.txt"));
        let bad = dir.join(format!("{unique}-bad.txt"));
        std::fs::write(
            &good,
            "# faults of the test\ncrash:1@5\nleave:2@3+4  # back at 7\n\nrandom:2.5/h,crash\n",
        )
        .unwrap();
        std::fs::write(&bad, "crash:1@5\n# fine so far\nleave:1@5\n").unwrap();

        let loaded = FaultSchedule::from_arg(good.to_str().unwrap());
        let failed = FaultSchedule::from_arg(bad.to_str().unwrap());
        let _ = std::fs::remove_file(&good);
        let _ = std::fs::remove_file(&bad);

        assert_eq!(
            loaded.unwrap(),
            schedule("crash:1@5; leave:2@3+4; random:2.5/h,crash")
        );
        match failed {
            Err(GymError::InvalidConfig(m)) => {
                assert!(m.contains(bad.to_str().unwrap()), "{m}");
                assert!(m.contains("line 3"), "{m}");
                assert!(m.contains("write leave:RANK@STEP+STEPS"), "{m}");
            }
            other => panic!("expected a parse error, got {other:?}"),
        }

        // Not a file: a spec.
        assert_eq!(
            FaultSchedule::from_arg("crash:0@1").unwrap(),
            schedule("crash:0@1")
        );
        match FaultSchedule::from_arg("no-such-faults.txt") {
            Err(GymError::InvalidConfig(m)) => {
                assert!(m.contains("no file `no-such-faults.txt`"), "{m}")
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn elastic_leave_departs_and_rejoins_from_a_present_node() {
        let t = timeline("leave:1@3+2", 4, 10, None);
        let present: Vec<bool> = (0..7).map(|s| t.is_present(1, s)).collect();
        assert_eq!(present, [true, true, true, false, false, true, true]);
        assert!(t.is_present(0, 3));
        assert_eq!(t.departures(3), vec![1]);
        assert!(t.departures(4).is_empty() && t.departures(5).is_empty());
        assert_eq!(ranks(&t.members(0, 3)), vec![0, 2, 3]);
        assert_eq!(t.members(1, 3).size(), 0);
        assert_eq!(ranks(&t.members(1, 5)), vec![0, 1, 2, 3]);
        assert!(t.rejoins(3).is_empty() && t.rejoins(4).is_empty());
        assert_eq!(
            t.rejoins(5),
            vec![Rejoin {
                source: Some(0),
                ranks: vec![1]
            }]
        );
        assert!(t.rejoins(0).is_empty() && t.rejoins(6).is_empty());
        assert_eq!(t.absent_node_steps(), 2);

        // Rank 0 away: the source is the lowest rank that stayed.
        let t = timeline("leave:0@2+1", 3, 5, None);
        assert_eq!(
            t.rejoins(3),
            vec![Rejoin {
                source: Some(1),
                ranks: vec![0]
            }]
        );
    }

    #[test]
    fn elastic_crash_never_rejoins_and_overlaps_merge() {
        let t = timeline("crash:2@4; leave:2@2+5", 4, 10, None);
        assert!(t.is_present(2, 1));
        assert!((2..10).all(|s| !t.is_present(2, s)));
        assert!(!t.is_present(2, 1_000_000));
        assert_eq!(t.departures(2), vec![2]);
        assert!(t.departures(4).is_empty());
        assert!((0..12).all(|s| t.rejoins(s).is_empty()));
        // Steps 2..10, counted once though both faults cover 4..7.
        assert_eq!(t.absent_node_steps(), 8);
        assert_eq!(
            t.events(),
            &[
                Fault::Leave {
                    rank: 2,
                    at: 2,
                    steps: 5
                },
                Fault::Crash { rank: 2, at: 4 },
            ]
        );
        // A leave that runs past the end counts only the run's steps.
        assert_eq!(
            timeline("leave:0@8+100", 2, 10, None).absent_node_steps(),
            2
        );
    }

    #[test]
    fn elastic_cut_splits_islands_and_heals_from_the_side_of_rank_zero() {
        let t = timeline("cut:0-1@5+3", 4, 20, Some(2));
        assert_eq!(ranks(&t.members(0, 4)), vec![0, 1, 2, 3]);
        assert_eq!(ranks(&t.members(0, 5)), vec![0, 1]);
        assert_eq!(ranks(&t.members(3, 5)), vec![2, 3]);
        assert_eq!(ranks(&t.members(2, 7)), vec![2, 3]);
        assert_eq!(t.groups(6).len(), 2);
        assert!(t.departures(5).is_empty() && t.rejoins(5).is_empty());
        assert!(t.rejoins(6).is_empty());
        assert_eq!(ranks(&t.members(3, 8)), vec![0, 1, 2, 3]);
        // Equal sides: the one holding rank 0 carries on.
        assert_eq!(
            t.rejoins(8),
            vec![Rejoin {
                source: Some(0),
                ranks: vec![2, 3]
            }]
        );
        assert_eq!(t.absent_node_steps(), 0);
    }

    #[test]
    fn elastic_cuts_are_transitive_and_the_larger_side_carries_on() {
        // Three islands of two. Cutting 0-1 alone leaves them linked through island 2.
        let t = timeline("cut:0-1@1+5", 6, 20, Some(2));
        assert_eq!(t.members(0, 2).size(), 6);
        assert!(t.rejoins(6).is_empty());

        // ... unless island 2 has nobody to relay.
        let t = timeline("cut:0-1@1+5; leave:4@1+5; leave:5@1+5", 6, 20, Some(2));
        assert_eq!(ranks(&t.members(0, 2)), vec![0, 1]);
        assert_eq!(ranks(&t.members(2, 2)), vec![2, 3]);

        // Island 0 cut off from both others: at healing the four nodes of islands 1 and 2
        // are the main side.
        let t = timeline("cut:0-1@1+5; cut:2-0@1+5", 6, 20, Some(2));
        assert_eq!(ranks(&t.members(1, 3)), vec![0, 1]);
        assert_eq!(ranks(&t.members(5, 3)), vec![2, 3, 4, 5]);
        assert_eq!(
            t.rejoins(6),
            vec![Rejoin {
                source: Some(2),
                ranks: vec![0, 1]
            }]
        );
    }

    #[test]
    fn elastic_rejoins_without_a_source_and_with_absent_returners() {
        // Islands {0,1} and {2,3}; 2 and 3 are away while the cut starts, so at step 5 their
        // side has nobody who was present before.
        let t = timeline("cut:0-1@5+10; leave:2@3+2; leave:3@3+2", 4, 20, Some(2));
        assert_eq!(
            t.rejoins(5),
            vec![Rejoin {
                source: None,
                ranks: vec![2, 3]
            }]
        );
        // Both kinds at once: 3 comes back from an absence and 2,3 across a healed cut.
        let t = timeline("cut:0-1@2+3; leave:3@4+1", 4, 20, Some(2));
        assert_eq!(ranks(&t.members(2, 4)), vec![2]);
        assert_eq!(
            t.rejoins(5),
            vec![Rejoin {
                source: Some(0),
                ranks: vec![2, 3]
            }]
        );
    }

    #[test]
    fn elastic_speed_factors_multiply() {
        let t = timeline("slow:1@2+3x0.5; slow:1@3+3x0.5", 2, 10, None);
        let factors: Vec<f64> = (0..8).map(|s| t.speed_factor(1, s)).collect();
        assert_eq!(factors, [1.0, 1.0, 0.5, 0.25, 0.25, 0.5, 1.0, 1.0]);
        assert_eq!(t.speed_factor(0, 3), 1.0);
        assert_eq!(t.speed_factor(99, 3), 1.0);
        assert!(t.is_present(1, 3));
        assert!(!t.is_empty());
        let none = FaultTimeline::none(3, 10);
        assert!(none.is_empty());
        assert_eq!(none.members(2, 9).size(), 3);
        assert_eq!(none.absent_node_steps(), 0);
    }

    #[test]
    fn elastic_resolve_rejects_what_the_run_cannot_hold() {
        let cases = [
            (
                "crash:4@1",
                None,
                "`crash:4@1`: rank 4 does not exist in a run of 4 nodes",
            ),
            ("slow:9@1+1x2", None, "rank 9 does not exist"),
            (
                "leave:1@10+1",
                None,
                "`leave:1@10+1`: step 10 is not in the run",
            ),
            (
                "cut:0-1@1+1",
                None,
                "`cut:0-1@1+1`: a link cut needs a network with islands",
            ),
            (
                "cut:0-2@1+1",
                Some(2),
                "`cut:0-2@1+1`: island 2 does not exist",
            ),
            ("cut:0-1@1+1", Some(0), "islands hold at least one rank"),
            (
                "leave:0@3+2; crash:1@4; leave:2@1+9; crash:3@0",
                None,
                "leaves no node present at step 4",
            ),
        ];
        for (spec, islands, want) in cases {
            let err = resolve_err(spec, 4, 10, islands);
            assert!(err.contains(want), "`{spec}`: {err}");
        }
        let err = resolve_err(
            "leave:0@3+2; crash:1@4; leave:2@1+9; crash:3@0",
            4,
            10,
            None,
        );
        // Every absence active at that step is named, and nothing else.
        for active in [
            "`leave:0@3+2`",
            "`crash:1@4`",
            "`leave:2@1+9`",
            "`crash:3@0`",
        ] {
            assert!(err.contains(active), "{err}");
        }
        let err = resolve_err("leave:0@3+1; crash:1@0; leave:1@5+1", 2, 10, None);
        assert!(
            err.ends_with("(`leave:0@3+1`, `crash:1@0`) leaves no node present at step 3"),
            "{err}"
        );
        // Three islands of 2 over 5 nodes: island 2 exists.
        assert!(FaultTimeline::resolve(&schedule("cut:0-2@1+1"), 5, 10, 0, Some(2), None).is_ok());

        // Schedules built in code get the parser's checks too.
        let bad = FaultSchedule {
            faults: vec![Fault::Slow {
                rank: 0,
                at: 1,
                steps: 2,
                factor: 0.0,
            }],
            random: None,
        };
        let err = FaultTimeline::resolve(&bad, 2, 10, 0, None, None).unwrap_err();
        assert!(err.to_string().contains("`slow:0@1+2x0`"), "{err}");
        let bad = FaultSchedule {
            faults: Vec::new(),
            random: Some(RandomFaults {
                rate_per_hour: 1.0,
                down_steps: Some(0),
            }),
        };
        let secs = |_: usize, _: usize| 1.0;
        assert!(FaultTimeline::resolve(&bad, 2, 10, 0, None, Some(&secs)).is_err());

        // Random faults need simulated time.
        let err = resolve_err("random:1/h", 4, 10, None);
        assert!(err.contains("random faults need simulated time"), "{err}");
    }

    fn random_timeline(spec: &str, nodes: usize, steps: usize, seed: u64) -> FaultTimeline {
        let secs = |_: usize, _: usize| 1.0;
        FaultTimeline::resolve(&schedule(spec), nodes, steps, seed, None, Some(&secs)).unwrap()
    }

    #[test]
    fn elastic_random_faults_follow_the_seed() {
        let a = random_timeline("random:30/h,down=5", 8, 2_000, 1);
        let b = random_timeline("random:30/h,down=5", 8, 2_000, 1);
        let c = random_timeline("random:30/h,down=5", 8, 2_000, 2);
        assert!(a.events().len() > 10, "{}", a.events().len());
        assert_eq!(a, b);
        assert_ne!(a.events(), c.events());
        assert!(
            a.events()
                .iter()
                .all(|f| matches!(f, Fault::Leave { steps: 5, .. }))
        );
        // Sorted by step.
        assert!(a.events().windows(2).all(|w| w[0].at() <= w[1].at()));
        // Nobody fails while away: a node's leaves do not overlap.
        for rank in 0..8 {
            let starts: Vec<usize> = a
                .events()
                .iter()
                .filter(|f| f.subject() == rank)
                .map(Fault::at)
                .collect();
            assert!(starts.windows(2).all(|w| w[1] >= w[0] + 5), "{starts:?}");
        }
        // Rate 0 draws nothing; scheduled faults are kept beside drawn ones.
        assert!(random_timeline("random:0/h", 8, 2_000, 1).is_empty());
        let d = random_timeline("crash:3@7; random:30/h,down=5", 8, 2_000, 1);
        assert!(d.events().contains(&Fault::Crash { rank: 3, at: 7 }));
        assert!(d.events().iter().all(|f| f.subject() != 3 || f.at() <= 7));

        // The timeline survives a JSON round trip.
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<FaultTimeline>(&json).unwrap(), d);
    }

    #[test]
    fn elastic_random_failure_count_matches_the_rate() {
        let (nodes, steps) = (8, 20_000);
        let t = random_timeline("random:1/h,down=1", nodes, steps, 42);
        let failures = t.events().len() as f64;
        // Each failure costs one step of compute, so the exposure is the present time.
        let hours = (nodes * steps - t.absent_node_steps()) as f64 / 3600.0;
        assert_eq!(t.absent_node_steps(), t.events().len());
        let expected = hours; // 1 per hour
        let sigma = expected.sqrt();
        assert!(
            (failures - expected).abs() < 5.0 * sigma,
            "{failures} failures, expected {expected:.1} ± {sigma:.1}"
        );
    }

    #[test]
    fn elastic_random_faults_never_empty_a_step() {
        let (nodes, steps) = (4, 300);
        let t = random_timeline("random:1e9/h,down=3", nodes, steps, 5);
        assert!(t.events().len() > 100);
        for s in 0..steps {
            assert!((0..nodes).any(|r| t.is_present(r, s)), "step {s} is empty");
        }
        // Crashes: all but one node go at once, the last never does.
        let t = random_timeline("leave:0@10+20; random:1e9/h,crash", nodes, steps, 5);
        for s in 0..steps {
            assert!((0..nodes).any(|r| t.is_present(r, s)), "step {s} is empty");
        }
        let crashes = t
            .events()
            .iter()
            .filter(|f| matches!(f, Fault::Crash { .. }))
            .count();
        assert_eq!(crashes, nodes - 1);
        assert!((0..nodes).filter(|&r| t.is_present(r, steps - 1)).count() == 1);
    }
}
