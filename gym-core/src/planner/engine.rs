//! The planner's loop: every node's clock, stepped through a strategy's [`Traffic`] with
//! the clock and cost code of training.

use super::ledger::Ledgers;
use super::{PlanConfig, PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, Traffic};
use crate::comm::clock::NodeClock;
use crate::comm::faults::FaultTimeline;
use crate::comm::trace::{CallInfo, NodeTimeline, group_text};
use crate::comm::{
    CollectiveOp, CommStats, ComputeModel, Group, Network, SimulationConfig, TransferTiming,
};
use crate::error::{GymError, Result};
use crate::metrics::RunReport;
use crate::metrics::trace::{MAX_TRACE_EVENTS, Trace};
use crate::state::params::ParamLayout;
use crate::strategy::StrategyConfig;
use std::collections::HashMap;
use std::sync::Arc;

/// A member's timing of a call, and the call while tracing.
pub(super) type Started = (usize, TransferTiming, Option<Arc<CallInfo>>);

/// Plans `strategy` on `config`: every node's simulated clock and traffic after
/// `config.steps` steps, as a [`RunReport`] whose [`simulated`](RunReport::simulated) and
/// [`comm`](RunReport::comm) a training run of the same set-up would report (its other
/// records are empty: nothing is trained). `layout`: the trainable parameters' layout when
/// the model exists (see [`PlanInfo::layout`]).
///
/// Under [`faults`](PlanConfig::faults) it runs the schedule as training does (see
/// [the module](super#faults)).
///
/// Refuses, naming the setting: no nodes, no steps, no parameters, [`shapes`](PlanConfig::shapes)
/// whose elements do not add up to the parameters (or that differ from `layout`'s), a
/// strategy whose traffic follows the shapes given none
/// ([`GymError::PlanNeedsShapes`]), a step's FLOPs that are negative or not finite, a simulated cluster that does not fit `num_nodes`, a strategy
/// without a [`Traffic`](super::Traffic) schedule, a fault schedule that does not resolve
/// for the run (as training refuses it; random faults need a modelled compute), and a node
/// that comes back with nobody to copy its state from while it holds a transfer started
/// and not yet waited for (see [the module](super#faults)).
pub fn plan(
    config: &PlanConfig,
    strategy: &dyn StrategyConfig,
    layout: Option<&ParamLayout>,
) -> Result<RunReport> {
    run_plan(config, strategy, layout, false).map(|(report, _)| report)
}

/// [`plan`], and the plan's timeline: every node's compute, exposed communication, idle
/// and down time span by span, and its link's transfers, as the clock charged them (the
/// spans a training run of the same set-up records with
/// [`TrainerConfig::trace`](crate::TrainerConfig::trace)). Write it with [`Trace::write`].
pub fn plan_traced(
    config: &PlanConfig,
    strategy: &dyn StrategyConfig,
    layout: Option<&ParamLayout>,
) -> Result<(RunReport, Trace)> {
    let (report, timelines) = run_plan(config, strategy, layout, true)?;
    let trace = Trace::new(timelines, &report.simulated, &config.simulation)
        .with_meta("source", "plan".into())
        .with_meta("strategy", strategy.name().into())
        .with_meta("steps", config.steps.into());
    Ok((report, trace))
}

