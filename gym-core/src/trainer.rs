//! `Trainer::fit`: validate the configuration, build the replicas, run one node per thread,
//! collect the final model and the run's metrics.

use crate::checkpoint::{Checkpoint, CheckpointWriter, Identity, StopAgreement};
use crate::collective::{Collective, CommStats, InProcessGroup, NodeCollective, SimulatedTime};
use crate::data::{NodeData, get_item};
use crate::elastic::{ElasticReport, NodeLedger};
use crate::error::{GymError, Result};
use crate::faults::{FaultSchedule, FaultTimeline};
use crate::metrics::{
    CsvLogs, Fingerprint, Recorder, Records, RunReport, default_run_name, exchange,
};
use crate::model::TrainModel;
use crate::node::{NodeOutcome, NodeShared, NodeStart, run_node};
use crate::params::ParamLayout;
use crate::plan::RunPlan;
use crate::replica::ModelReplica;
use crate::rng;
use crate::simulation::{ComputeModel, SimulationConfig};
use crate::strategy::{NodeInfo, StrategyConfig};
use burn::config::Config;
use burn::data::dataloader::batcher::Batcher;
use burn::module::ParamId;
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// Draw a progress bar on stderr.
    #[config(default = false)]
    pub progress: bool,
    /// Every this many steps, log the mean pairwise Pearson correlation of the replicas'
    /// flattened float tensors (spec §2.9; needs 2 nodes or more). `None`: never.
    pub correlation_interval: Option<usize>,
    /// Threads each node's tensor kernels may use (a pool of its own); 0 lets them spread
    /// over the pool of all node threads.
    #[config(default = 1)]
    pub kernel_threads_per_node: usize,
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
        Ok(())
    }

    /// The node loop's plan, for shards that hold `steps_per_epoch` batches of a model
    /// whose examples cost `flops_per_example`.
    fn plan(&self, steps_per_epoch: usize, flops_per_example: f64) -> Result<RunPlan> {
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
            minibatch,
            accumulation: self.batch_size / minibatch,
            val_size: self.effective_val_size(),
            val_interval: self.val_interval,
            correlation_interval: self.correlation_interval,
            seed: self.seed,
            simulation: self.simulation.clone().map(|sim| (sim, flops)),
            start_step: 0,
            checkpoint_interval: self.checkpoint_interval,
            on_nonfinite: self.on_nonfinite,
            faults,
        })
    }
}

/// The trained model and what the run measured.
pub struct FitOutput<M> {
    /// The element-wise average of the final replicas (parameters and float buffers such as
    /// batch-norm statistics), on the first device, in training mode.
    pub model: M,
    /// The master copy kept by the strategy (DiLoCo's outer model), for strategies that
    /// keep one; in training mode on the first device.
    pub master: Option<M>,
    /// Metrics, logs and traffic of the run.
    pub report: RunReport,
}

/// Runs K simulated nodes.
///
/// ```no_run
/// # use gym_core::*;
/// # fn demo<M: TrainModel, I: Send + 'static, B: burn::data::dataloader::batcher::Batcher<I, M::Batch>>(
/// #     init: impl Fn(&burn::tensor::Device) -> M + Sync, data: NodeData<I>, batcher: B,
/// #     strategies: Vec<Box<dyn StrategyConfig>>) -> Result<()> {
/// let config = TrainerConfig::new(4).with_max_steps(Some(200)).with_batch_size(64);
/// for strategy in &strategies {
///     let out = Trainer::new(config.clone()).fit(&init, strategy.as_ref(), &data, &batcher)?;
///     println!("{}: final val loss {:?}", strategy.name(), out.report.final_validation().map(|v| v.global_loss));
/// }
/// # Ok(()) }
/// ```
pub struct Trainer {
    config: TrainerConfig,
    devices: Vec<Device>,
    interrupt: Option<Arc<AtomicBool>>,
}

impl Trainer {
    /// A trainer on Burn's default device.
    pub fn new(config: TrainerConfig) -> Self {
        Trainer {
            config,
            devices: vec![Device::default()],
            interrupt: None,
        }
    }

