//! [`Trainer`]: runs the nodes of a run, each on a thread of its own, over a transport,
//! and collects the final model and what the run measured. What happens before the nodes
//! start is in `prepare`; what each node does, in `node`.

use super::checkpoint::{Checkpoint, CheckpointWriter, StopAgreement};
use super::config::TrainerConfig;
use super::data::NodeData;
use super::node::{NodeShared, NodeStart, run_node};
use super::prepare::Prepared;
use crate::comm::SimulationConfig;
use crate::comm::clock::SimulatedTime;
use crate::comm::cost::CommStats;
use crate::comm::real_clock::{RealSpan, RealTime};
use crate::comm::trace::{NodeTimeline, TimelineRecord};
use crate::comm::transport::{ThreadTransport, Transport};
use crate::comm::{Collective, ComputeSlots, run_on_threads};
use crate::error::{GymError, Result};
use crate::metrics::RunLogger;
use crate::metrics::ledger::NodeLedger;
use crate::metrics::trace::{MAX_TRACE_EVENTS, Trace};
use crate::metrics::{Records, RunReport, default_run_name, exchange};
use crate::model::TrainModel;
use crate::strategy::StrategyConfig;
use burn::data::dataloader::batcher::Batcher;
use burn::tensor::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    pub(super) config: TrainerConfig,
    pub(super) devices: Vec<Device>,
    pub(super) interrupt: Option<Arc<AtomicBool>>,
    /// Whether runs end with an evaluation on the whole validation set.
    pub(super) final_evaluation: bool,
    /// The hyper-parameters a run's TensorBoard events record ([`Self::with_hparams`]).
    pub(super) hparams: Option<serde_json::Value>,
    /// Where the records also go ([`Self::with_logger`]).
    pub(super) loggers: Vec<Arc<dyn RunLogger>>,
}