/// Plans, recording every node's timeline when `traced`.
fn run_plan(
    config: &PlanConfig,
    strategy: &dyn StrategyConfig,
    layout: Option<&ParamLayout>,
    traced: bool,
) -> Result<(RunReport, Vec<NodeTimeline>)> {
    let bad = |why: String| Err(GymError::InvalidConfig(why));
    if config.num_nodes == 0 {
        return bad("a plan needs at least one node (`num_nodes` is 0)".into());
    }
    if config.steps == 0 {
        return bad("a plan needs at least one step (`steps` is 0)".into());
    }
    if config.params == 0 {
        return bad("a plan needs a model with parameters (`params` is 0)".into());
    }
    if !(config.step_flops.is_finite() && config.step_flops >= 0.0) {
        return bad(format!(
            "a step's FLOPs must be finite and non-negative, got {}",
            config.step_flops
        ));
    }
    config.simulation.validate(config.num_nodes)?;
    let from_layout: Option<Vec<Vec<usize>>> =
        layout.map(|l| l.entries().iter().map(|e| e.shape.clone()).collect());
    let shapes = config.shapes.as_deref().or(from_layout.as_deref());
    if let Some(shapes) = shapes {
        check_shapes(shapes, config.params, from_layout.as_deref())?;
    }
    // Every node's speed as training gives it to a strategy (1 where none is set).
    let node_speeds: Vec<f64> = (0..config.num_nodes)
        .map(|rank| {
            config
                .simulation
                .node_speed
                .get(rank)
                .copied()
                .unwrap_or(1.0)
        })
        .collect();
    let info = PlanInfo {
        node_speeds: &node_speeds,
        faults: config.faults.is_some(),
        world_size: config.num_nodes,
        max_steps: config.steps,
        seed: config.seed,
        params: config.params,
        layout,
        shapes,
    };
    let faults = resolve_faults(config)?;
    let mut traffic = strategy.traffic(&info)?;
    let mut cluster = Cluster::new(config, faults);
    if traced {
        let budget = (MAX_TRACE_EVENTS / config.num_nodes).max(16);
        for clock in &mut cluster.clocks {
            clock.start_trace(budget);
        }
    }
    let mut events = Vec::new();
    for step in 0..config.steps {
        for clock in &mut cluster.clocks {
            clock.begin_step(step);
        }
        cluster.rejoin(step, &config.rejoin_bytes)?;
        cluster.compute(config, step, &*traffic);
        events.clear();
        traffic.step(step, &mut events)?;
        for event in events.drain(..) {
            cluster.apply(event, step)?;
        }
        cluster.ledgers.settle(config, step);
    }
    let elastic = cluster.ledgers.finish(config, &cluster.faults);
    let report = RunReport {
        num_nodes: config.num_nodes,
        steps: config.steps,
        comm: cluster.stats,
        simulated: cluster.clocks.iter().map(|c| c.time).collect(),
        elastic,
        ..RunReport::default()
    };
    let timelines = cluster
        .clocks
        .into_iter()
        .filter_map(|c| c.trace.map(|t| t.into_timeline()))
        .collect();
    Ok((report, timelines))
}

/// Refuses `shapes` whose elements do not add up to `params`, or that differ from the
/// layout's shapes (`from_layout`) when both are given.
fn check_shapes(
    shapes: &[Vec<usize>],
    params: u64,
    from_layout: Option<&[Vec<usize>]>,
) -> Result<()> {
    let bad = |why: String| Err(GymError::InvalidConfig(why));
    let mut total: u64 = 0;
    for (i, shape) in shapes.iter().enumerate() {
        let numel = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .filter(|&n| n > 0);
        match numel.and_then(|n| total.checked_add(n)) {
            Some(sum) => total = sum,
            None => {
                return bad(format!(
                    "`shapes`: tensor {i} ({shape:?}) has no elements or too many"
                ));
            }
        }
    }
    if total != params {
        return bad(format!(
            "`shapes` hold {total} values but `params` is {params}"
        ));
    }
    if let Some(layout) = from_layout
        && layout != shapes
    {
        return bad("`shapes` differ from the shapes of the layout given with them".into());
    }
    Ok(())
}

/// The run's fault timeline, resolved as the trainer resolves it: random faults drawn from
/// the nodes' modelled compute seconds of each step.
fn resolve_faults(config: &PlanConfig) -> Result<FaultTimeline> {
    let Some(schedule) = &config.faults else {
        return Ok(FaultTimeline::none(config.num_nodes, config.steps));
    };
    let sim = &config.simulation;
    let modelled = matches!(sim.compute, ComputeModel::Modelled { .. });
    if schedule.random.is_some() && !modelled {
        return Err(GymError::InvalidConfig(
            "random faults need a modelled compute (not `measured`)".into(),
        ));
    }
    let step_seconds = |rank: usize, step: usize| {
        sim.step_compute_s(rank, step, config.seed, config.step_flops, 0.0)
    };
    FaultTimeline::resolve(
        schedule,
        config.num_nodes,
        config.steps,
        config.seed,
        sim.island_size(),
        modelled.then_some(&step_seconds as &dyn Fn(usize, usize) -> f64),
    )
}