    /// Stops the run when `flag` turns true (a Ctrl-C handler sets it): every node finishes
    /// the steps any node has started, a checkpoint is written if a folder for one is known
    /// (`checkpoint_dir` or the log folder), and `fit` returns with
    /// [`RunReport::interrupted_at`] set, without the final evaluation.
    pub fn with_interrupt(mut self, flag: Arc<AtomicBool>) -> Self {
        self.interrupt = Some(flag);
        self
    }

    /// Runs rank `r` on `devices[r % devices.len()]` (several nodes may share a device).
    /// Autodiff is enabled on each.
    pub fn with_devices(mut self, devices: Vec<Device>) -> Self {
        self.devices = devices;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// Trains a model built by `init` on every node with `strategy`, reading `data` through
    /// `batcher`.
    ///
    /// Before any node starts, `fit` checks the configuration and the data, builds every
    /// replica (rank 0's from the seed, copied into the others, so all nodes start equal)
    /// and every node's strategy, and makes sure a training forward pass draws nothing from
    /// the backend's shared random generator ([`GymError::SharedRandomness`]): whatever it
    /// refuses is an error of the run's set-up, returned before any step. Nodes then run on a
    /// dedicated pool with one thread per node. The first node to fail aborts the others,
    /// and the error names it and its step ([`GymError::NodeFailed`]).
    pub fn fit<M, I, B>(
        &self,
        init: impl Fn(&Device) -> M + Sync,
        strategy: &dyn StrategyConfig,
        data: &NodeData<I>,
        batcher: &B,
    ) -> Result<FitOutput<M>>
    where
        M: TrainModel,
        I: Send + 'static,
        B: Batcher<I, M::Batch>,
    {
        let fit_start = Instant::now();
        let cfg = &self.config;
        let k = cfg.num_nodes;
        let ranks: Vec<usize> = (0..k).collect();
        let prepared = self.prepare(
            &init, strategy, data, batcher, &ranks, None, true, fit_start,
        )?;
        let Prepared {
            resume,
            devices,
            plan,
            starts,
            facts,
            logs,
            identity,
        } = prepared;

        let group = match &cfg.simulation {
            Some(sim) => InProcessGroup::simulated(k, sim.network.clone()),
            None => InProcessGroup::new(k),
        };
        if let Some(saved) = &resume {
            for (rank, node) in saved.nodes.iter().enumerate() {
                group.restore(rank, node.comm, node.clock);
            }
        }
        let checkpoint_dir = cfg
            .checkpoint_dir
            .as_ref()
            .map(PathBuf::from)
            .or_else(|| facts.log_dir.clone());
        let checkpoints = checkpoint_dir.map(|dir| {
            CheckpointWriter::new(dir, cfg.keep_checkpoints, identity, facts.run_name.clone())
        });
        let stop = StopAgreement::new(self.interrupt.clone());
        let recorder = self.recorder(&plan, cfg.progress, logs);
        if let Some(saved) = resume.as_ref() {
            recorder.restore(
                saved.next_step,
                Records {
                    train: saved.train.clone(),
                    validation: saved.validation.clone(),
                    correlation: saved.correlation.clone(),
                },
                saved
                    .nodes
                    .iter()
                    .map(|n| n.clock.map(|c| c.0).unwrap_or_default())
                    .collect(),
            );
        }
        let shared = NodeShared {
            plan,
            devices: &devices,
            recorder: &recorder,
            one_node_per_process: false,
            batcher,
            checkpoints: checkpoints.as_ref(),
            stop: &stop,
        };
        let slots: Vec<Mutex<Option<NodeStart<M, I>>>> =
            starts.into_iter().map(|s| Mutex::new(Some(s))).collect();
        let current_step: Vec<AtomicUsize> = (0..k).map(|_| AtomicUsize::new(0)).collect();

        let results = group
            .run(|comm| {
                let rank = comm.rank();
                let start = slots[rank]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .expect("each rank runs once");
                let outcome = on_node_pool(rank, cfg.kernel_threads_per_node, || {
                    run_node(rank, start, &shared, comm, &current_step[rank])
                });
                match outcome {
                    Ok(o) => {
                        group.leave(rank);
                        Ok(o)
                    }
                    Err(e) => {
                        group.abort(rank, e.to_string());
                        Err(e)
                    }
                }
            })
            .map_err(|e| GymError::InvalidConfig(format!("cannot start {k} node threads: {e}")))?;
        let results: Vec<Result<NodeOutcome<M>>> = results
            .into_iter()
            .enumerate()
            .map(|(rank, r)| {
                r.unwrap_or_else(|msg| Err(GymError::Panic(msg)))
                    .map_err(|e| GymError::NodeFailed {
                        rank,
                        step: current_step[rank].load(Ordering::SeqCst),
                        source: Box::new(e),
                    })
            })
            .collect();

        // The first failure is the cause; the others are its echoes.
        if let Some((first, _)) = group.abort_info() {
            recorder.abandon();
            let mut errors: Vec<GymError> = results.into_iter().filter_map(|r| r.err()).collect();
            let pos = errors
                .iter()
                .position(|e| matches!(e, GymError::NodeFailed { rank, .. } if *rank == first))
                .unwrap_or(0);
            return Err(errors.swap_remove(pos));
        }
        let loop_s = recorder.loop_seconds();
        let records = recorder.finish()?;
        let (mut model, mut master) = (None, None);
        let mut ends = Vec::with_capacity(k);
        for (rank, r) in results.into_iter().enumerate() {
            let outcome = r?;
            model = model.or(outcome.final_model);
            master = master.or(outcome.master);
            ends.push(NodeEnd {
                comm: group.stats(rank),
                simulated: group.simulated_time(rank),
                data_fingerprint: outcome.data_fingerprint,
                ledger: outcome.ledger,
            });
        }
        let model = model.expect("one node returns the final model");
        let checkpoint = checkpoints
            .as_ref()
            .and_then(CheckpointWriter::last_written);
        let report = facts.report(
            records,
            loop_s,
            ends,
            &shared.plan.faults,
            stop.stopped_at(),
            checkpoint,
        );
        Ok(FitOutput {
            model: model.fork(&devices[0]),
            master: master.map(|m| m.fork(&devices[0])),
            report,
        })
    }

    /// Runs one node of a run whose other nodes run elsewhere, each calling `fit_node` with
    /// its own handle on the same collective: the rank and the world are `collective`'s,
    /// and `num_nodes` must be its world size. The usual case is an MPI job, one process per
    /// node (`MpiCollective`, feature `mpi`, started by `mpirun`).
    ///
    /// Every node builds the same replicas, draws the same data and steps the same strategy
    /// as in [`fit`](Self::fit): with the same seed, the two agree, bit for bit where the
    /// collective reduces in rank order as the in-process group does. After every step the
    /// nodes exchange their reports (uncounted), so every node's [`RunReport`] holds the
    /// whole run; only rank 0 writes the log folder and draws the progress bar. Every node
    /// returns the averaged model, and its own copy of the strategy's master.
    ///
    /// Not yet with a fault schedule, checkpoints, resuming or an interrupt flag:
    /// [`GymError::InvalidConfig`]. A node that fails returns its error
    /// ([`GymError::NodeFailed`]) and the others wait in their next collective: end the
    /// process (under `mpirun`, a non-zero exit ends the job), or abort the job.
    pub fn fit_node<M, I, B, C>(
        &self,
        collective: C,
        init: impl Fn(&Device) -> M + Sync,
        strategy: &dyn StrategyConfig,
        data: &NodeData<I>,
        batcher: &B,
    ) -> Result<FitOutput<M>>
    where
        M: TrainModel,
        I: Send + 'static,
        B: Batcher<I, M::Batch>,
        C: NodeCollective,
    {
        let fit_start = Instant::now();
        let cfg = &self.config;
        let (rank, k) = (collective.rank(), collective.world_size());
        if cfg.num_nodes != k {
            return Err(GymError::InvalidConfig(format!(
                "`num_nodes` is {} but the collective has {k} ranks",
                cfg.num_nodes
            )));
        }
        for (asked, what) in [
            (cfg.faults.is_some(), "a fault schedule"),
            (cfg.resume_from.is_some(), "resuming"),
            (cfg.checkpoint_interval.is_some(), "a checkpoint interval"),
            (self.interrupt.is_some(), "an interrupt flag"),
        ] {
            if asked {
                return Err(GymError::InvalidConfig(format!(
                    "{what} is not supported with one node per process (`fit_node`) yet"
                )));
            }
        }
        cfg.validate()?;
        collective.begin_run(cfg.simulation.as_ref().map(|s| &s.network))?;
        let observer = collective.observer();
        // One name for the run, rank 0's (default names carry the time of day).
        let name = cfg
            .run_name
            .clone()
            .unwrap_or_else(|| default_run_name(&strategy.name(), k));
        let name = observer.broadcast_bytes_in(&observer.world(), name.into_bytes(), 0)?;
        let run_name = String::from_utf8(name)
            .map_err(|_| GymError::InvalidConfig("rank 0's run name is not UTF-8".into()))?;
        let prepared = self.prepare(
            &init,
            strategy,
            data,
            batcher,
            &[rank],
            Some(run_name),
            rank == 0,
            fit_start,
        )?;
        let Prepared {
            devices,
            plan,
            mut starts,
            facts,
            logs,
            ..
        } = prepared;
        let stop = StopAgreement::new(None);
        // Only rank 0 draws the bar, and only it has logs (`prepare` made them there alone).
        let recorder = self.recorder(&plan, cfg.progress && rank == 0, logs);
        let shared = NodeShared {
            plan,
            devices: &devices,
            recorder: &recorder,
            one_node_per_process: true,
            batcher,
            checkpoints: None,
            stop: &stop,
        };
        let start = starts.pop().expect("this node's start");
        let current_step = AtomicUsize::new(0);
        let outcome = on_node_pool(rank, cfg.kernel_threads_per_node, || {
            run_node(rank, start, &shared, collective.clone(), &current_step)
        })
        .map_err(|e| {
            recorder.abandon();
            GymError::NodeFailed {
                rank,
                step: current_step.load(Ordering::SeqCst),
                source: Box::new(e),
            }
        })?;
        let loop_s = recorder.loop_seconds();
        let records = recorder.finish()?;
        let end = NodeEnd {
            comm: collective.stats(),
            simulated: collective.simulated_time(),
            data_fingerprint: outcome.data_fingerprint,
            ledger: outcome.ledger,
        };
        let ends = exchange(&observer, &end, "end")?;
        let report = facts.report(records, loop_s, ends, &shared.plan.faults, None, None);
        let model = outcome
            .final_model
            .expect("every node returns the final model");
        Ok(FitOutput {
            model: model.fork(&devices[0]),
            master: outcome.master.map(|m| m.fork(&devices[0])),
            report,
        })
    }

    /// The recorder of a run planned as `plan`, drawing a bar if `progress`.
    fn recorder(&self, plan: &RunPlan, progress: bool, logs: Option<CsvLogs>) -> Recorder {
        let cfg = &self.config;
        Recorder::new(
            cfg.num_nodes,
            (cfg.batch_size * cfg.num_nodes) as u64,
            plan.max_steps,
            cfg.simulation.is_some(),
            progress,
            logs,
        )
    }

    /// Everything a run started at `fit_start` needs before its nodes start, for the nodes
    /// `ranks` that run here: checks, data views, replicas, strategies, the run's name and
    /// log folder (created when `writes_logs`). `run_name`, when given, overrides the
    /// configured and default names.
    #[allow(clippy::too_many_arguments)]
    fn prepare<M, I, B>(
        &self,
        init: &(impl Fn(&Device) -> M + Sync),
        strategy: &dyn StrategyConfig,
        data: &NodeData<I>,
        batcher: &B,
        ranks: &[usize],
        run_name: Option<String>,
        writes_logs: bool,
        fit_start: Instant,
    ) -> Result<Prepared<M, I>>
    where
        M: TrainModel,
        I: Send + 'static,
        B: Batcher<I, M::Batch>,
    {
        let cfg = &self.config;
        cfg.validate()?;
        if self.devices.is_empty() {
            return Err(GymError::InvalidConfig("no device given".into()));
        }
        let k = cfg.num_nodes;
        let resume = match &cfg.resume_from {
            Some(path) => Some(Checkpoint::load(Path::new(path))?.0),
            None => None,
        };
        let devices: Vec<Device> = (0..k)
            .map(|r| self.devices[r % self.devices.len()].clone().autodiff())
            .collect();

        // Data: every node's view, checked before anything runs (the shortest shard sets
        // the epoch, so every node's is needed).
        let mut views: Vec<_> = (0..k)
            .map(|r| Some(data.node_view(r, k, cfg.shuffle, cfg.seed)))
            .collect();
        let mut steps_per_epoch = usize::MAX;
        for (rank, v) in views.iter().flatten().enumerate() {
            let shard = v.sampler.shard_len();
            if v.train.is_empty() {
                return Err(GymError::Data(format!(
                    "the training dataset of rank {rank} is empty"
                )));
            }
            if shard < cfg.batch_size {
                return Err(GymError::Data(format!(
                    "rank {rank} has {shard} training examples, less than one batch of {}",
                    cfg.batch_size
                )));
            }
            if v.val.is_empty() {
                return Err(GymError::Data(format!(
                    "the validation dataset of rank {rank} is empty"
                )));
            }
            steps_per_epoch = steps_per_epoch.min(shard / cfg.batch_size);
        }

        // Replicas: rank 0's from the seed, the others copied from it. Every `init` draws
        // from the backend's global generator (lazily: `materialize` forces it), so all of
        // them run under the lock, and so does the probe of the model's own randomness.
        let (replicas, init_fingerprint) = {
            let _guard = rng::lock_backend_rng();
            let base = rng::init_seeded(&devices[0], cfg.seed, init);
            let all_float = ParamLayout::all_float(&base);
            let base_state = all_float.flatten(&base);
            // Parameter ids from the seed, the same on every replica: optimizer state, which
            // Burn keys by id, then means the same on every node (a rejoining node takes a
            // peer's) and encodes to the same bytes in every run of this seed.
            let trainable = ParamLayout::trainable(&base);
            let base_ids: Vec<ParamId> = (0..trainable.entries().len())
                .map(|i| ParamId::from(rng::derive_seed(cfg.seed, &[0x5041_5241, i as u64])))
                .collect();
            let mut base = Some(trainable.with_ids(base, &base_ids));
            let mut init_fingerprint = Fingerprint::default();
            for x in base_state
                .to_data()
                .try_into_vec_as::<f32>()
                .map_err(|e| GymError::InvalidConfig(format!("initial parameters: {e:?}")))?
            {
                init_fingerprint.write_u64(u64::from(x.to_bits()));
            }
            let mut replicas = Vec::with_capacity(ranks.len());
            for &rank in ranks {
                if rank == 0
                    && let Some(base) = base.take()
                {
                    replicas.push(base);
                    continue;
                }
                let device = &devices[rank];
                let fresh = init(device);
                if ParamLayout::all_float(&fresh).num_elements() != all_float.num_elements() {
                    return Err(GymError::InvalidConfig(
                        "the model built by `init` differs between calls".into(),
                    ));
                }
                let state = base_state.clone().to_device(&device.clone().inner());
                let loaded = all_float.load(fresh, state);
                replicas.push(trainable.with_ids(loaded, &base_ids));
            }
            let first = views[0].as_ref().expect("rank 0's view");
            let probe_items = (0..cfg.effective_minibatch().min(2))
                .map(|i| get_item(&*first.train, i))
                .collect::<Result<Vec<I>>>()?;
            let probe_batch = batcher.batch(probe_items, &devices[0]);
            if rng::draws_from_backend_generator(&init(&devices[0]), &probe_batch, &devices[0]) {
                return Err(GymError::SharedRandomness);
            }
            (replicas, init_fingerprint.finish())
        };

        let mut plan = cfg.plan(steps_per_epoch, replicas[0].flops_per_example())?;

        // A resumed run: the same configuration, then every replica as it was saved, its
        // parameters under their saved ids (which key the optimizers' saved states).
        let identity = identity::<M>(cfg, &plan, strategy, &ParamLayout::trainable(&replicas[0]));
        let mut replicas = replicas;
        if let Some(saved) = &resume {
            identity.check(&saved.identity)?;
            if saved.nodes.len() != k {
                return Err(GymError::Checkpoint(format!(
                    "it holds {} nodes where this run has {k}",
                    saved.nodes.len()
                )));
            }
            replicas = replicas
                .into_iter()
                .zip(ranks)
                .map(|(model, &rank)| {
                    let node = &saved.nodes[rank];
                    let state = ParamLayout::all_float(&model);
                    if node.model.len() != state.num_elements() {
                        return Err(GymError::Checkpoint(format!(
                            "a node's model holds {} values where this run's has {}",
                            node.model.len(),
                            state.num_elements()
                        )));
                    }
                    let values = Tensor::from_data(
                        TensorData::new(node.model.clone(), [node.model.len()]),
                        &devices[rank].clone().inner(),
                    );
                    let model = state.load(model, values);
                    let ids: Vec<ParamId> =
                        node.param_ids.iter().map(|&id| ParamId::from(id)).collect();
                    Ok(ParamLayout::trainable(&model).with_ids(model, &ids))
                })
                .collect::<Result<Vec<_>>>()?;
            plan.start_step = saved.next_step;
        }

        // Every node's strategy, built before any node starts.
        let num_params = ParamLayout::trainable(&replicas[0]).num_elements();
        let node_speeds: Vec<f64> = (0..k)
            .map(|rank| {
                cfg.simulation
                    .as_ref()
                    .and_then(|sim| sim.node_speed.get(rank).copied())
                    .unwrap_or(1.0)
            })
            .collect();
        let mut starts = Vec::with_capacity(ranks.len());
        for (model, &rank) in replicas.into_iter().zip(ranks) {
            let layout = ParamLayout::trainable(&model);
            let mut node_strategy = strategy.init(&NodeInfo {
                rank,
                world_size: k,
                max_steps: plan.max_steps,
                seed: cfg.seed,
                device: &devices[rank],
                layout: &layout,
                initial_params: layout.flatten(&model),
                node_speeds: &node_speeds,
            })?;
            let saved = resume.as_ref().map(|c| &c.nodes[rank]);
            if let Some(node) = saved {
                node_strategy.load_state(&node.strategy)?;
            }
            starts.push(NodeStart {
                replica: ModelReplica::new(model, layout),
                strategy: node_strategy,
                view: views[rank].take().expect("each rank's view once"),
                resume: saved.map(|n| (n.loader, n.rng)),
                ledger: saved.map(|n| n.ledger).unwrap_or_default(),
            });
        }

        // Logs.
        let run_name = run_name
            .or_else(|| cfg.run_name.clone())
            .or_else(|| resume.as_ref().map(|c| c.run_name.clone()))
            .unwrap_or_else(|| default_run_name(&strategy.name(), k));
        let log_dir: Option<PathBuf> = cfg
            .log_dir
            .as_ref()
            .map(|d| PathBuf::from(d).join(&run_name));
        let logs = match &log_dir {
            Some(dir) if writes_logs => {
                let config_json = serde_json::json!({
                    "run_name": run_name,
                    "trainer": serde_json::to_value(cfg).expect("config serialises"),
                    "max_steps": plan.max_steps,
                    "strategy": { "name": strategy.name(), "config": strategy.to_json() },
                    "model": { "type": std::any::type_name::<M>(), "trainable_parameters": num_params },
                    "devices": devices.iter().map(|d| format!("{d:?}")).collect::<Vec<_>>(),
                });
                let logs = CsvLogs::create(dir, &config_json, cfg.correlation_interval.is_some())?;
                if let Some(schedule) = &cfg.faults {
                    // The faults in effect, random ones as drawn: what the run met.
                    let faults = serde_json::json!({
                        "schedule": schedule.to_string(),
                        "events": plan.faults.events(),
                        "absent_node_steps": plan.faults.absent_node_steps(),
                    });
                    let text = serde_json::to_string_pretty(&faults).expect("faults serialise");
                    let path = dir.join("faults.json");
                    std::fs::write(&path, text).map_err(|e| GymError::io(path, e))?;
                }
                Some(logs)
            }
            _ => None,
        };
        let facts = RunFacts {
            run_name,
            log_dir,
            init_fingerprint,
            steps: plan.max_steps,
            setup_s: fit_start.elapsed().as_secs_f64(),
            fit_start,
        };
        Ok(Prepared {
            resume,
            devices,
            plan,
            starts,
            facts,
            logs,
            identity,
        })
    }
}

/// What [`Trainer::prepare`] builds: everything but the collective and the recorder.
struct Prepared<M, I> {
    resume: Option<Checkpoint>,
    /// Every rank's device (autodiff on).
    devices: Vec<Device>,
    plan: RunPlan,
    /// The nodes that run here, in the order asked for.
    starts: Vec<NodeStart<M, I>>,
    facts: RunFacts,
    logs: Option<CsvLogs>,
    identity: Identity,
}

/// What a node ends a run with that the report needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeEnd {
    comm: CommStats,
    simulated: Option<SimulatedTime>,
    data_fingerprint: u64,
    ledger: NodeLedger,
}

