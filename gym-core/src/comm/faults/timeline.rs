//! A fault schedule resolved for one run: who is present at each step, whom a node can
//! reach, who leaves and who comes back, how fast each node computes.

use super::{FAULT_STREAM, Fault, FaultSchedule, RandomFaults};
use crate::comm::group::Group;
use crate::error::{GymError, Result};
use crate::state::rng::derive_seed;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

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
