//! The per-node loop (spec §2.4–2.6): evaluate, accumulate gradients over minibatches, let
//! the strategy step, report metrics; at the end, evaluate and average the replicas.

use super::checkpoint::{CheckpointWriter, NodeCheckpoint, StopAgreement};
use super::config::NonFinitePolicy;
use super::data::{NodeLoader, NodeView, get_item, validation_indices};
use super::plan::RunPlan;
use super::rejoin;
use crate::comm::faults::FaultTimeline;
use crate::comm::real_clock::{self, RealKind, RealSpan, RealTime, not_own_work};
use crate::comm::{Collective, ReduceOp};
use crate::error::{GymError, Result};
use crate::metrics::ledger::NodeLedger;
use crate::metrics::{EvalKind, NodeStep, Recorder, Report, Reporter, mean_pairwise_correlation};
use crate::model::{EvalMetrics, TrainModel, cast_params, in_f32};
use crate::rng;
use crate::state::params::ParamLayout;
use crate::strategy::replica::ModelReplica;
use crate::strategy::{StepContext, Strategy};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::{Device, Tensor, TensorData};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// What every node of a run shares (read-only).
pub(crate) struct NodeShared<'a, B> {
    pub plan: RunPlan,
    pub devices: &'a [Device],
    pub recorder: &'a Recorder,
    /// Whether the run's nodes are spread over several processes, each with its own
    /// recorder (an MPI job): reports are then exchanged between the nodes, and every node
    /// returns the averaged model and its master.
    pub spans_processes: bool,
    /// The rank whose exchanged reports go into this process's recorder (one per process,
    /// so that each report is recorded once).
    pub feeds_recorder: usize,
    pub batcher: &'a B,
    pub checkpoints: Option<&'a CheckpointWriter>,
    pub stop: &'a StopAgreement,
    /// While the run records a trace: how many real-time spans each node keeps.
    pub real_spans: Option<usize>,
}

/// A resumed node's data position (epoch, cursor, fingerprint) and random stream.
pub(crate) type ResumePoint = ((usize, usize, u64), ([u8; 32], u64, u128));

/// What one node starts from, built by the trainer.
pub(crate) struct NodeStart<M, I> {
    pub replica: ModelReplica<M>,
    pub strategy: Box<dyn Strategy>,
    pub view: NodeView<I>,
    /// Where a resumed node's data loader and random stream were.
    pub resume: Option<ResumePoint>,
    /// The work faults have cost this node so far (a resumed node's, or nothing).
    pub ledger: NodeLedger,
}

/// What a node hands back.
pub(crate) struct NodeOutcome<M> {
    /// The averaged final model, from the rank that evaluated it.
    pub final_model: Option<M>,
    /// Rank 0's strategy master parameters loaded into a copy of its model, if any.
    pub master: Option<M>,
    /// A hash of the training indices this node drew.
    pub data_fingerprint: u64,
    /// The work faults cost this node.
    pub ledger: NodeLedger,
    /// Its real time in the loop, and the spans of it a trace draws.
    pub real: (RealTime, Vec<RealSpan>),
}

