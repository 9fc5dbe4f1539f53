//! A strategy's communication as sizes ([`Traffic`]): which collectives every node calls at
//! each step, over which groups, with how many bytes — what the
//! [`planner`](crate::planner) charges on the simulated clock without tensors.

use crate::comm::{CollectiveOp, Group, QuorumRule};
use crate::error::Result;
use crate::state::params::ParamLayout;

/// What a strategy's schedule knows when it is built for a plan.
#[derive(Debug, Clone, Copy)]
pub struct PlanInfo<'a> {
    /// Number of nodes.
    pub world_size: usize,
    /// Steps the run takes (and its schedules span).
    pub max_steps: usize,
    /// The run seed (shared draws, such as SPARTA's random selection, follow it).
    pub seed: u64,
    /// Trainable parameters (f32 values in the flat buffer).
    pub params: u64,
    /// The trainable parameters' layout when planning a model that exists (a training run's
    /// twin); `None` when only the size is known. A schedule whose traffic depends on the
    /// layout (which elements a selector draws) follows it exactly when given, and uses
    /// the expected size otherwise (documented by the strategy).
    pub layout: Option<&'a ParamLayout>,
    /// The trainable parameters' shapes, in layout order, when known (from
    /// [`PlanConfig::shapes`](crate::planner::PlanConfig::shapes) or from `layout`): a
    /// schedule whose payload follows each tensor's shape (DeMo, PowerSGD) needs them, and
    /// refuses with [`GymError::PlanNeedsShapes`](crate::GymError::PlanNeedsShapes)
    /// without.
    pub shapes: Option<&'a [Vec<usize>]>,
    /// Every node's relative speed, by rank, as training gives it to a strategy
    /// ([`NodeInfo::node_speeds`](crate::NodeInfo::node_speeds)): a schedule in which a
    /// slower node computes fewer steps (asynchronous DiLoCo) follows it.
    pub node_speeds: &'a [f64],
    /// Whether the plan runs a fault schedule: a strategy that training runs without one
    /// only refuses it here too.
    pub faults: bool,
}

/// Which nodes take part in a planned call: the world (every node), or disjoint groups
/// that each run the call among themselves (FedAvg's islands); a node in none sits it out.
#[derive(Debug, Clone, PartialEq)]
pub enum PlannedGroups {
    /// Every node.
    World,
    /// Disjoint groups, each running the call on its own.
    Each(Vec<Group>),
}

/// One collective call in a plan, as every member makes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCall {
    /// The operation.
    pub op: CollectiveOp,
    /// Who takes part.
    pub groups: PlannedGroups,
    /// Bytes in each member's buffer (a tensor's values × 4 for f32, a codec's encoded
    /// length), as [`Collective`](crate::Collective) counts the real call's payload.
    pub payload: u64,
}

/// One event of a strategy's schedule at a step, after the node's compute, in the order the
/// strategy makes them.
#[derive(Debug, Clone, PartialEq)]
pub enum PlannedEvent {
    /// A call waited for at once (`all_reduce`, `all_gather_bytes`, …).
    Call(PlannedCall),
    /// A call started without waiting (`*_start`), known by `id` until waited for; a
    /// transfer never waited for (a detached broadcast) only occupies the links.
    Start {
        /// The handle [`Wait`](PlannedEvent::Wait) names; unique within the plan.
        id: u64,
        /// The call.
        call: PlannedCall,
    },
    /// Waits for the started call `id` ([`Pending::wait`](crate::Pending::wait)). Under a
    /// fault schedule, each node present waits for its own share of the call, or, if it
    /// took a peer's state when it came back, for the peer's (as a training node waits for
    /// the transfer its loaded state holds); a node that did not take part waits for none.
    Wait {
        /// The handle the call was started with.
        id: u64,
    },
    /// A round that proceeds with the nodes that arrive in time (Decoupled DiLoCo's outer
    /// step): see [`PlannedQuorum`].
    Quorum(PlannedQuorum),
    /// After this step, the nodes' work since their last merged step is not yet merged into
    /// the shared model ([`Strategy::committed`](crate::Strategy::committed) is false): a
    /// node that leaves, takes a peer's state, or is left out of a quorum before a step
    /// without this event loses it. A step without it merges everything.
    Unmerged,
}

/// A quorum round over every node present (each part of a cut cluster on its own), as
/// [`Collective::quorum_in`](crate::Collective::quorum_in) and DiLoCo run it: the members
/// that arrive in time under `rule` are decided from their simulated clocks (each member's
/// arrival: when it is ready for a call); those taken wait, idle, until the quorum closes,
/// and those left out stop at the close (the compute they had charged after it is taken
/// back). The quorum then makes `op` among itself with `payload` bytes each, and, when some
/// were left out, its first member sends them `catch_up` bytes (a broadcast over the late
/// members and itself), which they wait for and it does not.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedQuorum {
    /// Who the round waits for.
    pub rule: QuorumRule,
    /// The call the quorum makes (its mean).
    pub op: CollectiveOp,
    /// Bytes in each quorum member's buffer for `op`.
    pub payload: u64,
    /// Bytes of the broadcast to the members left out (the round's result).
    pub catch_up: u64,
}

impl PlannedEvent {
    /// A call over every node, waited for at once.
    pub fn world(op: CollectiveOp, payload: u64) -> Self {
        PlannedEvent::Call(PlannedCall {
            op,
            groups: PlannedGroups::World,
            payload,
        })
    }
}

/// A strategy's communication as sizes: what every node calls at each step. Built by
/// [`StrategyConfig::traffic`](crate::StrategyConfig::traffic) and stepped by [`plan`](crate::planner::plan) once
/// per step, for all nodes at once (strategies are SPMD: every node makes the same calls).
pub trait Traffic: Send {
    /// Appends the events of `step` (after the nodes' compute) to `events`, in order.
    fn step(&mut self, step: usize, events: &mut Vec<PlannedEvent>) -> Result<()>;

    /// Whether node `rank` computes a gradient at `step`
    /// ([`Strategy::computes`](crate::Strategy::computes)): a node that sits a step out
    /// charges no compute to its clock. The default: every node, every step.
    fn computes(&self, _rank: usize, _step: usize) -> bool {
        true
    }

    /// Whether any node ever sits a step out ([`computes`](Self::computes) may say
    /// `false`); when not, the planner does not ask for each node and step. The default:
    /// none does.
    fn sits_out(&self) -> bool {
        false
    }
}

/// A schedule (`traffic`) whose nodes sit out the steps `computes(rank, step)` says they
/// do not compute (asynchronous DiLoCo's slower workers).
pub struct SittingOut<T, C> {
    /// The calls.
    pub traffic: T,
    /// `computes(rank, step)`: whether `rank` computes at `step`.
    pub computes: C,
}

impl<T, C> Traffic for SittingOut<T, C>
where
    T: Traffic,
    C: Fn(usize, usize) -> bool + Send,
{
    fn step(&mut self, step: usize, events: &mut Vec<PlannedEvent>) -> Result<()> {
        self.traffic.step(step, events)
    }

    fn computes(&self, rank: usize, step: usize) -> bool {
        (self.computes)(rank, step)
    }

    fn sits_out(&self) -> bool {
        true
    }
}

/// A closure is a schedule: `|step, events| { …; Ok(()) }`.
impl<F> Traffic for F
where
    F: FnMut(usize, &mut Vec<PlannedEvent>) -> Result<()> + Send,
{
    fn step(&mut self, step: usize, events: &mut Vec<PlannedEvent>) -> Result<()> {
        self(step, events)
    }
}
