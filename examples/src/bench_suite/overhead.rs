//! Part 1 of the suite, the overhead ratio: seconds per step of K in-process nodes of each
//! [`SuiteModel`] against the compute limit.

use burn::data::dataset::Dataset;
use burn::data::dataset::transform::PartialDataset;
use burn::tensor::Device;
use gym_core::{Autocast, NodeData, RunReport, TrainModel, Trainer, TrainerConfig};
use gym_data::{
    CharCorpus, MnistBatcher, MnistDataset, MnistItem, MnistSplit, TokenBatcher, TokenWindow,
};
use gym_models::{GptConfig, MlpConfig, MnistCnnConfig};
use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};

use super::{SuiteConfig, SuiteModel, SuiteResult, backend_tag, median};
use crate::runner::BoxError;
use crate::tasks::{GptArgs, TextDataset};

/// Examples per node per step of the MNIST models (the original's set-up).
pub(super) const MNIST_BATCH: usize = 64;
/// Sequences per node per step, and their length, of the small GPT (the nanoGPT set-up).
pub(super) const GPT_BATCH: usize = 16;
const GPT_BLOCK: usize = 64;
/// Validation examples kept for the final evaluation `fit` always runs: a few batches, so
/// that evaluating (the whole MNIST test set would take longer than the CNN's timed steps)
/// does not dominate a benchmark that never reads its result.
const VAL_EXAMPLES: usize = 64;

/// The data the overhead runs train on, loaded once.
struct OverheadData {
    mnist: Option<NodeData<MnistItem>>,
    gpt: Option<(NodeData<TokenWindow>, GptConfig)>,
}

fn load_overhead_data(config: &SuiteConfig) -> Result<OverheadData, BoxError> {
    let needs = |m| config.models.contains(&m);
    let mnist = if needs(SuiteModel::Mlp) || needs(SuiteModel::Cnn) {
        Some(mnist_data(config)?)
    } else {
        None
    };
    let gpt = if needs(SuiteModel::Gpt) {
        Some(gpt_data(config, (2, 2, 64), GPT_BLOCK)?)
    } else {
        None
    };
    Ok(OverheadData { mnist, gpt })
}

/// MNIST's training set and the first `VAL_EXAMPLES` test images.
pub(super) fn mnist_data(config: &SuiteConfig) -> Result<NodeData<MnistItem>, BoxError> {
    let dir = gym_data::resolve_data_dir(Some(&config.mnist_dir), "mnist")?;
    let train = MnistDataset::load_or_download(&dir, MnistSplit::Train)?;
    let test = MnistDataset::load_or_download(&dir, MnistSplit::Test)?;
    let n = VAL_EXAMPLES.min(test.len());
    Ok(NodeData::shared(train, PartialDataset::new(test, 0, n)))
}

/// tiny-shakespeare's windows of `block` characters and the `nanogpt` binary's model of
/// `(n_layer, n_head, n_embd)` for them (bias, no dropout), with a shard of the validation
/// windows holding about `VAL_EXAMPLES / 4` of them.
pub(super) fn gpt_data(
    config: &SuiteConfig,
    (n_layer, n_head, n_embd): (usize, usize, usize),
    block: usize,
) -> Result<(NodeData<TokenWindow>, GptConfig), BoxError> {
    let dir = gym_data::resolve_data_dir(Some(&config.gpt_dir), "shakespeare")?;
    let corpus = CharCorpus::load_or_download(&dir)?;
    let args = GptArgs {
        dataset: TextDataset::Shakespeare,
        text_file: None,
        tokenizer: None,
        val_fraction: 0.1,
        start_pc: None,
        end_pc: None,
        val_start_pc: None,
        val_end_pc: None,
        block_size: block,
        model_size: "small".into(),
        n_layer: Some(n_layer),
        n_head: Some(n_head),
        n_embd: Some(n_embd),
        dropout: 0.0,
        no_bias: false,
        shard: false,
    };
    let gpt_config = args.model_config(corpus.vocab().len());
    gpt_config.validate()?;
    let (train, val) = corpus.split(block, args.val_fraction)?;
    let shards = (val.tokens().len() / (block * VAL_EXAMPLES / 4)).max(1);
    let val = val.shard(0, shards)?;
    Ok((NodeData::shared(train, val), gpt_config))
}

/// How the suite times training steps: `k` nodes on `device`, `batch_size` examples per
/// node and step, DiLoCo synchronising every `sync_interval` steps, in f32 or under
/// `autocast`, and two runs, of `warmup` steps (none at 0) and of `warmup + steps`: what
/// start-up, model initialisation and the first steps cost is in both and cancels.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepTiming<'a> {
    pub(super) device: &'a Device,
    pub(super) k: usize,
    pub(super) batch_size: usize,
    pub(super) warmup: usize,
    pub(super) steps: usize,
    /// `None`: beyond the last step, so that every timed step is local compute and the
    /// inner optimizer, and nodes never wait for each other.
    pub(super) sync_interval: Option<usize>,
    pub(super) autocast: Option<Autocast>,
}