impl Trainer {
    /// A trainer on Burn's default device.
    pub fn new(config: TrainerConfig) -> Self {
        Trainer {
            config,
            devices: vec![Device::default()],
            interrupt: None,
            final_evaluation: true,
            hparams: None,
            loggers: Vec::new(),
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

    /// Records `hparams` as the run's hyper-parameters in its TensorBoard events (with
    /// [`TrainerConfig::tensorboard_dir`]): a JSON object whose members are flattened into
    /// named scalars ([`hparams_from_json`](crate::metrics::tfevents::hparams_from_json)), as
    /// the example binaries give their flags. Without it, a run records its strategy's name
    /// and settings, node count, batch sizes, steps and seed.
    pub fn with_hparams(mut self, hparams: serde_json::Value) -> Self {
        self.hparams = Some(hparams);
        self
    }

    /// Hands every step's record, with each node's simulated seconds of the step, every
    /// evaluation and every correlation to `logger` as the run completes them, after the
    /// run folder's CSV and TensorBoard logs: a [`JsonLinesLogger`](crate::metrics::JsonLinesLogger),
    /// a live dashboard, or a logger of one's own. Each call adds one.
    pub fn with_logger(mut self, logger: Arc<dyn RunLogger>) -> Self {
        self.loggers.push(logger);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// Trains a model built by `init` on every node with `strategy`, reading `data` through
    /// `batcher`: every node a thread of this process ([`ThreadTransport`]).
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
        let transport = Arc::new(ThreadTransport::new(self.config.num_nodes));
        self.fit_with(transport, init, strategy, data, batcher)
    }

    /// [`fit`](Self::fit) over `transport`: this process runs the nodes of
    /// [`Transport::local_ranks`], each on a thread of its own, and the transport joins
    /// them to the nodes of the other processes, if any (the `MpiTransport` of feature
    /// `mpi`: an MPI job, several nodes per process). `num_nodes` must be the transport's
    /// world size.
    ///
    /// Every process builds the same replicas, draws the same data and steps the same
    /// strategy: with the same seed the run gives the same bits whatever the transport and
    /// however the nodes are spread over processes. With nodes in other processes, the
    /// nodes exchange their reports every few steps (about every two seconds, and at the
    /// end; uncounted), so every process's
    /// [`RunReport`] holds the whole run; only the process of rank 0 writes the log folder
    /// and draws the progress bar, and every process returns the averaged model. Each
    /// process writes its own shard of a checkpoint; a run resumes from the shards under
    /// any number of processes (see [`Checkpoint`](super::checkpoint::Checkpoint)). Fault
    /// schedules and interrupts need every node in this process
    /// ([`GymError::InvalidConfig`] otherwise).
    pub fn fit_with<M, I, B>(
        &self,
        transport: Arc<dyn Transport>,
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
        if transport.world_size() != k {
            return Err(GymError::InvalidConfig(format!(
                "`num_nodes` is {k} but the transport has {} ranks",
                transport.world_size()
            )));
        }
        let spans = transport.spans_processes();
        if spans {
            for (asked, what) in [
                (cfg.faults.is_some(), "a fault schedule"),
                (self.interrupt.is_some(), "an interrupt flag"),
            ] {
                if asked {
                    return Err(GymError::InvalidConfig(format!(
                        "{what} needs every node in one process; this run spreads its nodes \
                         over several"
                    )));
                }
            }
        }
        cfg.validate()?;
        if let Some(dir) = &cfg.checkpoint_dir {
            super::checkpoint::check_writable(Path::new(dir))?;
        }
        let local = transport.local_ranks();
        let ranks: Vec<usize> = local.clone().collect();
        let network = cfg.simulation.as_ref().map(|s| s.network.clone());
        let nodes: Vec<Collective> = ranks
            .iter()
            .map(|&rank| Collective::new(transport.clone(), rank, network.clone()))
            .collect();
        let resume = match &cfg.resume_from {
            Some(path) => Some(Checkpoint::load(Path::new(path))?.0),
            None => None,
        };
        // One name for the run, rank 0's (default names carry the time of day), and one
        // step to resume from.
        let run_name = if spans {
            let start = RunStart {
                name: cfg
                    .run_name
                    .clone()
                    .or_else(|| resume.as_ref().map(|c| c.run_name.clone()))
                    .unwrap_or_else(|| default_run_name(&strategy.name(), k)),
                resume_step: resume.as_ref().map(|c| c.next_step),
            };
            let agreed = run_on_threads(&nodes, |c| {
                exchange(&c.observer(), &start, "run start").map(|mut all| all.swap_remove(0))
            })
            .map_err(|e| GymError::InvalidConfig(format!("cannot start node threads: {e}")))?
            .into_iter()
            .next()
            .expect("a local node")
            .map_err(GymError::Panic)??;
            if agreed.resume_step != start.resume_step {
                return Err(GymError::Checkpoint(format!(
                    "this process resumes from step {:?} where rank 0's resumes from step \
                     {:?}: the processes see different checkpoint files",
                    start.resume_step, agreed.resume_step
                )));
            }
            Some(agreed.name)
        } else {
            None
        };
        let writes_logs = local.contains(&0);
        let Prepared {
            resume,
            devices,
            plan,
            starts,
            facts,
            logs,
            identity,
        } = self.prepare(
            &init,
            strategy,
            resume,
            data,
            batcher,
            &ranks,
            run_name,
            writes_logs,
            fit_start,
        )?;
        // A proxy charged as a bigger model scales every training payload, once the model's
        // own parameter count is known.
        let scale = cfg
            .simulation
            .as_ref()
            .and_then(|s| s.payload_scale(facts.params));
        let nodes: Vec<Collective> = match scale {
            Some(scale) => nodes.iter().map(|c| c.with_payload_scale(scale)).collect(),
            None => nodes,
        };
        if let Some(saved) = &resume {
            for node in &nodes {
                let rank = node.rank();
                node.restore(saved.nodes[rank].comm, saved.nodes[rank].clock);
            }
        }
        if cfg.trace {
            let budget = (MAX_TRACE_EVENTS / k).max(16);
            for node in &nodes {
                node.start_trace(budget);
            }
        }
        let trace = TraceTarget {
            dir: facts.log_dir.clone().filter(|_| cfg.trace),
            simulation: cfg.simulation.as_ref(),
            strategy: strategy.name(),
            run_name: facts.run_name.clone(),
            start_step: plan.start_step,
        };
        let checkpoint_dir = cfg
            .checkpoint_dir
            .as_ref()
            .map(PathBuf::from)
            .or_else(|| facts.log_dir.clone());
        let checkpoints = checkpoint_dir.map(|dir| {
            let keep = cfg.keep_checkpoints;
            let name = facts.run_name.clone();
            CheckpointWriter::new(dir, keep, identity, name, local.clone(), k)
        });
        let stop = StopAgreement::new(self.interrupt.clone());
        let recorder = self.recorder(&plan, cfg.progress && writes_logs, logs);
        if let Some(saved) = resume.as_ref() {
            recorder.restore(
                saved.next_step,
                Records {
                    train: saved.train.clone(),
                    validation: saved.validation.clone(),
                    correlation: saved.correlation.clone(),
                    first_steps: Vec::new(),
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
            spans_processes: spans,
            feeds_recorder: local.start,
            batcher,
            checkpoints: checkpoints.as_ref(),
            stop: &stop,
            real_spans: cfg.trace.then_some((MAX_TRACE_EVENTS / k).max(16)),
        };
        let slots: Vec<Mutex<Option<NodeStart<M, I>>>> =
            starts.into_iter().map(|s| Mutex::new(Some(s))).collect();
        let current_step: Vec<AtomicUsize> = ranks.iter().map(|_| AtomicUsize::new(0)).collect();

        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let compute_slots = cfg
            .concurrent_nodes
            .or_else(|| ComputeSlots::for_run(nodes.len(), cfg.kernel_threads_per_node, cores))
            .map(ComputeSlots::new);
        let results = run_on_threads(&nodes, |comm| {
            let rank = comm.rank();
            let slot = rank - local.start;
            let start = slots[slot]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("each rank runs once");
            let outcome = on_node_pool(rank, cfg.kernel_threads_per_node, || {
                // On the thread that computes and waits (the node's pool, if it has one).
                let _permit = compute_slots.as_ref().map(|s| s.hold());
                let mut outcome =
                    run_node(rank, start, &shared, comm.clone(), &current_step[slot])?;
                let (real, real_spans) = std::mem::take(&mut outcome.real);
                let end = NodeEnd {
                    comm: comm.stats(),
                    observer: comm.observer_stats(),
                    real,
                    // The node's timelines travel with its end, so that a run spread over
                    // processes writes one trace of every node.
                    timeline: comm.take_trace().map(|sim| NodeTimelines {
                        simulated: sim.to_record(),
                        real: real_spans,
                    }),
                    simulated: comm.simulated_time(),
                    data_fingerprint: outcome.data_fingerprint,
                    ledger: outcome.ledger,
                };
                // With nodes elsewhere, every node learns every node's end.
                let ends = if spans {
                    exchange(&comm.observer(), &end, "end")?
                } else {
                    vec![end]
                };
                Ok((outcome, ends))
            });
            match &outcome {
                Ok(_) => transport.leave(rank),
                Err(e) => transport.abort(rank, e.to_string()),
            }
            outcome
        })
        .map_err(|e| GymError::InvalidConfig(format!("cannot start {k} node threads: {e}")))?;
        let results: Vec<Result<_>> = results
            .into_iter()
            .zip(&ranks)
            .map(|(r, &rank)| {
                r.unwrap_or_else(|msg| Err(GymError::Panic(msg)))
                    .map_err(|e| GymError::NodeFailed {
                        rank,
                        step: current_step[rank - local.start].load(Ordering::SeqCst),
                        source: Box::new(e),
                    })
            })
            .collect();

        // The first failure is the cause; the others are its echoes.
        if let Some((first, _)) = transport.abort_info() {
            recorder.abandon();
            let mut errors: Vec<GymError> = results.into_iter().filter_map(|r| r.err()).collect();
            let pos = errors
                .iter()
                .position(|e| matches!(e, GymError::NodeFailed { rank, .. } if *rank == first))
                .unwrap_or(0);
            let error = errors.swap_remove(pos);
            // The timeline up to the failure, marked as such (its own failure second).
            let failed = [("failed", error.to_string().into())];
            let clocks: Vec<SimulatedTime> = (nodes.iter())
                .map(|n| n.simulated_time().unwrap_or_default())
                .collect();
            let timelines = (nodes.iter())
                .filter_map(Collective::take_trace)
                .map(|sim| (sim, RealTime::default(), Vec::new()))
                .collect();
            let _ = trace.write(timelines, &clocks, None, &failed);
            return Err(error);
        }
        let loop_s = recorder.loop_seconds();
        let records = recorder.finish()?;
        let (mut model, mut master) = (None, None);
        let mut ends = Vec::with_capacity(k);
        for result in results {
            let (outcome, node_ends) = result?;
            model = model.or(outcome.final_model);
            master = master.or(outcome.master);
            if spans {
                ends = node_ends;
            } else {
                ends.extend(node_ends);
            }
        }
        let model = model.expect("one node returns the final model");
        let timelines: Vec<Timelines> = (ends.iter_mut())
            .filter_map(|e| Some((e.timeline.take()?, e.real)))
            .map(|(t, real)| (NodeTimeline::from_record(t.simulated), real, t.real))
            .collect();
        let checkpoint = checkpoints
            .as_ref()
            .and_then(CheckpointWriter::last_written);
        let mut report = facts.report(
            records,
            loop_s,
            ends,
            &shared.plan.faults,
            stop.stopped_at(),
            checkpoint,
        );
        let failure = stop.take_failure();
        let mut ended = Vec::new();
        if let Some(step) = report.interrupted_at {
            ended.push(("interrupted_at_step", step.into()));
        }
        if let Some(cause) = &failure {
            ended.push(("failed", cause.to_string().into()));
        }
        let clocks = report.simulated.clone();
        report.trace = trace.write(timelines, &clocks, Some(&report), &ended)?;
        if let Some(cause) = failure {
            return Err(GymError::Stopped {
                step: report.steps_done(),
                source: Box::new(cause),
                report: Box::new(report),
            });
        }
        Ok(FitOutput {
            model: model.fork(&devices[0]),
            master: master.map(|m| m.fork(&devices[0])),
            report,
        })
    }
}

/// What every process of a spread run agrees on before its nodes start.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunStart {
    name: String,
    resume_step: Option<usize>,
}

/// Where and how a run writes its timeline.
struct TraceTarget<'a> {
    /// The run's folder, when the run records a trace.
    dir: Option<PathBuf>,
    simulation: Option<&'a SimulationConfig>,
    strategy: String,
    run_name: String,
    start_step: usize,
}

impl TraceTarget<'_> {
    /// Writes `trace.json` from the nodes' timelines (simulated and real, in rank order)
    /// and their clocks at the end, with the loss of `report` and `ended` (how the run
    /// ended) in its metadata; returns its path.
    fn write(
        &self,
        timelines: Vec<Timelines>,
        clocks: &[SimulatedTime],
        report: Option<&RunReport>,
        ended: &[(&str, serde_json::Value)],
    ) -> Result<Option<PathBuf>> {
        let (Some(dir), Some(simulation)) = (&self.dir, self.simulation) else {
            return Ok(None);
        };
        let (simulated, real): (Vec<_>, Vec<_>) = (timelines.into_iter())
            .map(|(sim, time, spans)| (sim, (time, spans)))
            .unzip();
        let mut trace = Trace::new(simulated, clocks, simulation)
            .with_real(real)
            .with_meta("source", "training".into())
            .with_meta("run_name", self.run_name.clone().into())
            .with_meta("strategy", self.strategy.clone().into());
        if let Some(report) = report {
            trace = trace
                .with_records(&report.train, &report.validation)
                .with_meta("steps", report.steps.into());
        }
        if self.start_step > 0 {
            // Each node's tracks start where the checkpoint left its clock.
            trace = trace.with_meta("resumed_at_step", self.start_step.into());
        }
        for (key, value) in ended {
            trace = trace.with_meta(key, value.clone());
        }
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        let path = dir.join("trace.json");
        trace.write(&path)?;
        Ok(Some(path))
    }
}

/// A node's timelines for its trace: simulated, and its real time with its spans.
type Timelines = (NodeTimeline, RealTime, Vec<RealSpan>);

/// A node's recorded timelines: the simulated clock's, and the real one's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct NodeTimelines {
    pub simulated: TimelineRecord,
    pub real: Vec<RealSpan>,
}

/// What a node ends a run with that the report needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct NodeEnd {
    pub comm: CommStats,
    /// The simulator's own traffic (evaluations, reports), up to the end.
    #[serde(default)]
    pub observer: CommStats,
    /// Its real time in the loop.
    #[serde(default)]
    pub real: RealTime,
    /// While the run records a trace: the node's timelines.
    #[serde(default)]
    pub timeline: Option<NodeTimelines>,
    pub simulated: Option<SimulatedTime>,
    pub data_fingerprint: u64,
    pub ledger: NodeLedger,
}

/// Runs `work`, node `rank`'s loop, on a pool of `threads` threads of its own (0: on the
/// calling thread, whose kernels then use rayon's global pool). Burn's CPU kernels split
/// work with rayon, in the pool of the calling thread; a node's own small pool keeps that
/// work from spreading over the other nodes (see `kernel_threads_per_node`).
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
