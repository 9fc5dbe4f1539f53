//! What a run does before its nodes start: check the configuration and the data, build
//! every replica and every node's strategy, load a checkpoint to resume from, and make the
//! run's folder. Whatever is refused here is an error of the run's set-up.

use super::checkpoint::{Checkpoint, Identity};
use super::config::{Autocast, TrainerConfig};
use super::data::{NodeData, get_item};
use super::node::NodeStart;
use super::plan::RunPlan;
use super::trainer::{NodeEnd, Trainer};
use crate::comm::faults::FaultTimeline;
use crate::error::{GymError, Result};
use crate::metrics::ledger::ElasticReport;
use crate::metrics::tfevents::hparams_from_json;
use crate::metrics::{
    CsvLogger, Fingerprint, Recorder, Records, RunLogger, RunReport, TensorBoardLogger,
    default_run_name,
};
use crate::model::{TrainModel, cast_params, in_f32};
use crate::state::params::ParamLayout;
use crate::state::rng;
use crate::strategy::replica::ModelReplica;
use crate::strategy::{NodeInfo, StrategyConfig};
use burn::data::dataloader::batcher::Batcher;
use burn::module::ParamId;
use burn::tensor::{Device, Distribution, Tensor, TensorData};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

impl Trainer {
    /// The recorder of a run planned as `plan`, drawing a bar if `progress`.
    /// Its records go to `logs` (the run folder's), then to the trainer's own loggers.
    pub(super) fn recorder(
        &self,
        plan: &RunPlan,
        progress: bool,
        mut logs: Vec<Arc<dyn RunLogger>>,
    ) -> Recorder {
        let cfg = &self.config;
        logs.extend(self.loggers.iter().cloned());
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
    /// `ranks` that run here, resuming from `resume` if given: checks, data views, replicas, strategies, the run's name and
    /// log folder (created when `writes_logs`). `run_name`, when given, overrides the
    /// configured and default names.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prepare<M, I, B>(
        &self,
        init: &(impl Fn(&Device) -> M + Sync),
        strategy: &dyn StrategyConfig,
        resume: Option<Checkpoint>,
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

        // Replicas: the weights drawn from the seed on the host (one start on every
        // backend), then loaded into every node's model. Every `init` draws from a
        // backend's global generator (lazily: `materialize` forces it), so all of them run
        // under the lock, and so does the probe of the model's own randomness.
        let (replicas, init_fingerprint) = {
            let _guard = rng::lock_backend_rng();
            let base = rng::init_seeded(&rng::host_device(&devices[0]), cfg.seed, init);
            let all_float = ParamLayout::all_float(&base);
            let base_state = all_float.flatten(&base);
            drop(base);
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
                let device = &devices[rank];
                let fresh = init(device);
                if ParamLayout::all_float(&fresh).num_elements() != all_float.num_elements() {
                    return Err(GymError::InvalidConfig(
                        "the model built by `init` differs between calls".into(),
                    ));
                }
                let state = base_state.clone().to_device(&device.clone().inner());
                replicas.push(all_float.load(fresh, state));
            }
            // Which parameters train is each one's `require_grad`, which the replicas (on
            // autodiff devices) hold and the host's copy does not.
            let trainable = ParamLayout::trainable(&replicas[0]);
            // Parameter ids from the seed, the same on every replica: optimizer state, which
            // Burn keys by id, then means the same on every node (a rejoining node takes a
            // peer's) and encodes to the same bytes in every run of this seed.
            let base_ids: Vec<ParamId> = (0..trainable.entries().len())
                .map(|i| ParamId::from(rng::derive_seed(cfg.seed, &[0x5041_5241, i as u64])))
                .collect();
            let replicas: Vec<M> = replicas
                .into_iter()
                .map(|replica| trainable.with_ids(replica, &base_ids))
                .collect();
            let first = views[0].as_ref().expect("rank 0's view");
            let probe_items = (0..cfg.effective_minibatch().min(2))
                .map(|i| get_item(&*first.train, i))
                .collect::<Result<Vec<I>>>()?;
            let probe_batch = batcher.batch(probe_items, &devices[0]);
            if draws_from_backend_generator(&init(&devices[0]), &probe_batch, &devices[0]) {
                return Err(GymError::SharedRandomness);
            }
            if let Some(precision) = cfg.autocast {
                check_autocast(&replicas[0], &probe_batch, &devices[0], precision)?;
            }
            (replicas, init_fingerprint.finish())
        };