/// One run of a [`StepTiming`]: the process's CPU seconds over it and what it measured.
struct TimedRun {
    cpu_s: f64,
    report: RunReport,
}

/// CPU and wall seconds per node-step ([`TimedRuns::per_node_step`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct PerNodeStep {
    pub(super) cpu_s: f64,
    pub(super) wall_s: f64,
}

/// The two runs of a [`StepTiming`] (the warm-up's `None` without warm-up steps).
pub(super) struct TimedRuns {
    warm: Option<TimedRun>,
    whole: TimedRun,
    k: usize,
    steps: usize,
}

impl StepTiming<'_> {
    /// The two runs of the model `init` builds, on `data`.
    pub(super) fn runs<M, I, B>(
        &self,
        init: impl Fn(&Device) -> M + Sync,
        data: &NodeData<I>,
        batcher: &B,
    ) -> Result<TimedRuns, BoxError>
    where
        M: TrainModel,
        I: Send + 'static,
        B: burn::data::dataloader::batcher::Batcher<I, M::Batch>,
    {
        let total = self.warmup + self.steps;
        let strategy = DiLoCoConfig::new().with_communicator(
            DiLoCoCommunicatorConfig::new()
                .with_sync_interval(self.sync_interval.unwrap_or(total + 1)),
        );
        let run = |max_steps: usize| -> Result<TimedRun, BoxError> {
            let trainer_config = TrainerConfig::new(self.k)
                .with_max_steps(Some(max_steps))
                .with_batch_size(self.batch_size)
                .with_val_size(Some(0))
                .with_autocast(self.autocast);
            let cpu = process_cpu_s();
            let report = Trainer::new(trainer_config)
                .with_devices(vec![self.device.clone()])
                .fit(&init, &strategy, data, batcher)?
                .report;
            Ok(TimedRun {
                cpu_s: process_cpu_s() - cpu,
                report,
            })
        };
        let warm = match self.warmup {
            0 => None,
            w => Some(run(w)?),
        };
        Ok(TimedRuns {
            warm,
            whole: run(total)?,
            k: self.k,
            steps: self.steps,
        })
    }

    /// [`runs`](Self::runs) of the GPT `gpt` on the text `tokens`.
    pub(super) fn gpt_runs(
        &self,
        gpt: &GptConfig,
        tokens: &NodeData<TokenWindow>,
    ) -> Result<TimedRuns, BoxError> {
        self.runs(
            |d| gpt.init(d).expect("validated configuration"),
            tokens,
            &TokenBatcher,
        )
    }
}

impl TimedRuns {
    /// Seconds per step of the K-node run in steady state: (loop seconds of the run of
    /// `warmup + steps` steps − loop seconds of the run of `warmup` steps) ÷ `steps`.
    ///
    /// Why two runs rather than the per-step records of one: without synchronisation the
    /// node threads drift apart, and a step's record is emitted when its slowest node
    /// finishes it, so at the end of the warm-up the faster nodes are already steps ahead and
    /// the last records miss their work (16 GPT nodes timed over 5 steps came out at 0.97 of
    /// the compute limit, over 20 steps at 1.86). Each run's loop starts every node together
    /// and ends when the last one finishes, so the difference holds exactly `steps` steps of
    /// every node. Should noise make it non-positive (steps of a few milliseconds), the mean
    /// of the last `steps` records stands in.
    pub(super) fn seconds_per_step(&self) -> Result<f64, BoxError> {
        let (k, steps) = (self.k, self.steps);
        let warm_s = self.warm.as_ref().map_or(0.0, |w| w.report.loop_s);
        let report = &self.whole.report;
        let timed = &report.train[report.train.len().saturating_sub(steps)..];
        if timed.is_empty() {
            return Err(format!("a {k}-node run recorded no steps").into());
        }
        let difference = (report.loop_s - warm_s) / steps as f64;
        Ok(if difference > 0.0 {
            difference
        } else {
            timed.iter().map(|r| r.step_time_s).sum::<f64>() / timed.len() as f64
        })
    }