/// Every node's clock, counters and ledger, the fault timeline, and the transfers started
/// and not yet waited for.
pub(super) struct Cluster {
    pub clocks: Vec<NodeClock>,
    pub stats: Vec<CommStats>,
    pub world: Group,
    pub network: Network,
    pub faults: FaultTimeline,
    /// By handle, each member's share of a started call (under faults: each node's that
    /// holds it, a copy of its source's for a node that came back).
    pub started: HashMap<u64, Vec<Started>>,
    pub ledgers: Ledgers,
}

impl Cluster {
    fn new(config: &PlanConfig, faults: FaultTimeline) -> Self {
        let stepwise = !faults.is_empty();
        Cluster {
            clocks: vec![NodeClock::default(); config.num_nodes],
            stats: vec![CommStats::default(); config.num_nodes],
            world: Group::world(config.num_nodes),
            network: config.simulation.network.clone(),
            faults,
            started: HashMap::new(),
            ledgers: Ledgers::new(config.num_nodes, stepwise),
        }
    }

    /// The forward and backward passes of `step` of every node present, as the node loop
    /// charges them (a slow node's at its speed factor).
    fn compute(&mut self, config: &PlanConfig, step: usize, traffic: &dyn Traffic) {
        let sim: &SimulationConfig = &config.simulation;
        // Asked once per step, so that a schedule where every node computes costs nothing
        // more per node.
        let sitting_out = traffic.sits_out();
        if self.faults.is_empty() {
            // Every node present at speed 1: the same seconds (x / 1.0 is x), without the
            // timeline's look-ups, the planner's innermost loop at 10,000 nodes.
            for (rank, clock) in self.clocks.iter_mut().enumerate() {
                if sitting_out && !traffic.computes(rank, step) {
                    continue;
                }
                clock.compute(sim.step_compute_s(rank, step, config.seed, config.step_flops, 0.0));
            }
            return;
        }
        for (rank, clock) in self.clocks.iter_mut().enumerate() {
            if sitting_out && self.faults.is_present(rank, step) && !traffic.computes(rank, step) {
                self.ledgers.sits_out(rank);
                continue;
            }
            let mut computed = None;
            if self.faults.is_present(rank, step) {
                let seconds = sim.step_compute_s(rank, step, config.seed, config.step_flops, 0.0);
                let seconds = seconds / self.faults.speed_factor(rank, step);
                clock.compute(seconds);
                computed = Some(seconds);
            }
            self.ledgers.computes(rank, computed);
        }
    }

    fn apply(&mut self, event: PlannedEvent, step: usize) -> Result<()> {
        match event {
            PlannedEvent::Call(call) => {
                for (rank, t, call) in self.start(&call, step)? {
                    let clock = &mut self.clocks[rank];
                    clock.finish(t.own_ready_s, t.start_s, t.end_s, call.as_ref());
                }
            }
            PlannedEvent::Start { id, call } => {
                let timings = self.start(&call, step)?;
                if self.started.insert(id, timings).is_some() {
                    return Err(GymError::InvalidConfig(format!(
                        "a planned transfer started twice with id {id}"
                    )));
                }
            }
            PlannedEvent::Wait { id } => {
                let timings = self.started.remove(&id).ok_or_else(|| {
                    GymError::InvalidConfig(format!(
                        "a plan waits for transfer {id}, never started"
                    ))
                })?;
                // Under faults, a node away does not wait: its share stays with it (until
                // it takes a peer's state).
                let mut kept = Vec::new();
                for (rank, t, call) in timings {
                    if self.faults.is_empty() || self.faults.is_present(rank, step) {
                        let clock = &mut self.clocks[rank];
                        clock.finish(t.own_ready_s, t.start_s, t.end_s, call.as_ref());
                    } else {
                        kept.push((rank, t, call));
                    }
                }
                if !kept.is_empty() {
                    self.started.insert(id, kept);
                }
            }
            PlannedEvent::Quorum(round) => self.quorum_round(&round, step),
            PlannedEvent::Unmerged => self.ledgers.unmerged(),
        }
        Ok(())
    }