        // The FLOPs the clock charges: the model's own, or a proxy's 6·N per token.
        let model_flops = replicas[0].flops_per_example();
        let flops_per_example = cfg.simulation.as_ref().map_or(model_flops, |sim| {
            sim.flops_per_example(model_flops, replicas[0].tokens_per_example())
        });
        let mut plan = cfg.plan(steps_per_epoch, flops_per_example)?;
        plan.final_evaluation = self.final_evaluation;
        let mut extended_from = None;
        if let Some(saved) = &resume {
            extended_from = extension(&mut plan, &saved.identity, cfg.faults.is_some())?;
        }

        // A resumed run: the same configuration, then every replica as it was saved, its
        // parameters under their saved ids (which key the optimizers' saved states).
        let identity = identity::<M>(cfg, &plan, strategy, &ParamLayout::trainable(&replicas[0]));
        let mut replicas = replicas;
        if let Some(saved) = &resume {
            // An extension agrees with the checkpoint on everything but the length.
            let mut same_length = identity.clone();
            if let Some(from) = extended_from {
                same_length.trainer = with_length(&identity.trainer, from, plan.schedule_steps);
            }
            same_length.check(&saved.identity)?;
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
                    let here = state.entries().iter().map(|e| (&e.path, &e.shape));
                    let saved = node.model_tensors.iter().map(|(p, s)| (p, s));
                    if let Some((saved, here)) = saved.zip(here).find(|(a, b)| a != b) {
                        return Err(GymError::Checkpoint(format!(
                            "the checkpoint's model tensor `{}` {:?} is `{}` {:?} in this run",
                            saved.0, saved.1, here.0, here.1
                        )));
                    }
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
                max_steps: plan.schedule_steps,
                seed: cfg.seed,
                device: &devices[rank],
                layout: &layout,
                initial_params: layout.flatten(&model),
                node_speeds: &node_speeds,
                faults: cfg.faults.is_some(),
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
        let csv = match &log_dir {
            Some(dir) if writes_logs => {
                let config_json = serde_json::json!({
                    "run_name": run_name,
                    "trainer": serde_json::to_value(cfg).expect("config serialises"),
                    "max_steps": plan.max_steps,
                    "strategy": { "name": strategy.name(), "config": strategy.to_json() },
                    "model": { "type": std::any::type_name::<M>(), "trainable_parameters": num_params },
                    "devices": devices.iter().map(|d| format!("{d:?}")).collect::<Vec<_>>(),
                });
                let logs =
                    CsvLogger::create(dir, &config_json, cfg.correlation_interval.is_some())?;
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
        let tensorboard = match &cfg.tensorboard_dir {
            Some(dir) if writes_logs => {
                let hparams = match &self.hparams {
                    Some(given) => hparams_from_json(given),
                    None => default_hparams(cfg, strategy, plan.max_steps),
                };
                let dir = PathBuf::from(dir).join(&run_name);
                Some(TensorBoardLogger::create(
                    &dir,
                    &hparams,
                    cfg.tensorboard_examples_axis,
                )?)
            }
            _ => None,
        };
        let facts = RunFacts {
            run_name,
            log_dir,
            init_fingerprint,
            steps: plan.max_steps,
            start_step: plan.start_step,
            schedule_steps: (plan.schedule_steps != plan.max_steps).then_some(plan.schedule_steps),
            params: num_params as u64,
            charged_as_params: cfg.simulation.as_ref().and_then(|sim| sim.charge_as),
            setup_s: fit_start.elapsed().as_secs_f64(),
            fit_start,
        };
        Ok(Prepared {
            resume,
            devices,
            plan,
            starts,
            facts,
            logs: [
                csv.map(|l| Arc::new(l) as Arc<dyn RunLogger>),
                tensorboard.map(|l| Arc::new(l) as Arc<dyn RunLogger>),
            ]
            .into_iter()
            .flatten()
            .collect(),
            identity,
        })
    }
}

/// The hyper-parameters of a run whose trainer was given none
/// ([`Trainer::with_hparams`]): the strategy's name and settings (`strategy.inner.lr`),
/// the node count, batch sizes, steps and seed.
fn default_hparams(
    cfg: &TrainerConfig,
    strategy: &dyn StrategyConfig,
    max_steps: usize,
) -> Vec<(String, crate::metrics::tfevents::HParam)> {
    hparams_from_json(&serde_json::json!({
        "strategy": strategy.name(),
        "num_nodes": cfg.num_nodes,
        "batch_size": cfg.batch_size,
        "minibatch_size": cfg.minibatch_size,
        "max_steps": max_steps,
        "seed": cfg.seed,
        "strategy_config": strategy.to_json(),
    }))
}

/// What [`Trainer::prepare`] builds: everything but the collective and the recorder.
pub(super) struct Prepared<M, I> {
    pub resume: Option<Checkpoint>,
    /// Every rank's device (autodiff on).
    pub devices: Vec<Device>,
    pub plan: RunPlan,
    /// The nodes that run here, in the order asked for.
    pub starts: Vec<NodeStart<M, I>>,
    pub facts: RunFacts,
    /// The run folder's loggers (CSV, TensorBoard), on the process that writes them.
    pub logs: Vec<Arc<dyn RunLogger>>,
    pub identity: Identity,
}

/// What the report says of the run as a whole, known before its nodes start.
pub(super) struct RunFacts {
    pub run_name: String,
    pub log_dir: Option<PathBuf>,
    init_fingerprint: u64,
    steps: usize,
    start_step: usize,
    schedule_steps: Option<usize>,
    /// The model's trainable parameters.
    pub params: u64,
    /// The parameter count a proxy is charged as ([`SimulationConfig::charge_as`]).
    ///
    /// [`SimulationConfig::charge_as`]: crate::SimulationConfig::charge_as
    charged_as_params: Option<u64>,
    setup_s: f64,
    fit_start: Instant,
}

impl RunFacts {
    /// The run's report, from the recorder's `records`, every node's end (in rank order)
    /// and how the run ended.
    pub(super) fn report(
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
            start_step: self.start_step,
            schedule_steps: self.schedule_steps,
            params: self.params,
            charged_as_params: self.charged_as_params,
            train: records.train,
            validation: records.validation,
            correlation: records.correlation,
            init_fingerprint: self.init_fingerprint,
            data_fingerprint: data_fingerprint.finish(),
            comm: ends.iter().map(|e| e.comm).collect(),
            observer_comm: ends.iter().map(|e| e.observer).collect(),
            real: ends.iter().map(|e| e.real).collect(),
            simulated: ends.iter().filter_map(|e| e.simulated).collect(),
            first_steps: records.first_steps,
            setup_s: self.setup_s,
            loop_s,
            wall_s: self.fit_start.elapsed().as_secs_f64(),
            interrupted_at,
            checkpoint,
            trace: None,
            elastic: ElasticReport {
                faults: faults.events().to_vec(),
                nodes: ends.iter().map(|e| e.ledger).collect(),
            },
        }
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
            "tensorboard_dir",
            "tensorboard_examples_axis",
            "trace",
            "progress",
            "kernel_threads_per_node",
            "concurrent_nodes",
            "checkpoint_interval",
            "checkpoint_dir",
            "keep_checkpoints",
            "resume_from",
        ] {
            fields.remove(volatile);
        }
        fields.insert("max_steps".into(), plan.max_steps.into());
        if plan.schedule_steps != plan.max_steps {
            fields.insert("schedule_steps".into(), plan.schedule_steps.into());
        }
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

/// A resumed run longer than the checkpoint's run: an extension, whose schedules keep the
/// length they were built for (`plan.schedule_steps`). Returns the checkpoint's length when
/// this run extends it. A shorter run, or an extension under a fault schedule (its faults
/// are drawn for the run's length), is refused.
fn extension(plan: &mut RunPlan, saved: &Identity, faults: bool) -> Result<Option<usize>> {
    let trainer: serde_json::Value = serde_json::from_str(&saved.trainer).unwrap_or_default();
    let Some(saved_steps) = trainer["max_steps"].as_u64().map(|s| s as usize) else {
        return Ok(None);
    };
    let saved_schedule = trainer["schedule_steps"]
        .as_u64()
        .map_or(saved_steps, |s| s as usize);
    if plan.max_steps < saved_steps {
        return Err(GymError::Checkpoint(format!(
            "it was written by a run of {saved_steps} steps and this run has {}: a run can \
             be extended (a larger `max_steps`), not shortened",
            plan.max_steps
        )));
    }
    plan.schedule_steps = saved_schedule;
    if plan.max_steps == saved_steps {
        return Ok(None);
    }
    if faults {
        return Err(GymError::Checkpoint(format!(
            "a run with a fault schedule cannot be extended from {saved_steps} to {} steps: \
             its faults are drawn for its length",
            plan.max_steps
        )));
    }
    Ok(Some(saved_steps))
}

/// The trainer settings `json` of a run of `max_steps` whose schedules span
/// `schedule_steps`, as [`identity`] writes them.
fn with_length(json: &str, max_steps: usize, schedule_steps: usize) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    if let Some(fields) = v.as_object_mut() {
        fields.insert("max_steps".into(), max_steps.into());
        fields.remove("schedule_steps");
        if schedule_steps != max_steps {
            fields.insert("schedule_steps".into(), schedule_steps.into());
        }
    }
    v.to_string()
}

/// Refuses autocast to `precision` on a device without its arithmetic, or for a model
/// whose loss does not run with its parameters in that type (one pass, forward and
/// backward, on `batch`).
fn check_autocast<M: TrainModel>(
    model: &M,
    batch: &M::Batch,
    device: &Device,
    precision: Autocast,
) -> Result<()> {
    let name = precision.name();
    if !device.supports_dtype(precision.dtype()) {
        return Err(GymError::InvalidConfig(format!(
            "autocast {name}: the backend of {device:?} has no {name} arithmetic; run in \
             f32, or on a backend that has it (flex, CUDA, Metal, LibTorch)"
        )));
    }
    let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let loss = in_f32(cast_params(model, precision.dtype()).loss(batch));
        let mut grads = loss.backward();
        ParamLayout::trainable(model).flatten_grads(model, &mut grads)
    }));
    match pass {
        Ok(grads) if grads.dtype() == burn::tensor::DType::F32 => Ok(()),
        Ok(grads) => Err(GymError::InvalidConfig(format!(
            "autocast {name}: the model's gradient came back in {:?}, not f32",
            grads.dtype()
        ))),
        Err(panic) => Err(GymError::InvalidConfig(format!(
            "autocast {name}: the model's loss fails with its parameters in {name} ({}); a \
             model under autocast casts its float inputs to its parameters' type \
             (`gym_core::model::like_params`)",
            crate::error::panic_message(&*panic)
        ))),
    }
}

/// Whether a training forward pass of `model` on `batch` draws from the backend's
/// process-wide generator, as Burn's `Dropout` does (its masks would then depend on how the
/// node threads interleave). Compares a draw after seeding the generator with one after
/// seeding it and running the forward pass. A backend whose generator cannot be re-seeded
/// to the same draws cannot tell, and answers `false`. Call it under
/// [`rng::lock_backend_rng`].
fn draws_from_backend_generator<M: TrainModel>(
    model: &M,
    batch: &M::Batch,
    device: &Device,
) -> bool {
    // Lazy parameters draw on first use: draw them first.
    rng::materialize(model);
    let draw = |forward: bool| {
        device.seed(0x5EED);
        if forward {
            drop(model.loss(batch));
        }
        Tensor::<1>::random([16], Distribution::Default, &device.clone().inner())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap_or_default()
    };
    let plain = draw(false);
    plain == draw(false) && draw(true) != plain
}