    /// The process's CPU seconds and the loop's wall seconds of the `steps` timed steps
    /// (the difference of the runs), each ÷ K × `steps` node-steps.
    pub(super) fn per_node_step(&self) -> PerNodeStep {
        let (warm_cpu, warm_wall) = self
            .warm
            .as_ref()
            .map_or((0.0, 0.0), |w| (w.cpu_s, w.report.loop_s));
        let node_steps = (self.k * self.steps) as f64;
        PerNodeStep {
            cpu_s: (self.whole.cpu_s - warm_cpu) / node_steps,
            wall_s: (self.whole.report.loop_s - warm_wall) / node_steps,
        }
    }
}

/// The CPU time of this process so far (user and system, every thread), in seconds.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage writes the struct it is given and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(usage.ru_utime) + s(usage.ru_stime)
}

/// Seconds per step of `model` on `k` nodes ([`StepTiming`]), in f32 or under `autocast`.
fn time_model(
    model: SuiteModel,
    k: usize,
    config: &SuiteConfig,
    data: &OverheadData,
    autocast: Option<Autocast>,
) -> Result<f64, BoxError> {
    let device = Device::default();
    let timing = StepTiming {
        device: &device,
        k,
        batch_size: match model {
            SuiteModel::Gpt => GPT_BATCH,
            SuiteModel::Mlp | SuiteModel::Cnn => MNIST_BATCH,
        },
        warmup: config.warmup_steps,
        steps: config.steps_for(model),
        sync_interval: None,
        autocast,
    };
    let runs = match (model, data) {
        (
            SuiteModel::Mlp,
            OverheadData {
                mnist: Some(mnist), ..
            },
        ) => timing.runs(|d| MlpConfig::new().init(d), mnist, &MnistBatcher)?,
        (
            SuiteModel::Cnn,
            OverheadData {
                mnist: Some(mnist), ..
            },
        ) => timing.runs(|d| MnistCnnConfig::new().init(d), mnist, &MnistBatcher)?,
        (
            SuiteModel::Gpt,
            OverheadData {
                gpt: Some((tokens, gpt)),
                ..
            },
        ) => timing.gpt_runs(gpt, tokens)?,
        _ => unreachable!("the data of every configured model is loaded"),
    };
    runs.seconds_per_step()
}