/// Runs node `rank` to the end. `current_step` tells the trainer where a failure happened.
pub(crate) fn run_node<M, I, B>(
    rank: usize,
    start: NodeStart<M, I>,
    shared: &NodeShared<'_, B>,
    comm: Collective,
    current_step: &AtomicUsize,
) -> Result<NodeOutcome<M>>
where
    M: TrainModel,
    B: Batcher<I, M::Batch>,
{
    let NodeStart {
        mut replica,
        mut strategy,
        view,
        resume,
        mut ledger,
    } = start;
    let plan = &shared.plan;
    let device = &shared.devices[rank];
    rng::seed_node(plan.seed, rank);
    let layout = replica.layout().clone();
    let reports = if shared.spans_processes {
        Reporter::exchanged(shared.recorder, rank == shared.feeds_recorder)
    } else {
        Reporter::direct(shared.recorder)
    };
    let eval = Evaluator {
        rank,
        comm: comm.observer(),
        faults: &plan.faults,
        val: &*view.val,
        minibatch: plan.minibatch,
        batcher: shared.batcher,
        device: device.clone().inner(),
        reports: &reports,
        every_rank_keeps_the_average: shared.spans_processes,
    };
    let subset = validation_indices(view.val.len(), Some(plan.val_size), plan.seed);
    let mut loader = NodeLoader::new(view.train, view.sampler);
    if let Some((position, stream)) = resume {
        loader.seek(position)?;
        rng::restore_node_rng(stream);
    }

    let mut step = plan.start_step;
    // Each step's end, as the seconds since the loop started.
    let loop_start = Instant::now();
    real_clock::start_node(shared.real_spans);
    let interrupted = loop {
        // Between two steps: stop here if interrupted, checkpoint if one is due.
        let stopping = step < plan.max_steps && shared.stop.stops_before(step);
        let failed = shared.stop.failed();
        if let Some(writer) = shared.checkpoints
            && (plan.checkpoints_before(step) || (stopping && step > plan.start_step && !failed))
        {
            let node = snapshot(&mut replica, &*strategy, &loader, &comm, ledger)?;
            let deposited = not_own_work(RealKind::Simulator, "checkpoint", || {
                writer.deposit(rank, step, node, || shared.recorder.snapshot(step))
            });
            match deposited {
                // A checkpoint that cannot be written stops every node at the next step
                // boundary; the previous checkpoint stays, and the report holds the steps
                // done. Spread over processes, the others could not agree: it fails.
                Err(e) if !shared.spans_processes => shared.stop.fail(e),
                other => other?,
            }
        }
        if stopping || step == plan.max_steps {
            break stopping;
        }
        current_step.store(step, Ordering::SeqCst);
        comm.begin_step(step);
        // Nodes leave and come back between steps, as the fault timeline says.
        let faults = &plan.faults;
        let changes = !faults.is_empty() && step > 0;
        if changes && faults.departures(step).contains(&rank) {
            ledger.discard();
        }
        let rejoins = if changes {
            faults.rejoins(step)
        } else {
            Vec::new()
        };
        for rejoin in rejoins {
            if rejoin.source == Some(rank) || rejoin.ranks.contains(&rank) {
                rejoin::rejoin(
                    rank,
                    &rejoin,
                    &mut replica,
                    &mut *strategy,
                    &mut ledger,
                    &comm,
                    device,
                )?;
            }
        }
        if plan.evaluates_before(step) {
            let evaluate = || eval.evaluate(step, replica.model(), &layout, &subset);
            not_own_work(RealKind::Simulator, "evaluation", evaluate)?;
        }
        if plan.measures_compute() {
            // This machine's time is the simulated compute: the node's own work from here
            // on (reading data, forward and backward, the strategy's) is charged as it is
            // done, at this step's speed.
            comm.measure_own_work(plan.step_compute_s(rank, step, 1.0));
        }
        let present = faults.is_present(rank, step);
        let view;
        let collective = if faults.is_empty() {
            &comm
        } else {
            view = comm.with_present(faults.members(rank, step));
            &view
        };
        let computed = if present && strategy.computes(step) {
            let mut work = compute_gradient(&mut replica, &layout, &mut loader, shared, device)?;
            if let Some(simulated) = plan.step_compute_s(rank, step, work.compute_s) {
                if !plan.measures_compute() {
                    comm.compute(simulated);
                }
                work.simulated_s = simulated;
            }
            Some(work)
        } else {
            None
        };
        let fault = computed.as_ref().and_then(nonfinite);
        let skip = match plan.on_nonfinite {
            NonFinitePolicy::Stop => match fault {
                Some(error) => return Err(error),
                None => false,
            },
            // Every node must skip the same steps, so they agree on it (uncounted; a node
            // that is away takes part in the agreement, as the simulator's, not the
            // cluster's).
            NonFinitePolicy::Skip => {
                let flag = Tensor::<1>::from_data(
                    TensorData::new(vec![u8::from(fault.is_some()) as f32], [1]),
                    &device.clone().inner(),
                );
                eval.comm
                    .all_reduce(flag, ReduceOp::Sum)?
                    .into_scalar::<f32>()
                    > 0.0
            }
        };
        let mut ctx = StepContext {
            rank,
            world_size: plan.num_nodes,
            step,
            max_steps: plan.max_steps,
            replica: &mut replica,
            collective,
            layout: &layout,
        };
        let strategy_start = Instant::now();
        let (loss, compute_s) = match computed {
            Some(work) if skip => (Some(work.loss), work.compute_s),
            Some(work) => {
                let compute_before = comm.simulated_time().map_or(0.0, |t| t.compute_s);
                strategy.step(work.grads, &mut ctx)?;
                let compute_after = comm.simulated_time().map_or(0.0, |t| t.compute_s);
                let undone = (compute_before - compute_after).max(0.0);
                ledger.computed(&mut *strategy, work.simulated_s, undone);
                (Some(work.loss), work.compute_s)
            }
            None if skip || !present => (None, 0.0),
            None => {
                strategy.idle(&mut ctx)?;
                (None, 0.0)
            }
        };
        // Measured, the rest of the step's own work is charged before it ends.
        comm.charge_own_work();
        if !present {
            ledger.absent_steps += 1;
        }
        let strategy_s = strategy_start.elapsed().as_secs_f64();
        replica.flush();
        reports.report(Report::Train {
            rank,
            step,
            node: NodeStep {
                loss,
                skipped: skip,
                lr: strategy.lr(),
                comm: comm.stats(),
                compute_s,
                strategy_s,
                ended_s: loop_start.elapsed().as_secs_f64(),
                simulated: comm.simulated_time(),
            },
        });
        // The records a checkpoint before the next step holds must all be in.
        let checkpoint_next = plan.checkpoints_before(step + 1);
        let report = || reports.step_done(step, &eval.comm, checkpoint_next);
        not_own_work(RealKind::Simulator, "reports", report)?;
        if plan.correlates_after(step) {
            let measure = || correlate(rank, step, replica.model(), &eval.comm, plan, &reports);
            not_own_work(RealKind::Simulator, "correlation", measure)?;
        }
        step += 1;
    };
    current_step.store(step, Ordering::SeqCst);
    comm.measure_own_work(None);
    let real = real_clock::finish_node();
    let model = replica.into_model();
    // The master of the first node still present at the end.
    let last = plan.max_steps - 1;
    let first_present = (0..plan.num_nodes).find(|&r| plan.faults.is_present(r, last));
    let master = match strategy.master_params() {
        // Every process returns the first present node's master, whose values may differ
        // from other nodes' (eager DiLoCo applies each node's own outer gradient at once).
        Some(flat) if shared.spans_processes => {
            let root = first_present.unwrap_or(0);
            let flat = eval.comm.broadcast(flat, root)?;
            Some(layout.load(model.clone(), flat))
        }
        Some(flat) if Some(rank) == first_present => Some(layout.load(model.clone(), flat)),
        _ => None,
    };
    // An interrupted run skips the final evaluation: rank 0's replica stands for the model.
    let final_model = if interrupted || !plan.final_evaluation {
        (rank == 0).then_some(model)
    } else {
        eval.finish(plan.max_steps, model)?
    };
    reports.flush(&eval.comm)?;
    Ok(NodeOutcome {
        final_model,
        master,
        data_fingerprint: loader.fingerprint(),
        ledger,
        real,
    })
}

