//! The planner's loop: every node's clock, stepped through a strategy's [`Traffic`] with
//! the clock and cost code of training.

use super::{PlanConfig, PlanInfo, PlannedCall, PlannedEvent, PlannedGroups};
use crate::comm::clock::NodeClock;
use crate::comm::{CommStats, Group, TransferTiming};
use crate::error::{GymError, Result};
use crate::metrics::RunReport;
use crate::state::params::ParamLayout;
use crate::strategy::StrategyConfig;
use std::collections::HashMap;

/// Plans `strategy` on `config`: every node's simulated clock and traffic after
/// `config.steps` steps, as a [`RunReport`] whose [`simulated`](RunReport::simulated) and
/// [`comm`](RunReport::comm) a training run of the same set-up would report (its other
/// records are empty: nothing is trained). `layout`: the trainable parameters' layout when
/// the model exists (see [`PlanInfo::layout`]).
///
/// Refuses, naming the setting: no nodes, no steps, no parameters, a step's FLOPs that are
/// negative or not finite, a simulated cluster that does not fit `num_nodes`, and a strategy
/// without a [`Traffic`](super::Traffic) schedule.
pub fn plan(
    config: &PlanConfig,
    strategy: &dyn StrategyConfig,
    layout: Option<&ParamLayout>,
) -> Result<RunReport> {
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
    let info = PlanInfo {
        world_size: config.num_nodes,
        max_steps: config.steps,
        seed: config.seed,
        params: config.params,
        layout,
    };
    let mut traffic = strategy.traffic(&info)?;
    let mut cluster = Cluster::new(config);
    let mut events = Vec::new();
    for step in 0..config.steps {
        cluster.compute(config, step);
        events.clear();
        traffic.step(step, &mut events)?;
        for event in events.drain(..) {
            cluster.apply(event)?;
        }
    }
    Ok(RunReport {
        num_nodes: config.num_nodes,
        steps: config.steps,
        comm: cluster.stats,
        simulated: cluster.clocks.iter().map(|c| c.time).collect(),
        ..RunReport::default()
    })
}

/// Every node's clock and counters, and the transfers started and not yet waited for.
struct Cluster {
    clocks: Vec<NodeClock>,
    stats: Vec<CommStats>,
    world: Group,
    network: crate::comm::Network,
    started: HashMap<u64, Vec<(usize, TransferTiming)>>,
}

impl Cluster {
    fn new(config: &PlanConfig) -> Self {
        Cluster {
            clocks: vec![NodeClock::default(); config.num_nodes],
            stats: vec![CommStats::default(); config.num_nodes],
            world: Group::world(config.num_nodes),
            network: config.simulation.network.clone(),
            started: HashMap::new(),
        }
    }

    /// Every node's forward and backward passes of `step`, as the node loop charges them.
    fn compute(&mut self, config: &PlanConfig, step: usize) {
        let sim = &config.simulation;
        for (rank, clock) in self.clocks.iter_mut().enumerate() {
            clock.compute(sim.step_compute_s(rank, step, config.seed, config.step_flops, 0.0));
        }
    }

    fn apply(&mut self, event: PlannedEvent) -> Result<()> {
        match event {
            PlannedEvent::Call(call) => {
                for (rank, timing) in self.start(&call)? {
                    self.clocks[rank].finish(timing.own_ready_s, timing.start_s, timing.end_s);
                }
            }
            PlannedEvent::Start { id, call } => {
                let timings = self.start(&call)?;
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
                for (rank, timing) in timings {
                    self.clocks[rank].finish(timing.own_ready_s, timing.start_s, timing.end_s);
                }
            }
        }
        Ok(())
    }

    /// Starts `call` on every group, as [`Collective`](crate::Collective) starts a call:
    /// counted for each member, begun when its last member is ready, holding every
    /// member's link until it ends. Returns each member's timing, to be waited for.
    fn start(&mut self, call: &PlannedCall) -> Result<Vec<(usize, TransferTiming)>> {
        let groups = match &call.groups {
            PlannedGroups::World => std::slice::from_ref(&self.world),
            PlannedGroups::Each(groups) => groups.as_slice(),
        };
        let mut timings = Vec::new();
        for group in groups {
            if let Some(&last) = group.members().last()
                && last >= self.clocks.len()
            {
                return Err(GymError::InvalidConfig(format!(
                    "a planned group names rank {last} of {} nodes",
                    self.clocks.len()
                )));
            }
            let first = timings.len();
            for &rank in group.members() {
                self.stats[rank].record(call.op, group, rank, call.payload);
                let own_ready_s = self.clocks[rank].ready();
                timings.push((
                    rank,
                    TransferTiming {
                        own_ready_s,
                        start_s: 0.0,
                        end_s: 0.0,
                    },
                ));
            }
            let start_s = timings[first..]
                .iter()
                .map(|(_, t)| t.own_ready_s)
                .fold(0.0, f64::max);
            let end_s = start_s + self.network.collective_time(call.op, group, call.payload);
            for (rank, timing) in &mut timings[first..] {
                timing.start_s = start_s;
                timing.end_s = end_s;
                self.clocks[*rank].occupy_link(end_s);
            }
        }
        Ok(timings)
    }
}