/// What the report says of the run as a whole, known before its nodes start.
struct RunFacts {
    run_name: String,
    log_dir: Option<PathBuf>,
    init_fingerprint: u64,
    steps: usize,
    setup_s: f64,
    fit_start: Instant,
}

impl RunFacts {
    /// The run's report, from the recorder's `records`, every node's end (in rank order)
    /// and how the run ended.
    fn report(
        self,
        records: Records,
        loop_s: f64,
        ends: Vec<NodeEnd>,
        faults: &FaultTimeline,
        interrupted_at: Option<usize>,
        checkpoint: Option<PathBuf>,
    ) -> RunReport {
        let mut data_fingerprint = Fingerprint::default();
        for end in &ends {
            data_fingerprint.write_u64(end.data_fingerprint);
        }
        RunReport {
            run_name: self.run_name,
            log_dir: self.log_dir,
            num_nodes: ends.len(),
            steps: self.steps,
            train: records.train,
            validation: records.validation,
            correlation: records.correlation,
            init_fingerprint: self.init_fingerprint,
            data_fingerprint: data_fingerprint.finish(),
            comm: ends.iter().map(|e| e.comm).collect(),
            simulated: ends.iter().filter_map(|e| e.simulated).collect(),
            setup_s: self.setup_s,
            loop_s,
            wall_s: self.fit_start.elapsed().as_secs_f64(),
            interrupted_at,
            checkpoint,
            elastic: ElasticReport {
                faults: faults.events().to_vec(),
                nodes: ends.iter().map(|e| e.ledger).collect(),
            },
        }
    }
}