/// Everything a node carries into its next step, for a checkpoint.
fn snapshot<M: TrainModel, I>(
    replica: &mut ModelReplica<M>,
    strategy: &dyn Strategy,
    loader: &NodeLoader<I>,
    comm: &Collective,
    ledger: NodeLedger,
) -> Result<NodeCheckpoint> {
    let model = replica.model();
    let layout = ParamLayout::all_float(model);
    let model_tensors = layout
        .entries()
        .iter()
        .map(|e| (e.path.clone(), e.shape.clone()))
        .collect();
    let model_values = layout
        .flatten(model)
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| GymError::Checkpoint(format!("model values: {e:?}")))?;
    let state = strategy
        .save_state()
        .map_err(|e| GymError::Checkpoint(format!("strategy state: {e}")))?;
    Ok(NodeCheckpoint {
        model: model_values,
        model_tensors,
        param_ids: replica
            .layout()
            .entries()
            .iter()
            .map(|e| e.id.val())
            .collect(),
        strategy: state,
        loader: loader.position(),
        rng: rng::node_rng_state(),
        comm: comm.stats(),
        clock: comm.clock_state(),
        ledger,
    })
}

/// What is wrong with a step's loss or gradient, if anything.
fn nonfinite(step: &NodeGradient) -> Option<GymError> {
    if !step.loss.is_finite() {
        return Some(GymError::NonFiniteLoss { loss: step.loss });
    }
    let sum = step.grad_sum;
    (!sum.is_finite()).then_some(GymError::NonFiniteGradient { sum })
}

