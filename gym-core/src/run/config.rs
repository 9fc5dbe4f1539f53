//! The configuration of a run ([`TrainerConfig`]): its settings and defaults, the checks
//! made before anything runs, and the plan the node loop follows.

use super::plan::RunPlan;
use crate::comm::faults::{FaultSchedule, FaultTimeline};
use crate::comm::simulation::{ComputeModel, SimulationConfig};
use crate::error::{GymError, Result};
use burn::config::Config;

/// The configuration of a run (the original's `fit` arguments).
///
/// The defaults suit a library call: no files are written (`log_dir` unset) and no progress
/// bar is drawn; the example binaries turn both on.
#[derive(Config, Debug)]
pub struct TrainerConfig {
    /// Number of simulated nodes (K).
    pub num_nodes: usize,
    /// Epochs to run when `max_steps` is not set (an epoch is one pass over a node's shard).
    #[config(default = 1)]
    pub num_epochs: usize,
    /// Steps to run; overrides `num_epochs`, and the data wraps around as needed.
    pub max_steps: Option<usize>,
    /// Examples per node per optimizer step.
    #[config(default = 16)]
    pub batch_size: usize,
    /// Examples per forward/backward pass; `batch_size / minibatch_size` passes are
    /// accumulated per step. `None`: the whole batch at once.
    pub minibatch_size: Option<usize>,
    /// Run the forward and backward passes in a lower precision, with f32 master weights
    /// (PyTorch's autocast): the parameters, the accumulated gradient, the optimizer state
    /// and every collective stay f32. `None`: f32 throughout.
    pub autocast: Option<Autocast>,
    /// Shuffle the training data (a new order every epoch, from the seed).
    #[config(default = true)]
    pub shuffle: bool,
    /// Validation examples per intermediate evaluation (0: none); unset, four batches'
    /// worth (`4 · batch_size`). The final evaluation covers the whole validation set.
    pub val_size: Option<usize>,
    /// Evaluate every this many steps (and at step 0 and at the end).
    #[config(default = 100)]
    pub val_interval: usize,
    /// Seed of everything random: initialisation, data order, per-node streams.
    #[config(default = 42)]
    pub seed: u64,
    /// Name of the run's log folder; default `<strategy>-n<K>-<UTC time>`.
    pub run_name: Option<String>,
    /// Where run folders go (`<log_dir>/<run_name>/`); unset, no file is written.
    pub log_dir: Option<String>,
    /// Where TensorBoard event files go (`<tensorboard_dir>/<run_name>/`, written as the run
    /// goes, tagged as the CSV files' columns: loss and perplexity, learning rate, bytes and
    /// simulated time per step, a node's and the averaged model's validation loss,
    /// perplexity and accuracy, the replicas' correlation, and the run's hyper-parameters;
    /// see [`Trainer::with_hparams`]); unset, none. `tensorboard --logdir
    /// <tensorboard_dir>` overlays the runs written there.
    ///
    /// [`Trainer::with_hparams`]: crate::Trainer::with_hparams
    pub tensorboard_dir: Option<String>,
    /// The event files' x axis: the examples seen by all nodes instead of the step (the
    /// examples' `--x-axis examples`), so that runs of other batch sizes line up.
    #[config(default = false)]
    pub tensorboard_examples_axis: bool,
    /// Write the run's timeline to `<log_dir>/<run_name>/trace.json`, a Chrome trace that
    /// Perfetto's UI opens: every node's compute, exposed communication, idle and down time
    /// on the simulated clock, the transfers on its link, and the loss
    /// ([`metrics::trace`](crate::metrics::trace)). Needs a `log_dir` and a `simulation`.
    #[config(default = false)]
    pub trace: bool,
    /// Draw a progress bar on stderr.
    #[config(default = false)]
    pub progress: bool,
    /// Every this many steps, log the mean pairwise Pearson correlation of the replicas'
    /// flattened float tensors (spec §2.9; needs 2 nodes or more). `None`: never.
    pub correlation_interval: Option<usize>,
    /// Threads each node's tensor kernels may use (a pool of its own); 0 lets them spread
    /// over rayon's global pool (one thread per core), shared by all nodes.
    #[config(default = 1)]
    pub kernel_threads_per_node: usize,
    /// At most this many of this process's nodes compute at once; a node waiting for
    /// others in a collective does not count ([`ComputeSlots`](crate::comm::ComputeSlots)).
    /// `None`: as many as the cores hold (cores ÷ `kernel_threads_per_node`), so that more
    /// nodes than cores take turns instead of slicing the cores between them.
    pub concurrent_nodes: Option<usize>,
    /// The cluster to simulate time on (network, compute, stragglers); `None`: no
    /// simulated time, only bytes.
    pub simulation: Option<SimulationConfig>,
    /// Write a checkpoint every this many steps, and at the end (`None`: only when
    /// interrupted, if a checkpoint folder is known).
    pub checkpoint_interval: Option<usize>,
    /// Where checkpoints go (default: the run's log folder).
    pub checkpoint_dir: Option<String>,
    /// Checkpoints kept; older ones are deleted.
    #[config(default = 2)]
    pub keep_checkpoints: usize,
    /// What a NaN or infinite loss or gradient does: stop the run (an error naming the node
    /// and step), or skip the step on every node.
    #[config(default = "NonFinitePolicy::Stop")]
    pub on_nonfinite: NonFinitePolicy,
    /// Continue the run saved in this checkpoint file, or in the newest checkpoint of this
    /// folder (a run folder). The configuration must be the one it was saved with.
    pub resume_from: Option<String>,
    /// Nodes that crash, leave and rejoin, run slow, and links that are cut
    /// ([`faults`](crate::faults)); `None`: every node present throughout. The timeline in
    /// effect (random faults drawn from the seed) is in
    /// [`RunReport::elastic`](crate::RunReport::elastic) and the run folder's `faults.json`.
    pub faults: Option<FaultSchedule>,
}