    /// Starts `call` of `step` on every group, as [`Collective`](crate::Collective) starts
    /// a call: each group cut, for each member present, to the present nodes it reaches
    /// ([`FaultTimeline::members`], as the node's handle cuts it), and each distinct cut
    /// run once. Returns each member's timing, to be waited for.
    fn start(&mut self, call: &PlannedCall, step: usize) -> Result<Vec<Started>> {
        let groups = match &call.groups {
            PlannedGroups::World => std::slice::from_ref(&self.world),
            PlannedGroups::Each(groups) => groups.as_slice(),
        };
        for group in groups {
            if let Some(&last) = group.members().last()
                && last >= self.clocks.len()
            {
                return Err(GymError::InvalidConfig(format!(
                    "a planned group names rank {last} of {} nodes",
                    self.clocks.len()
                )));
            }
        }
        if self.faults.is_empty() {
            let mut timings = Vec::new();
            for group in groups {
                let one = (call.op, group, call.payload, None);
                timings.extend(run(&mut self.clocks, &mut self.stats, &self.network, one));
            }
            return Ok(timings);
        }
        // The cuts, each run once; a group's members reach each other's cuts alike (reach
        // is a partition of the present nodes), so cuts of one group are disjoint.
        let components = self.faults.groups(step);
        let mut cuts = Vec::new();
        for group in groups {
            for component in &components {
                let cut = group.intersect(component);
                if cut.size() > 0 {
                    cuts.push(cut);
                }
            }
        }
        let mut timings = Vec::new();
        for cut in &cuts {
            timings.extend(self.run(call.op, cut, call.payload, None));
        }
        Ok(timings)
    }

    /// [`run`] on this cluster.
    pub(super) fn run(
        &mut self,
        op: CollectiveOp,
        group: &Group,
        payload: u64,
        purpose: Option<&'static str>,
    ) -> Vec<Started> {
        let call = (op, group, payload, purpose);
        run(&mut self.clocks, &mut self.stats, &self.network, call)
    }
}

/// Runs one call, `(op, group, payload, purpose)` (`purpose`, for a trace: `rejoin`;
/// `None`: the strategy's): counted for each member, begun when its last member is ready,
/// holding every member's link until it ends. Returns each member's timing (and, while
/// tracing, the call, its transfer drawn on each member's link track).
fn run(
    clocks: &mut [NodeClock],
    stats: &mut [CommStats],
    network: &Network,
    (op, group, payload, purpose): (CollectiveOp, &Group, u64, Option<&'static str>),
) -> Vec<Started> {
    let mut timings = Vec::with_capacity(group.size());
    for &rank in group.members() {
        stats[rank].record(op, group, rank, payload);
        let own_ready_s = clocks[rank].ready();
        let timing = TransferTiming {
            own_ready_s,
            start_s: 0.0,
            end_s: 0.0,
        };
        timings.push((rank, timing, None));
    }
    let start_s = timings
        .iter()
        .map(|(_, t, _)| t.own_ready_s)
        .fold(0.0, f64::max);
    let end_s = start_s + network.collective_time(op, group, payload);
    // While tracing, the group's name and algorithm, once for all its members.
    let traced = group
        .members()
        .first()
        .is_some_and(|&r| clocks[r].trace.is_some());
    let name: Option<Arc<str>> = traced.then(|| group_text(group.members()).into());
    let algorithm = if traced {
        network.algorithm(op, group)
    } else {
        ""
    };
    for (rank, timing, info) in &mut timings {
        timing.start_s = start_s;
        timing.end_s = end_s;
        let clock = &mut clocks[*rank];
        clock.occupy_link(end_s);
        let (sent, name) = (stats[*rank].bytes_sent, name.clone());
        let named = move || name.expect("named while tracing");
        *info = clock.trace_call(named, Some((start_s, end_s)), |name| CallInfo {
            purpose,
            ..CallInfo::new((op, group, *rank), payload, sent, algorithm, name)
        });
    }
    timings
}
