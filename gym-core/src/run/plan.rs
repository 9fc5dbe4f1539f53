//! What every node of a run does, resolved once by the trainer from its configuration and
//! the data: the node loop reads this plan, never the configuration.

use super::config::{Autocast, NonFinitePolicy};
use crate::comm::faults::FaultTimeline;
use crate::comm::simulation::SimulationConfig;

/// The schedule of a run's node loop.
#[derive(Debug, Clone)]
pub(crate) struct RunPlan {
    /// Number of nodes.
    pub num_nodes: usize,
    /// Optimizer steps.
    pub max_steps: usize,
    /// The steps the schedules (learning rate, SPARTA's ramp) span: `max_steps`, or for a
    /// run extended past its first length, that first length (they hold their last value
    /// after it).
    pub schedule_steps: usize,
    /// Examples per forward/backward pass.
    pub minibatch: usize,
    /// Passes accumulated per step (`batch_size / minibatch`).
    pub accumulation: usize,
    /// The precision of the forward and backward passes, under autocast.
    pub autocast: Option<Autocast>,
    /// Validation examples per intermediate evaluation (0: none).
    pub val_size: usize,
    /// Steps between intermediate evaluations.
    pub val_interval: usize,
    /// Steps between replica correlations, if measured.
    pub correlation_interval: Option<usize>,
    /// The run seed.
    pub seed: u64,
    /// The simulated cluster and the FLOPs of one node's step, if time is simulated.
    pub simulation: Option<(SimulationConfig, f64)>,
    /// The first step to take (0, or where a resumed checkpoint stopped).
    pub start_step: usize,
    /// Steps between checkpoints, if any are written at intervals.
    pub checkpoint_interval: Option<usize>,
    /// What a non-finite loss or gradient does.
    pub on_nonfinite: NonFinitePolicy,
    /// Which nodes are present at each step, and which run slow.
    pub faults: FaultTimeline,
    /// Whether the run ends with an evaluation on the whole validation set (not for the
    /// minibatch probe's trials).
    pub final_evaluation: bool,
}

impl RunPlan {
    /// Whether an intermediate evaluation runs before `step`.
    pub fn evaluates_before(&self, step: usize) -> bool {
        self.val_size > 0 && step.is_multiple_of(self.val_interval)
    }

    /// Simulated seconds of `rank`'s forward and backward passes at `step`, which took
    /// `measured_s` here; `None` without simulated time.
    pub fn step_compute_s(&self, rank: usize, step: usize, measured_s: f64) -> Option<f64> {
        self.simulation.as_ref().map(|(sim, flops)| {
            sim.step_compute_s(rank, step, self.seed, *flops, measured_s)
                / self.faults.speed_factor(rank, step)
        })
    }

    /// Whether simulated compute is this machine's wall time
    /// ([`ComputeModel::Measured`](crate::comm::ComputeModel::Measured)): then a strategy's
    /// own work is charged too, as measured.
    pub fn measures_compute(&self) -> bool {
        self.simulation
            .as_ref()
            .is_some_and(|(sim, _)| sim.compute == crate::comm::ComputeModel::Measured)
    }

    /// Whether a checkpoint is due before `next_step` (every interval, and at the end).
    pub fn checkpoints_before(&self, next_step: usize) -> bool {
        next_step > self.start_step
            && self
                .checkpoint_interval
                .is_some_and(|every| next_step.is_multiple_of(every) || next_step == self.max_steps)
    }

    /// Whether the replicas' correlation is measured after `step`.
    pub fn correlates_after(&self, step: usize) -> bool {
        self.correlation_interval
            .is_some_and(|every| (step + 1).is_multiple_of(every))
    }
}