/// The precision of the forward and backward passes under autocast
/// ([`TrainerConfig::autocast`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Autocast {
    /// bfloat16: f32's range with an 8-bit mantissa.
    Bf16,
}

impl Autocast {
    /// Burn's float type for it.
    pub fn dtype(self) -> burn::tensor::FloatDType {
        match self {
            Autocast::Bf16 => burn::tensor::FloatDType::BF16,
        }
    }

    /// Its name on the command line (`bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Autocast::Bf16 => "bf16",
        }
    }
}

/// What a NaN or infinite loss or gradient does ([`TrainerConfig::on_nonfinite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum NonFinitePolicy {
    /// The run fails: [`GymError::NodeFailed`] names the node and the step, its source is
    /// [`GymError::NonFiniteLoss`] or [`GymError::NonFiniteGradient`].
    #[default]
    Stop,
    /// The step is skipped on every node (no update, no communication: every node agrees
    /// through one uncounted all-reduce of a flag per step), its loss is logged as it was,
    /// and the run goes on; [`RunReport::skipped_steps`](crate::RunReport::skipped_steps)
    /// lists such steps.
    Skip,
}

impl TrainerConfig {
    /// Examples per forward/backward pass.
    pub fn effective_minibatch(&self) -> usize {
        self.minibatch_size.unwrap_or(self.batch_size)
    }

    /// Validation examples per intermediate evaluation, the default resolved.
    pub fn effective_val_size(&self) -> usize {
        self.val_size.unwrap_or(4 * self.batch_size)
    }