/// Runs `work`, node `rank`'s loop, on a pool of `threads` threads of its own (0: on the
/// calling thread's pool). Burn's CPU kernels split work with rayon, in the pool of the
/// calling thread; a node's own small pool keeps that work from spreading over the other
/// nodes' threads (see `kernel_threads_per_node`).
fn on_node_pool<T: Send>(
    rank: usize,
    threads: usize,
    work: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    match threads {
        0 => work(),
        n => match rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(move |_| format!("gym-node-{rank}"))
            .build()
        {
            Ok(pool) => pool.install(work),
            Err(e) => Err(GymError::InvalidConfig(format!(
                "cannot start node threads: {e}"
            ))),
        },
    }
}

/// What a checkpoint of this run must agree on: the strategy and its settings, the model's
/// parameters, and every trainer setting that shapes the run (not where logs go, nor the
/// checkpoints' own settings).
fn identity<M: TrainModel>(
    cfg: &TrainerConfig,
    plan: &RunPlan,
    strategy: &dyn StrategyConfig,
    layout: &ParamLayout,
) -> Identity {
    let mut trainer = serde_json::to_value(cfg).expect("config serialises");
    if let Some(fields) = trainer.as_object_mut() {
        for volatile in [
            "run_name",
            "log_dir",
            "progress",
            "kernel_threads_per_node",
            "checkpoint_interval",
            "checkpoint_dir",
            "keep_checkpoints",
            "resume_from",
        ] {
            fields.remove(volatile);
        }
        fields.insert("max_steps".into(), plan.max_steps.into());
    }
    Identity {
        strategy: strategy.name(),
        strategy_config: strategy.to_json().to_string(),
        model: std::any::type_name::<M>().to_string(),
        parameters: layout
            .entries()
            .iter()
            .map(|e| (e.path.clone(), e.shape.clone()))
            .collect(),
        trainer: trainer.to_string(),
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