/// One node's work of one step.
struct NodeGradient {
    /// The flat gradient, averaged over the gradient-accumulation minibatches.
    grads: Tensor<1>,
    /// The mean loss over the minibatches (NaN or infinite if one was).
    loss: f64,
    /// The sum of the gradient's elements: not finite if any element is not.
    grad_sum: f64,
    /// Wall seconds it took.
    compute_s: f64,
    /// Simulated seconds it took (0 when time is not simulated).
    simulated_s: f64,
}

/// This node's gradient for one step. The minibatches' losses and the gradient's sum come
/// to the host in one read at the end, so the device is waited for once per step.
fn compute_gradient<M, I, B>(
    replica: &mut ModelReplica<M>,
    layout: &ParamLayout,
    loader: &mut NodeLoader<I>,
    shared: &NodeShared<'_, B>,
    device: &Device,
) -> Result<NodeGradient>
where
    M: TrainModel,
    B: Batcher<I, M::Batch>,
{
    let plan = &shared.plan;
    let compute_start = Instant::now();
    let model = replica.model();
    let mut grads: Option<Tensor<1>> = None;
    let mut losses = Vec::with_capacity(plan.accumulation + 1);
    for _ in 0..plan.accumulation {
        let batch = shared
            .batcher
            .batch(loader.next_items(plan.minibatch)?, device);
        // Under autocast the pass runs on a lower-precision copy, cast anew each pass (a
        // graph is consumed by its backward pass); the gradient lands on `model`, in f32.
        let loss = match plan.autocast {
            None => model.loss(&batch),
            Some(precision) => in_f32(cast_params(model, precision.dtype()).loss(&batch)),
        };
        losses.push(loss.clone().inner().reshape([1]));
        let mut backward = loss.backward();
        let g = layout.flatten_grads(model, &mut backward);
        grads = Some(match grads {
            None => g,
            Some(acc) => acc + g,
        });
    }
    let mut grads = grads.expect("at least one minibatch");
    if plan.accumulation > 1 {
        grads = grads.div_scalar(plan.accumulation as f64);
    }
    losses.push(grads.clone().sum().reshape([1]));
    let read = Tensor::cat(losses, 0)
        .into_data()
        .try_into_vec_as::<f64>()
        .map_err(|e| GymError::Data(format!("loss values: {e:?}")))?;
    let (grad_sum, losses) = read.split_last().expect("the gradient's sum");
    // Summed in minibatch order, in f64, as each had been read one by one.
    let loss = losses.iter().sum::<f64>() / plan.accumulation as f64;
    Ok(NodeGradient {
        grads,
        loss,
        grad_sum: *grad_sum,
        compute_s: compute_start.elapsed().as_secs_f64(),
        simulated_s: 0.0,
    })
}