    /// Checks what can be checked without the data, the model and the strategy.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(GymError::InvalidConfig(s));
        let mb = self.effective_minibatch();
        if self.num_nodes == 0 {
            return bad("`num_nodes` must be at least 1".into());
        }
        if self.batch_size == 0 {
            return bad("`batch_size` must be at least 1".into());
        }
        if mb == 0 {
            return bad("`minibatch_size` must be at least 1".into());
        }
        if mb > self.batch_size {
            return bad(format!(
                "`minibatch_size` ({mb}) is larger than `batch_size` ({})",
                self.batch_size
            ));
        }
        if !self.batch_size.is_multiple_of(mb) {
            return bad(format!(
                "`batch_size` ({}) is not a multiple of `minibatch_size` ({mb})",
                self.batch_size
            ));
        }
        if self.val_interval == 0 {
            return bad("`val_interval` must be at least 1".into());
        }
        if self.max_steps == Some(0) {
            return bad("`max_steps` must be at least 1".into());
        }
        if self.concurrent_nodes == Some(0) {
            return bad("`concurrent_nodes` must be at least 1 (unset: the cores decide)".into());
        }
        match self.correlation_interval {
            Some(0) => return bad("`correlation_interval` must be at least 1".into()),
            Some(_) if self.num_nodes < 2 => {
                return bad("`correlation_interval` needs at least 2 nodes to correlate".into());
            }
            _ => {}
        }
        if self.checkpoint_interval == Some(0) {
            return bad("`checkpoint_interval` must be at least 1".into());
        }
        if self.keep_checkpoints == 0 {
            return bad("`keep_checkpoints` must be at least 1".into());
        }
        if self.checkpoint_interval.is_some()
            && self.checkpoint_dir.is_none()
            && self.log_dir.is_none()
        {
            return bad("`checkpoint_interval` needs a `checkpoint_dir` or a `log_dir`".into());
        }
        if self.max_steps.is_none() && self.num_epochs == 0 {
            return bad("`num_epochs` must be at least 1 when `max_steps` is not set".into());
        }
        if let Some(sim) = &self.simulation {
            sim.validate(self.num_nodes)?;
        }
        if self.trace && self.simulation.is_none() {
            return bad(
                "`trace` needs a `simulation`: a timeline is drawn on simulated time".into(),
            );
        }
        if self.trace && self.log_dir.is_none() {
            return bad("`trace` needs a `log_dir`: `trace.json` goes in the run's folder".into());
        }
        Ok(())
    }

    /// The node loop's plan, for shards that hold `steps_per_epoch` batches of a model
    /// whose examples cost `flops_per_example` on the simulated clock (a proxy's, under
    /// [`SimulationConfig::charge_as`]).
    pub(super) fn plan(&self, steps_per_epoch: usize, flops_per_example: f64) -> Result<RunPlan> {
        let minibatch = self.effective_minibatch();
        let max_steps = self.max_steps.unwrap_or(self.num_epochs * steps_per_epoch);
        let flops = flops_per_example * self.batch_size as f64;
        let faults = match &self.faults {
            None => FaultTimeline::none(self.num_nodes, max_steps),
            Some(schedule) => {
                let sim = self.simulation.as_ref();
                // Random faults run on the nodes' modelled compute time (the same steps for
                // every strategy, so comparisons meet the same faults).
                let modelled = sim.filter(|s| matches!(s.compute, ComputeModel::Modelled { .. }));
                if schedule.random.is_some() && sim.is_some() && modelled.is_none() {
                    return Err(GymError::InvalidConfig(
                        "random faults need a modelled compute (not `measured`)".into(),
                    ));
                }
                let step_seconds = |rank: usize, step: usize| {
                    modelled.map_or(0.0, |s| s.step_compute_s(rank, step, self.seed, flops, 0.0))
                };
                let island_size = sim.and_then(SimulationConfig::island_size);
                FaultTimeline::resolve(
                    schedule,
                    self.num_nodes,
                    max_steps,
                    self.seed,
                    island_size,
                    modelled
                        .is_some()
                        .then_some(&step_seconds as &dyn Fn(usize, usize) -> f64),
                )?
            }
        };
        Ok(RunPlan {
            num_nodes: self.num_nodes,
            max_steps,
            schedule_steps: max_steps,
            minibatch,
            accumulation: self.batch_size / minibatch,
            autocast: self.autocast,
            val_size: self.effective_val_size(),
            val_interval: self.val_interval,
            correlation_interval: self.correlation_interval,
            seed: self.seed,
            simulation: self.simulation.clone().map(|sim| (sim, flops)),
            start_step: 0,
            checkpoint_interval: self.checkpoint_interval,
            on_nonfinite: self.on_nonfinite,
            faults,
            final_evaluation: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(c: TrainerConfig) -> String {
        match c.validate() {
            Err(GymError::InvalidConfig(s)) => s,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn the_library_defaults_write_nothing_and_draw_no_bar() {
        let c = TrainerConfig::new(4);
        assert_eq!((c.log_dir.as_deref(), c.progress), (None, false));
    }

    #[test]
    fn invalid_configurations_are_typed_errors() {
        assert!(invalid(TrainerConfig::new(0)).contains("`num_nodes`"));
        assert!(invalid(TrainerConfig::new(2).with_batch_size(0)).contains("batch_size"));
        assert!(
            invalid(
                TrainerConfig::new(2)
                    .with_batch_size(8)
                    .with_minibatch_size(Some(16))
            )
            .contains("larger than `batch_size`")
        );
        assert!(
            invalid(
                TrainerConfig::new(2)
                    .with_batch_size(8)
                    .with_minibatch_size(Some(3))
            )
            .contains("multiple")
        );
        // A validation size below the batch size is allowed (one smaller batch), and an
        // unset one follows the batch size.
        assert!(
            TrainerConfig::new(2)
                .with_batch_size(64)
                .with_val_size(Some(32))
                .validate()
                .is_ok()
        );
        let big_batch = TrainerConfig::new(4).with_batch_size(128);
        assert!(big_batch.validate().is_ok());
        assert_eq!(big_batch.effective_val_size(), 512);
        assert!(invalid(TrainerConfig::new(2).with_val_interval(0)).contains("val_interval"));
        assert!(invalid(TrainerConfig::new(2).with_max_steps(Some(0))).contains("max_steps"));
        assert!(
            invalid(TrainerConfig::new(2).with_concurrent_nodes(Some(0)))
                .contains("concurrent_nodes")
        );
        assert!(
            TrainerConfig::new(2)
                .with_val_size(Some(0))
                .validate()
                .is_ok()
        );
        assert!(
            invalid(TrainerConfig::new(2).with_correlation_interval(Some(0)))
                .contains("correlation_interval")
        );
        assert!(
            invalid(TrainerConfig::new(1).with_correlation_interval(Some(5))).contains("2 nodes")
        );
    }
}