/// Part 1b: one node's seconds per step in f32 and under `--autocast bf16`, timed in
/// alternation. A backend without bf16 arithmetic gets a row that says so.
pub(super) fn precision(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let data = load_overhead_data(config)?;
    let tag = backend_tag();
    let mut rows = vec![
        "| model | f32 ms/step | bf16 ms/step | bf16 ÷ f32 |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    for &model in &config.models {
        let name = model.name();
        eprintln!("precision: {name}, f32 and bf16 …");
        let (mut f32_s, mut bf16_s) = (Vec::new(), Vec::new());
        let mut refused = None;
        for _ in 0..config.repeats.max(1) {
            f32_s.push(time_model(model, 1, config, &data, None)?);
            match time_model(model, 1, config, &data, Some(Autocast::Bf16)) {
                Ok(s) => bf16_s.push(s),
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        let f32_ms = median(f32_s) * 1e3;
        out.figures
            .insert(format!("f32_step_ms_{name}_{tag}"), f32_ms);
        match refused {
            Some(why) => rows.push(format!("| {name} | {f32_ms:.2} | refused: {why} | - |")),
            None => {
                let bf16_ms = median(bf16_s) * 1e3;
                out.figures
                    .insert(format!("bf16_step_ms_{name}_{tag}"), bf16_ms);
                out.figures
                    .insert(format!("bf16_vs_f32_{name}_{tag}"), bf16_ms / f32_ms);
                rows.push(format!(
                    "| {name} | {f32_ms:.2} | {bf16_ms:.2} | {:.3} |",
                    bf16_ms / f32_ms
                ));
            }
        }
    }
    let note = format!(
        "One node's seconds per step, as in the overhead ratio (K = 1, the same models, \
         batches and timing), in f32 and under `--autocast bf16` (forward and backward in \
         bf16 on a bf16 copy of the model, f32 master weights and optimizer), alternated, \
         the median of {} each; backend {tag}.",
        config.repeats.max(1)
    );
    out.push_table("Precision", &config.command, &note, rows);
    Ok(())
}

pub(super) fn overhead(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let data = load_overhead_data(config)?;
    let cores = out.machine.cores;
    let tag = backend_tag();
    let mut rows = vec![
        "| model | K | ms/step (K nodes) | compute limit ms/step | overhead ratio | \
         independent runs ratio | overhead ÷ independent | node-steps/s |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for &model in &config.models {
        let steps = config.steps_for(model);
        let name = model.name();
        for k in config.ks_for(model) {
            eprintln!("overhead: {name} on {k} node(s), {steps} timed steps …");
            let time_once = |k| time_model(model, k, config, &data, None);
            // Each timing of K nodes is paired with a one-node timing just before it, and
            // the ratio is the median of the pairs' ratios: this machine's speed drifts by
            // 10–30% over minutes (one node's GPT step 4.8–7.1 ms in runs a minute apart), so
            // a baseline timed once at the start would carry that drift into every ratio.
            // Between the two, min(K, cores) independent one-node trainings run at once:
            // what the cores lose to each other (shared cache, memory) with no simulator
            // between the nodes, the floor under the overhead ratio.
            let mut timings = Vec::new();
            for _ in 0..config.repeats.max(1) {
                let one = time_once(1)?;
                let independent = match k {
                    1 => one,
                    _ => {
                        independent_runs(k.min(cores), &|| time_once(1).map_err(|e| e.to_string()))?
                    }
                };
                let seconds = if k == 1 { one } else { time_once(k)? };
                timings.push((one, independent, seconds));
            }
            let per_core = |one: f64| one * k as f64 / k.min(cores) as f64;
            let seconds = median(timings.iter().map(|t| t.2).collect());
            let one = median(timings.iter().map(|t| t.0).collect());
            let ratio = median(timings.iter().map(|&(o, _, s)| s / per_core(o)).collect());
            let independent = median(timings.iter().map(|&(o, i, _)| i / o).collect());
            let beyond = median(timings.iter().map(|&(_, i, s)| s / per_core(i)).collect());
            let limit = per_core(one);
            out.figures
                .insert(format!("step_ms_{name}_k{k}"), seconds * 1e3);
            out.figures
                .insert(format!("overhead_ratio_{name}_k{k}"), ratio);
            if k > 1 {
                out.figures
                    .insert(format!("independent_runs_ratio_{name}_k{k}"), independent);
                out.figures
                    .insert(format!("overhead_vs_independent_{name}_k{k}"), beyond);
            }
            if k == 1 && model != SuiteModel::Mlp {
                out.figures
                    .insert(format!("{name}_step_ms_{tag}"), seconds * 1e3);
            }
            let (independent, beyond) = match k {
                1 => ("—".to_string(), "—".to_string()),
                _ => (format!("{independent:.3}"), format!("{beyond:.3}")),
            };
            rows.push(format!(
                "| {name} | {k} | {:.2} | {:.2} | {ratio:.3} | {independent} | {beyond} | {:.1} |",
                seconds * 1e3,
                limit * 1e3,
                k as f64 / seconds
            ));
        }
    }
    let note = format!(
        "Overhead ratio = wall seconds per step of K nodes ÷ (one node's seconds per step at \
         K = 1 × K ÷ min(K, {cores} cores)), each K-node timing paired with a one-node timing \
         just before it, the median of the pairs' ratios (the compute limit column: the \
         median one-node timing × K ÷ min(K, cores)); 1.0 is the compute limit. Independent \
         runs ratio = seconds per step of one node while min(K, cores) separate one-node \
         trainings run at once (no collective, no shared permits) ÷ one node alone, timed \
         between the two: what the cores lose to each other. Overhead ÷ independent = the K \
         nodes against those independent runs, the simulator's own share. Strategy: DiLoCo with \
         H larger than the steps run, so the timed steps are each node's forward/backward and \
         inner AdamW step only (no communication): the excess over 1 is the interference \
         between node threads. Seconds per step = (loop time of a run of W + N steps − \
         loop time of a run of W steps) ÷ N, N = {} (CNN {}, GPT {}), W = {} warm-up \
         step(s): both runs start every node together and end when the last finishes, so \
         node threads drifting apart do not bias it; the median of {} such timings; CNN up to K = {}; MLP and CNN batch {MNIST_BATCH} per node, GPT 2 layers × 2 heads × 64 dims, \
         context {GPT_BLOCK}, {GPT_BATCH} sequences per node; backend {tag}, one kernel \
         thread per node.",
        config.mlp_steps,
        config.cnn_steps,
        config.gpt_steps,
        config.warmup_steps,
        config.repeats.max(1),
        config.max_k.min(config.cnn_max_k)
    );
    out.push_table("Overhead ratio", &config.command, &note, rows);
    Ok(())
}

/// The median seconds per step of `copies` one-node trainings (`time_one`) run at once, each
/// on a thread of its own, started together.
fn independent_runs(
    copies: usize,
    time_one: &(dyn Fn() -> Result<f64, String> + Sync),
) -> Result<f64, BoxError> {
    let timings: Vec<Result<f64, String>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..copies).map(|_| s.spawn(time_one)).collect();
        runs.into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|_| Err("a timing run panicked".into()))
            })
            .collect()
    });
    Ok(median(
        timings.into_iter().collect::<Result<Vec<f64>, String>>()?,
    ))
}