/// Gathers every replica's float tensors (through the observer, so the measurement is not
/// counted as traffic) and lets rank 0 record the mean pairwise correlation of the replicas
/// present after `step`.
fn correlate<M: TrainModel>(
    rank: usize,
    step: usize,
    model: &M,
    observer: &Collective,
    plan: &RunPlan,
    reports: &Reporter<'_>,
) -> Result<()> {
    let replicas = observer.all_gather(ParamLayout::all_float(model).flatten(model))?;
    if rank == 0 {
        let host = replicas
            .into_iter()
            .enumerate()
            .filter(|(r, _)| plan.faults.is_present(*r, step))
            .map(|(_, t)| {
                t.into_data()
                    .try_into_vec_as::<f32>()
                    .map_err(|e| GymError::Data(format!("replica values: {e:?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        if host.len() >= 2 {
            reports.report(Report::Correlation {
                steps: step + 1,
                correlation: mean_pairwise_correlation(&host),
            });
        }
    }
    Ok(())
}

/// Evaluates rank 0's replica (local) and the average of all replicas (global), as the
/// original does: every node takes part in the averaging; rank 0 evaluates its own model
/// while rank 1 evaluates the average. Traffic goes through an observer handle, so it is
/// not counted as the strategy's communication.
struct Evaluator<'a, I, B> {
    rank: usize,
    comm: Collective,
    faults: &'a FaultTimeline,
    val: &'a dyn Dataset<I>,
    minibatch: usize,
    batcher: &'a B,
    device: Device,
    reports: &'a Reporter<'a>,
    /// Whether every rank returns the averaged final model (each process runs one node),
    /// not only the rank that evaluated it.
    every_rank_keeps_the_average: bool,
}

impl<I, B> Evaluator<'_, I, B> {
    /// Reports an evaluation of `kind` at `step`.
    fn report(&self, step: usize, kind: EvalKind, metrics: EvalMetrics, examples: usize) {
        self.reports.report(Report::Eval {
            step,
            kind,
            metrics,
            examples,
        });
    }

    fn global_rank(&self) -> usize {
        1 % self.comm.world_size()
    }

    /// The element-wise mean of the float tensors `state` of the replicas present at
    /// `step` (every node takes part; one away contributes zeros).
    fn present_mean(&self, step: usize, state: Tensor<1>) -> Result<Tensor<1>> {
        let k = self.comm.world_size();
        let present = (0..k).filter(|&r| self.faults.is_present(r, step)).count();
        let mine = if self.faults.is_present(self.rank, step) {
            state
        } else {
            state.zeros_like()
        };
        let sum = self.comm.all_reduce(mine, ReduceOp::Sum)?;
        Ok(sum.div_scalar(present.max(1) as f64))
    }

    fn evaluate<M>(
        &self,
        step: usize,
        model: &M,
        layout: &ParamLayout,
        indices: &[usize],
    ) -> Result<()>
    where
        M: TrainModel,
        B: Batcher<I, M::Batch>,
    {
        let k = self.comm.world_size();
        let average = if k > 1 {
            Some(self.present_mean(step, layout.flatten(model))?)
        } else {
            None
        };
        if self.rank == 0 {
            let local = self.metrics(&model.valid(), indices)?;
            self.report(step, EvalKind::Local, local, indices.len());
            if k == 1 {
                self.report(step, EvalKind::Global, local, indices.len());
            }
        }
        if let Some(average) = average
            && self.rank == self.global_rank()
        {
            let global = self.metrics(&layout.load(model.valid(), average), indices)?;
            self.report(step, EvalKind::Global, global, indices.len());
        }
        Ok(())
    }

    /// The final evaluation, over the whole validation set. The global model is the
    /// element-wise average of every float tensor of the replicas (parameters and buffers),
    /// which is also the model `fit` returns.
    fn finish<M>(&self, step: usize, model: M) -> Result<Option<M>>
    where
        M: TrainModel,
        B: Batcher<I, M::Batch>,
    {
        let k = self.comm.world_size();
        let all = validation_indices(self.val.len(), None, 0);
        let state = ParamLayout::all_float(&model);
        let average = if k > 1 {
            Some(self.present_mean(step - 1, state.flatten(&model))?)
        } else {
            None
        };
        if self.rank == 0 {
            let local = self.metrics(&model.valid(), &all)?;
            self.report(step, EvalKind::Local, local, all.len());
            if k == 1 {
                self.report(step, EvalKind::Global, local, all.len());
                return Ok(Some(model));
            }
        }
        match average {
            Some(average) if self.rank == self.global_rank() => {
                let averaged = state.load(model, average);
                let global = self.metrics(&averaged.valid(), &all)?;
                self.report(step, EvalKind::Global, global, all.len());
                Ok(Some(averaged))
            }
            Some(average) if self.every_rank_keeps_the_average => {
                Ok(Some(state.load(model, average)))
            }
            _ => Ok(None),
        }
    }

    /// Mean loss and accuracy of `model` over `indices`, weighted by batch size.
    fn metrics<M>(&self, model: &M, indices: &[usize]) -> Result<EvalMetrics>
    where
        M: TrainModel,
        B: Batcher<I, M::Batch>,
    {
        let (mut loss, mut acc, mut n, mut has_acc) = (0.0, 0.0, 0usize, true);
        for chunk in indices.chunks(self.minibatch) {
            let items = chunk
                .iter()
                .map(|&i| get_item(self.val, i))
                .collect::<Result<Vec<I>>>()?;
            let m = model.evaluate(&self.batcher.batch(items, &self.device));
            let w = chunk.len() as f64;
            loss += m.loss * w;
            match m.accuracy {
                Some(a) => acc += a * w,
                None => has_acc = false,
            }
            n += chunk.len();
        }
        let n = n.max(1) as f64;
        Ok(EvalMetrics {
            loss: loss / n,
            accuracy: has_acc.then_some(acc / n),
        })
    }
}
