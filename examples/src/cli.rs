//! The flag vocabulary every example binary shares (kebab-case, as clap users expect), so
//! scripts can drive any of them the same way; and run configurations read from TOML or
//! JSON files (`--config FILE`), which name the same flags.

use burn::optim::{
    AdaGradConfig, AdafactorConfig, AdanConfig, AdjustLrFn, LambConfig, LionConfig, MuonConfig,
    RmsPropConfig,
};
use clap::{Args, FromArgMatches, Parser, ValueEnum};
use gym_core::faults::{FaultSchedule, FaultTimeline};
use gym_core::{
    ComputeModel, GymError, InnerOptimizerConfig, LrScheduleConfig, Network, NonFinitePolicy,
    OptimizerConfig, OptimizerGroup, ParamSelection, QuorumRule, SimulationConfig, StrategyConfig,
    Topology, TrainerConfig,
};
use gym_strategies::compress::PowerSgdCompressionConfig;
use gym_strategies::{
    Aggregation, AllReduceConfig, AsyncDiLoCoConfig, AveragingCommunicatorConfig,
    CompressionConfig, DeMoConfig, DesLocConfig, DiLoCoCommunicatorConfig, DiLoCoConfig,
    FedAvgConfig, FragmentPattern, IndexSelectorKind, MuLoCoConfig, NoLoCoCommunicatorConfig,
    NoLoCoConfig, PowerSgdConfig, SparseCommunicatorConfig, SparseLoCoConfig, SpartaConfig,
    SpartaDiLoCoConfig, StreamingDiLoCoConfig, muloco_communicator, muon_for_matrices,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The strategies the examples can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyName {
    /// Gradients averaged every step (PyTorch DDP).
    Allreduce,
    /// H local steps, then an outer Nesterov step on the averaged replicas.
    Diloco,
    /// Replicas averaged every H steps, optionally within random islands.
    Fedavg,
    /// A fraction p of the parameters averaged every step.
    Sparta,
    /// SPARTA every --sparta-sync-interval steps plus DiLoCo every H steps.
    SpartaDiloco,
    /// DeMo: top-k DCT coefficients of a local gradient buffer, sign step (lr: --lr).
    Demo,
    /// Streaming DiLoCo: DiLoCo by fragments, staggered, overlapped by --overlap steps,
    /// outer gradients in 4 bits.
    StreamingDiloco,
    /// SparseLoCo: DiLoCo whose outer gradients travel as top-k + 2-bit codes with error
    /// feedback.
    Sparseloco,
    /// MuLoCo: DiLoCo with Muon as the inner optimizer, 2-bit outer gradients.
    Muloco,
    /// DES-LOC: parameters and Adam's two moments averaged on their own periods.
    Desloc,
    /// NoLoCo: no all-reduce; each sync averages within random groups of --group-size.
    Noloco,
    /// Asynchronous DiLoCo: slower nodes take fewer local steps, Delayed Nesterov.
    AsyncDiloco,
    /// PowerSGD: data-parallel with rank-r compressed gradients.
    Powersgd,
}

impl StrategyName {
    /// The name as written on the command line, e.g. `sparta-diloco`.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyName::Allreduce => "allreduce",
            StrategyName::Diloco => "diloco",
            StrategyName::Fedavg => "fedavg",
            StrategyName::Sparta => "sparta",
            StrategyName::SpartaDiloco => "sparta-diloco",
            StrategyName::Demo => "demo",
            StrategyName::StreamingDiloco => "streaming-diloco",
            StrategyName::Sparseloco => "sparseloco",
            StrategyName::Muloco => "muloco",
            StrategyName::Desloc => "desloc",
            StrategyName::Noloco => "noloco",
            StrategyName::AsyncDiloco => "async-diloco",
            StrategyName::Powersgd => "powersgd",
        }
    }

    /// Whether the strategy has a synchronisation interval that `-H` sets.
    pub fn has_sync_interval(self) -> bool {
        !matches!(
            self,
            StrategyName::Allreduce
                | StrategyName::Sparta
                | StrategyName::Demo
                | StrategyName::Powersgd
        )
    }

    /// Whether the strategy synchronises through DiLoCo's communicator, whose outer step can
    /// proceed with a quorum of the nodes (`--min-quorum`, `--fastest`).
    pub fn has_quorum(self) -> bool {
        matches!(
            self,
            StrategyName::Diloco | StrategyName::SpartaDiloco | StrategyName::Muloco
        )
    }
}

/// The strategies that take the quorum flags, as a user writes them.
const QUORUM_STRATEGIES: &str = "diloco, sparta-diloco and muloco";

/// How the nodes of a run communicate (`--collective`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveKind {
    /// Every node a thread of this process (`gym_core::InProcessGroup`).
    InProcess,
    /// One node per process of an MPI job (`gym_core::MpiCollective`).
    Mpi,
}

/// SPARTA's index selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectorName {
    /// Each element with probability p.
    Random,
    /// Chunks of one fixed permutation, in turn.
    ShuffledSequential,
    /// Parts of a balanced random partition, in turn.
    Partitioned,
}

/// Streaming DiLoCo's fragment patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FragmentPatternName {
    /// Contiguous runs of whole parameters, balanced in size.
    Sequential,
    /// Parameter i in fragment i mod F.
    Strided,
}

/// How a sparse code's contributions are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AggregationName {
    /// Divided by the number of nodes.
    Nodes,
    /// Per position, divided by the number of nodes that sent it.
    Senders,
}

/// What a NaN or infinite loss or gradient does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NonFiniteName {
    /// The run fails, naming the node and the step.
    Stop,
    /// The step is skipped on every node and counted in summary.json.
    Skip,
}

/// The inner optimizers the examples can run: Burn's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerName {
    /// AdamW (PyTorch's defaults: ε 1e-8, weight decay 0.01).
    Adamw,
    /// Adam (PyTorch's defaults: ε 1e-8).
    Adam,
    /// SGD, no momentum.
    Sgd,
    /// Muon for the 2-D weights (its update scaled to AdamW's RMS, so one lr serves both),
    /// AdamW for the other parameters.
    Muon,
    /// Lion (Burn's defaults: betas 0.9/0.99).
    Lion,
    /// Adan (Burn's defaults).
    Adan,
    /// LAMB (Burn's defaults).
    Lamb,
    /// RMSprop (Burn's defaults: α 0.99, momentum 0.9).
    Rmsprop,
    /// AdaGrad (Burn's defaults).
    Adagrad,
    /// Adafactor (Burn's defaults: relative step sizes).
    Adafactor,
}

/// Flags shared by every example.
#[derive(Debug, Clone, Args, Serialize)]
pub struct CommonArgs {
    /// Read flags from a TOML or JSON file (keys are flag names: `num_nodes = 4`); flags on
    /// the command line override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Distributed training strategy.
    #[arg(long, value_enum, default_value = "allreduce")]
    pub strategy: StrategyName,
    /// Number of simulated nodes (K).
    #[arg(long, default_value_t = 4)]
    pub num_nodes: usize,
    /// Optimizer steps; overrides --epochs.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Epochs over each node's shard when --max-steps is not given.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Examples per node per step.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Examples per forward pass (gradient accumulation); default: the whole batch.
    #[arg(long)]
    pub minibatch_size: Option<usize>,
    /// Inner optimizer.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerName,
    /// Learning rate of the inner optimizer (DeMo: of its sign step).
    #[arg(long, default_value_t = 3e-4)]
    pub lr: f64,
    /// Weight decay of the inner optimizer (default: the optimizer's own, 0.01 for AdamW;
    /// DeMo: decoupled, default 0).
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// Cosine decay to 10% of the lr after the warmup.
    #[arg(long)]
    pub cosine: bool,
    /// Clip gradients to this global L2 norm.
    #[arg(long)]
    pub max_norm: Option<f64>,
    /// Folder holding the dataset files (default: $GYM_DATA_DIR/DATASET or a user cache,
    /// downloaded if missing).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Seed of everything random.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Name of the run's log folder (default: STRATEGY-nK-UTCTIME).
    #[arg(long)]
    pub run_name: Option<String>,
    /// Folder for run logs.
    #[arg(long, default_value = "logs")]
    pub log_dir: PathBuf,
    /// Validation examples per intermediate evaluation (0: none; the final one uses all).
    #[arg(long, default_value_t = 512)]
    pub val_size: usize,
    /// Steps between evaluations.
    #[arg(long, default_value_t = 50)]
    pub val_interval: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// What a NaN or infinite loss or gradient does.
    #[arg(long, value_enum, default_value = "stop")]
    pub on_nonfinite: NonFiniteName,
    /// Write a checkpoint every this many steps and at the end (Ctrl-C always writes one).
    #[arg(long)]
    pub checkpoint_interval: Option<usize>,
    /// Where checkpoints go (default: the run's folder).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoints kept; older ones are deleted.
    #[arg(long, default_value_t = 2)]
    pub keep_checkpoints: usize,
    /// Continue the run saved in this checkpoint, or the newest checkpoint of this run
    /// folder, with the same flags it was started with.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
    /// Log the mean pairwise correlation of the replicas every this many steps (K ≥ 2).
    #[arg(long)]
    pub correlation_interval: Option<usize>,
    /// Threads each node's tensor kernels may use (0: share all node threads).
    #[arg(long, default_value_t = 1)]
    pub kernel_threads_per_node: usize,
    /// Devices to spread the nodes over, comma-separated: rank r runs on entry r mod the
    /// count (the original's rule). Entries: default, flex, ndarray, cuda:N, wgpu:N,
    /// vulkan:N, metal:N, tch, tch-cuda:N (each needs its backend's feature). Default: the
    /// backend's default device for every node.
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// How the nodes communicate: `in-process` (every node a thread of this process) or
    /// `mpi` (one node per process of an MPI job, started as `mpirun -np K <binary>
    /// --collective mpi …` with K = --num-nodes; needs the `mpi` feature). Under MPI, rank
    /// 0 writes the logs and the summary.
    #[arg(long, value_enum, default_value = "in-process")]
    pub collective: CollectiveKind,
    /// With `--collective mpi`: a rank that waits this many seconds in one collective
    /// (a peer hung) exits with status 70, which ends the job.
    #[arg(long, default_value_t = 600.0, value_name = "SECONDS")]
    pub mpi_timeout: f64,
    /// Simulate time on this network: datacenter, cross-region, wan, internet,
    /// BANDWIDTH:LATENCY (1gbit:10ms) or UP/DOWN:LATENCY (100mbit/1gbit:40ms); several,
    /// comma-separated, give one link per node.
    #[arg(long, value_parser = checked::<Network>)]
    pub network: Option<String>,
    /// How the nodes are connected: switch (default), relay, or islands:SIZE:WAN
    /// (islands:4:internet).
    #[arg(long, value_parser = checked::<Topology>)]
    pub topology: Option<String>,
    /// Each node's compute for simulated time: cpu (default; this machine), h100, a100,
    /// effective TFLOPS (50), or measured (the wall time here, not reproducible).
    #[arg(long, value_parser = checked::<ComputeModel>)]
    pub node_tflops: Option<String>,
    /// Per-node speed factors, comma-separated (1,1,0.5,1): node r's step takes 1/speed of
    /// the time.
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_speed: Vec<f64>,
    /// σ of every node's step-time jitter: lognormal with mean 1, drawn from the seed.
    #[arg(long)]
    pub jitter: Option<f64>,
    /// Report the simulated time until the averaged model's validation loss first reaches
    /// this value (time to target; needs --network).
    #[arg(long)]
    pub target_loss: Option<f64>,
    /// Faults to inject, from a file or a spec of entries separated by `;`: crash:RANK@STEP
    /// (gone for good), leave:RANK@STEP+STEPS (away, then back),
    /// slow:RANK@STEP+STEPSxFACTOR (computes at FACTOR of its speed),
    /// cut:ISLAND-ISLAND@STEP+STEPS (a wide-area link down; needs --topology islands), and
    /// random:RATE/h (failures per node-hour of simulated compute; needs --network), then
    /// ,down=STEPS (default 10) or ,crash. `@STEP`: before that optimizer step. summary.json
    /// reports the goodput and the node-steps lost; faults.json the faults met.
    #[arg(long, value_name = "FILE|SPEC", value_parser = checked_faults)]
    pub faults: Option<String>,
    /// Steps between synchronisations (each strategy's paper default when unset): DiLoCo,
    /// streaming-diloco, async-diloco 100; sparseloco, muloco 30; noloco 50; desloc 16
    /// (its parameter period); fedavg 1.
    #[arg(short = 'H', long)]
    pub sync_interval: Option<usize>,
    /// Outer learning rate (default: the strategy's; DiLoCo 0.7, sparseloco 1, muloco 0.8,
    /// noloco 0.7).
    #[arg(long)]
    pub outer_lr: Option<f64>,
    /// Outer momentum (default: the strategy's; DiLoCo's Nesterov 0.9, muloco 0.9, noloco's
    /// heavy ball 0.5).
    #[arg(long)]
    pub outer_momentum: Option<f64>,
    /// How averaged vectors travel, for allreduce (gradients), diloco, muloco and
    /// streaming-diloco (outer gradients) and fedavg (parameters): none, int8, fp8, fp4,
    /// 2bit (each optionally :CHUNK), topk:K/CHUNK, randomk:DENSITY (each optionally +Q, a
    /// dense format for the kept values), then ,ef or ,ef=DECAY for error feedback and
    /// ,senders to average sparse values over their senders; or powersgd:RANK (default: the
    /// strategy's: streaming-diloco fp4, muloco 2bit,ef=0.9, the others none).
    #[arg(long, value_parser = checked::<CompressionConfig>)]
    pub compression: Option<String>,
    /// DiLoCo, sparta-diloco, muloco: Decoupled DiLoCo's quorum. An outer step waits for the
    /// first M nodes to arrive, then --grace more seconds, and goes on without the nodes
    /// still missing (they take the step's result; their inner steps of the round are
    /// lost). Arrivals are simulated times (--network); untimed, every node arrives at once.
    #[arg(long, value_name = "M", conflicts_with = "fastest")]
    pub min_quorum: Option<usize>,
    /// DiLoCo: simulated seconds an outer step keeps waiting after the --min-quorum-th
    /// arrival (default 0).
    #[arg(long, value_name = "SECONDS", requires = "min_quorum")]
    pub grace: Option<f64>,
    /// DiLoCo, sparta-diloco, muloco: each outer step averages the first M nodes to arrive
    /// (fastest m of n, as SparseLoCo/Covenant); the others take the step's result and lose
    /// their round's inner steps. Ties go to the lower rank.
    #[arg(long, value_name = "M")]
    pub fastest: Option<usize>,
    /// Streaming DiLoCo: fragments, each synchronised once per H steps, staggered.
    #[arg(long, default_value_t = 2)]
    pub fragments: usize,
    /// Streaming DiLoCo: how the parameters are split into fragments.
    #[arg(long, value_enum, default_value = "sequential")]
    pub fragment_pattern: FragmentPatternName,
    /// Streaming DiLoCo: inner steps a fragment's exchange overlaps (τ).
    #[arg(long, default_value_t = 1)]
    pub overlap: usize,
    /// Streaming DiLoCo: share α of the local values kept when a fragment is synchronised.
    #[arg(long, default_value_t = 0.5)]
    pub mixing: f64,
    /// SparseLoCo: values kept per chunk of --topk-chunk.
    #[arg(long, default_value_t = 64)]
    pub topk: usize,
    /// SparseLoCo: chunk length for the top-k.
    #[arg(long, default_value_t = 4096)]
    pub topk_chunk: usize,
    /// SparseLoCo: decay of the error-feedback buffer.
    #[arg(long, default_value_t = 0.999)]
    pub error_feedback_decay: f64,
    /// SparseLoCo: average each position over all nodes, or over the nodes that sent it.
    #[arg(long, value_enum, default_value = "senders")]
    pub aggregation: AggregationName,
    /// DES-LOC: clip each gradient coordinate to ±ρ before the moments (default: none).
    #[arg(long)]
    pub desloc_clip: Option<f64>,
    /// DES-LOC: Adam's β₁.
    #[arg(long, default_value_t = 0.9)]
    pub desloc_beta1: f64,
    /// DES-LOC: Adam's β₂.
    #[arg(long, default_value_t = 0.999)]
    pub desloc_beta2: f64,
    /// DES-LOC: Adam's ε.
    #[arg(long, default_value_t = 1e-8)]
    pub desloc_eps: f64,
    /// DES-LOC: steps between averagings of Adam's first moment (default 3·H).
    #[arg(long)]
    pub first_moment_interval: Option<usize>,
    /// DES-LOC: steps between averagings of Adam's second moment (default 6·H).
    #[arg(long)]
    pub second_moment_interval: Option<usize>,
    /// NoLoCo: nodes per averaging group.
    #[arg(long, default_value_t = 2)]
    pub group_size: usize,
    /// Asynchronous DiLoCo: pushes between outer momentum updates (default: K).
    #[arg(long)]
    pub momentum_period: Option<usize>,
    /// Asynchronous DiLoCo: the fewest local steps a slow node takes per round.
    #[arg(long, default_value_t = 1)]
    pub min_local_steps: usize,
    /// Asynchronous DiLoCo: every node takes H steps, however slow (no DyLU).
    #[arg(long)]
    pub no_dynamic_local_updates: bool,
    /// PowerSGD: rank of the gradient factors.
    #[arg(long, default_value_t = 4)]
    pub powersgd_rank: usize,
    /// PowerSGD: a matrix is compressed only if this many times smaller.
    #[arg(long, default_value_t = 2.0)]
    pub powersgd_min_compression_rate: f64,
    /// PowerSGD: plain all-reduce before this step.
    #[arg(long, default_value_t = 0)]
    pub powersgd_start_step: usize,
    /// PowerSGD: draw a fresh Q every step instead of reusing the last one.
    #[arg(long)]
    pub powersgd_no_warm_start: bool,
    /// PowerSGD: no error feedback.
    #[arg(long)]
    pub powersgd_no_error_feedback: bool,
    /// FedAvg: average within random islands of this many nodes (default: all nodes).
    #[arg(long)]
    pub island_size: Option<usize>,
    /// SPARTA: fraction of the parameters averaged per synchronisation.
    #[arg(long, default_value_t = 0.005)]
    pub p_sparta: f64,
    /// SPARTA: steps between sparse averagings (in sparta and sparta-diloco).
    #[arg(long, default_value_t = 1)]
    pub sparta_sync_interval: usize,
    /// SPARTA: how the averaged elements are chosen.
    #[arg(long, value_enum, default_value = "random")]
    pub sparta_selector: SelectorName,
    /// DeMo: decay of the error-feedback buffer, in [0, 1).
    #[arg(long, default_value_t = 0.999)]
    pub compression_decay: f64,
    /// DeMo: DCT coefficients sent per chunk.
    #[arg(long, default_value_t = 32)]
    pub compression_topk: usize,
    /// DeMo: target chunk length per dimension.
    #[arg(long, default_value_t = 64)]
    pub compression_chunk: usize,
}

impl CommonArgs {
    /// The strategy `--strategy` names, configured by these flags: a value that
    /// [`Trainer::fit`](gym_core::Trainer::fit) takes whatever the strategy.
    pub fn strategy_config(&self) -> Box<dyn StrategyConfig> {
        let h = |default: usize| self.sync_interval.unwrap_or(default);
        match self.strategy {
            StrategyName::Allreduce => Box::new(
                AllReduceConfig::new()
                    .with_inner(self.inner())
                    .with_compression(self.compression_or(CompressionConfig::None)),
            ),
            StrategyName::Diloco => Box::new(
                DiLoCoConfig::new()
                    .with_inner(self.inner())
                    .with_communicator(self.diloco_communicator(DiLoCoCommunicatorConfig::new())),
            ),
            StrategyName::Fedavg => Box::new(
                FedAvgConfig::new()
                    .with_inner(self.inner())
                    .with_communicator(
                        AveragingCommunicatorConfig::new()
                            .with_sync_interval(h(1))
                            .with_island_size(self.island_size)
                            .with_compression(self.compression_or(CompressionConfig::None)),
                    ),
            ),
            StrategyName::Sparta => Box::new(
                SpartaConfig::new()
                    .with_inner(self.inner())
                    .with_communicator(self.sparse_communicator()),
            ),
            StrategyName::SpartaDiloco => Box::new(
                SpartaDiLoCoConfig::new()
                    .with_inner(self.inner())
                    .with_sparta(self.sparse_communicator())
                    .with_diloco(self.diloco_communicator(DiLoCoCommunicatorConfig::new())),
            ),
            // DeMo has no inner optimizer: --optimizer is not used.
            StrategyName::Demo => Box::new(
                DeMoConfig::new()
                    .with_lr(self.lr)
                    .with_schedule(self.schedule())
                    .with_max_norm(self.max_norm)
                    .with_compression_decay(self.compression_decay)
                    .with_compression_topk(self.compression_topk)
                    .with_compression_chunk(self.compression_chunk)
                    .with_weight_decay(self.weight_decay.map_or(0.0, f64::from)),
            ),
            StrategyName::StreamingDiloco => {
                let defaults = StreamingDiLoCoConfig::new();
                let outer = self.outer_optimizer(&defaults.outer_optimizer);
                Box::new(
                    defaults
                        .clone()
                        .with_inner(self.inner())
                        .with_sync_interval(h(defaults.sync_interval))
                        .with_fragments(self.fragments)
                        .with_pattern(match self.fragment_pattern {
                            FragmentPatternName::Sequential => FragmentPattern::Sequential,
                            FragmentPatternName::Strided => FragmentPattern::Strided,
                        })
                        .with_overlap(self.overlap)
                        .with_mixing(self.mixing)
                        .with_outer_optimizer(outer)
                        .with_outer_lr(self.outer_lr.unwrap_or(defaults.outer_lr))
                        .with_compression(self.compression_or(defaults.compression)),
                )
            }
            StrategyName::Sparseloco => {
                let defaults = SparseLoCoConfig::new();
                Box::new(
                    defaults
                        .clone()
                        .with_inner(self.inner())
                        .with_sync_interval(h(defaults.sync_interval))
                        .with_top_k(self.topk)
                        .with_chunk(self.topk_chunk)
                        .with_error_feedback_decay(self.error_feedback_decay as f32)
                        .with_aggregation(match self.aggregation {
                            AggregationName::Nodes => Aggregation::MeanOverNodes,
                            AggregationName::Senders => Aggregation::MeanOverSenders,
                        })
                        .with_outer_lr(self.outer_lr.unwrap_or(defaults.outer_lr)),
                )
            }
            StrategyName::Muloco => {
                let inner = match self.optimizer {
                    OptimizerName::Muon => self.inner(),
                    _ => muon_for_matrices(self.inner()),
                };
                Box::new(
                    MuLoCoConfig::new()
                        .with_inner(inner)
                        .with_communicator(self.diloco_communicator(muloco_communicator())),
                )
            }
            StrategyName::Desloc => {
                let defaults = DesLocConfig::new();
                Box::new(
                    defaults
                        .clone()
                        .with_lr(self.lr)
                        .with_schedule(self.schedule())
                        .with_max_norm(self.max_norm)
                        .with_weight_decay(
                            self.weight_decay.map_or(defaults.weight_decay, f64::from),
                        )
                        .with_param_interval(h(defaults.param_interval))
                        .with_first_moment_interval(self.first_moment_interval)
                        .with_second_moment_interval(self.second_moment_interval)
                        .with_rho(self.desloc_clip)
                        .with_betas((self.desloc_beta1, self.desloc_beta2))
                        .with_eps(self.desloc_eps),
                )
            }
            StrategyName::Noloco => {
                let defaults = NoLoCoCommunicatorConfig::new();
                Box::new(
                    NoLoCoConfig::new()
                        .with_inner(self.inner())
                        .with_communicator(
                            defaults
                                .clone()
                                .with_sync_interval(h(defaults.sync_interval))
                                .with_group_size(self.group_size)
                                .with_outer_lr(self.outer_lr.unwrap_or(defaults.outer_lr))
                                .with_outer_momentum(
                                    self.outer_momentum.unwrap_or(defaults.outer_momentum),
                                ),
                        ),
                )
            }
            StrategyName::AsyncDiloco => {
                let defaults = AsyncDiLoCoConfig::new();
                Box::new(
                    defaults
                        .clone()
                        .with_inner(self.inner())
                        .with_sync_interval(h(defaults.sync_interval))
                        .with_outer_lr(self.outer_lr.unwrap_or(defaults.outer_lr))
                        .with_outer_momentum(self.outer_momentum.unwrap_or(defaults.outer_momentum))
                        .with_momentum_period(self.momentum_period)
                        .with_min_local_steps(self.min_local_steps)
                        .with_dynamic_local_updates(!self.no_dynamic_local_updates),
                )
            }
            StrategyName::Powersgd => Box::new(
                PowerSgdConfig::new()
                    .with_inner(self.inner())
                    .with_compression(
                        PowerSgdCompressionConfig::new()
                            .with_rank(self.powersgd_rank)
                            .with_min_compression_rate(self.powersgd_min_compression_rate)
                            .with_start_step(self.powersgd_start_step)
                            .with_warm_start(!self.powersgd_no_warm_start)
                            .with_error_feedback(!self.powersgd_no_error_feedback),
                    ),
            ),
        }
    }

    /// The trainer configuration these flags describe; checks the flags that only some
    /// strategies take ([`check_strategy_flags`](Self::check_strategy_flags)).
    pub fn trainer_config(&self) -> Result<TrainerConfig, String> {
        self.check_strategy_flags()?;
        let simulation = self.simulation()?;
        let faults = self.fault_schedule(simulation.as_ref())?;
        Ok(TrainerConfig::new(self.num_nodes)
            .with_num_epochs(self.epochs)
            .with_max_steps(self.max_steps)
            .with_batch_size(self.batch_size)
            .with_minibatch_size(self.minibatch_size)
            .with_val_size(Some(self.val_size))
            .with_val_interval(self.val_interval)
            .with_seed(self.seed)
            .with_run_name(self.run_name.clone())
            .with_log_dir(Some(self.log_dir.to_string_lossy().into_owned()))
            .with_progress(!self.no_progress)
            .with_kernel_threads_per_node(self.kernel_threads_per_node)
            .with_correlation_interval(self.correlation_interval)
            .with_simulation(simulation)
            .with_faults(faults)
            .with_checkpoint_interval(self.checkpoint_interval)
            .with_checkpoint_dir(
                self.checkpoint_dir
                    .as_ref()
                    .map(|d| d.to_string_lossy().into_owned()),
            )
            .with_keep_checkpoints(self.keep_checkpoints)
            .with_on_nonfinite(match self.on_nonfinite {
                NonFiniteName::Stop => NonFinitePolicy::Stop,
                NonFiniteName::Skip => NonFinitePolicy::Skip,
            })
            .with_resume_from(
                self.resume
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned()),
            ))
    }

    /// `--faults` as a schedule (`None` without it), for a run on `simulation`.
    ///
    /// With `--max-steps`, the schedule is also checked against this run as the trainer will
    /// check it (ranks, islands and steps that exist, a node present at every step), so a
    /// `sweep` or `compare` fails before its first run rather than at the run that does not
    /// fit. Random faults are not drawn here.
    pub fn fault_schedule(
        &self,
        simulation: Option<&SimulationConfig>,
    ) -> Result<Option<FaultSchedule>, String> {
        let Some(arg) = &self.faults else {
            return Ok(None);
        };
        let flag_error = |e: GymError| match e {
            GymError::InvalidConfig(why) => format!("--faults: {why}"),
            other => format!("--faults: {other}"),
        };
        let schedule = FaultSchedule::from_arg(arg).map_err(flag_error)?;
        if let Some(max_steps) = self.max_steps {
            let island_size = simulation.and_then(SimulationConfig::island_size);
            // Zero compute seconds draw no random fault, but a random entry without
            // simulated time is still refused.
            let no_time = |_: usize, _: usize| 0.0;
            let step_seconds = simulation.map(|_| &no_time as &dyn Fn(usize, usize) -> f64);
            FaultTimeline::resolve(
                &schedule,
                self.num_nodes,
                max_steps,
                self.seed,
                island_size,
                step_seconds,
            )
            .map_err(flag_error)?;
        }
        Ok(Some(schedule))
    }

    /// The quorum rule of `--min-quorum` (with `--grace`) or `--fastest`, if any.
    pub fn quorum(&self) -> Option<QuorumRule> {
        match (self.min_quorum, self.fastest) {
            (Some(min), _) => Some(QuorumRule::Grace {
                min,
                grace_s: self.grace.unwrap_or(0.0),
            }),
            (None, Some(count)) => Some(QuorumRule::Fastest { count }),
            (None, None) => None,
        }
    }

    /// The quorum flags given, as written, for messages.
    fn quorum_flags(&self) -> Option<&'static str> {
        match (self.min_quorum, self.grace, self.fastest) {
            (Some(_), _, _) => Some("--min-quorum"),
            (None, Some(_), _) => Some("--grace"),
            (None, None, Some(_)) => Some("--fastest"),
            (None, None, None) => None,
        }
    }

    /// Checks the flags that only some strategies take: the quorum flags need a strategy
    /// with a quorum ([`StrategyName::has_quorum`]) and a usable rule. The error names the
    /// flag and the strategy.
    pub fn check_strategy_flags(&self) -> Result<(), String> {
        let Some(flag) = self.quorum_flags() else {
            return Ok(());
        };
        // `--grace` without `--min-quorum`, or with `--fastest`, clap refuses itself.
        if !self.strategy.has_quorum() {
            return Err(format!(
                "{flag}: {} has no quorum (only {QUORUM_STRATEGIES} wait for one)",
                self.strategy.as_str()
            ));
        }
        let Some(rule) = self.quorum() else {
            return Ok(());
        };
        rule.validate().map_err(|why| {
            // The flag whose value is wrong: a bad grace window comes with a good quorum.
            let flag = match rule {
                QuorumRule::Grace { min, .. } if min > 0 => "--grace",
                _ => flag,
            };
            format!("{flag}: {why}")
        })
    }

    /// Drops the flags this strategy does not take (the quorum flags), so that one command
    /// line can run several strategies (`compare`, `sweep`) and each run records only what
    /// applied to it.
    pub fn retain_strategy_flags(&mut self) {
        if !self.strategy.has_quorum() {
            self.min_quorum = None;
            self.grace = None;
            self.fastest = None;
        }
    }

    /// The simulated cluster these flags describe (`--network` and its companions), or
    /// `None` without `--network`; a spec that does not parse names its flag.
    pub fn simulation(&self) -> Result<Option<SimulationConfig>, String> {
        let Some(network) = &self.network else {
            let set = [
                ("--topology", self.topology.is_some()),
                ("--node-tflops", self.node_tflops.is_some()),
                ("--node-speed", !self.node_speed.is_empty()),
                ("--jitter", self.jitter.is_some()),
                ("--target-loss", self.target_loss.is_some()),
            ];
            return match set.iter().find(|(_, given)| *given) {
                Some((flag, _)) => Err(format!("{flag} needs --network (simulated time)")),
                None => Ok(None),
            };
        };
        let network: Network = parsed("--network", network)?;
        let topology = match &self.topology {
            Some(t) => parsed("--topology", t)?,
            None => Topology::Switch,
        };
        let compute = match &self.node_tflops {
            Some(c) => parsed("--node-tflops", c)?,
            None => ComputeModel::cpu(),
        };
        Ok(Some(
            SimulationConfig::new(network.with_topology(topology))
                .with_compute(compute)
                .with_node_speed(self.node_speed.clone())
                .with_jitter(self.jitter.unwrap_or(0.0)),
        ))
    }

    /// Each node's own optimizer as these flags describe it.
    pub fn inner(&self) -> InnerOptimizerConfig {
        let decayed = |c: OptimizerConfig| match self.weight_decay {
            Some(wd) => c.with_weight_decay(wd),
            None => c,
        };
        let base = match self.optimizer {
            OptimizerName::Adamw | OptimizerName::Muon => OptimizerConfig::adamw(),
            OptimizerName::Adam => OptimizerConfig::adam(),
            OptimizerName::Sgd => OptimizerConfig::sgd(),
            OptimizerName::Lion => LionConfig::new().into(),
            OptimizerName::Adan => AdanConfig::new().into(),
            OptimizerName::Lamb => LambConfig::new().into(),
            OptimizerName::Rmsprop => RmsPropConfig::new().into(),
            OptimizerName::Adagrad => AdaGradConfig::new().into(),
            OptimizerName::Adafactor => AdafactorConfig::new().into(),
        };
        let inner = InnerOptimizerConfig::new()
            .with_optimizer(decayed(base))
            .with_lr(self.lr)
            .with_schedule(self.schedule())
            .with_max_norm(self.max_norm);
        match self.optimizer {
            OptimizerName::Muon => inner.with_group(OptimizerGroup::new(
                ParamSelection::matrices(),
                decayed(
                    MuonConfig::new()
                        .with_adjust_lr_fn(AdjustLrFn::MatchRmsAdamW)
                        .into(),
                ),
            )),
            _ => inner,
        }
    }

    /// The learning-rate schedule these flags describe.
    fn schedule(&self) -> LrScheduleConfig {
        LrScheduleConfig::new()
            .with_warmup_steps(self.warmup_steps)
            .with_cosine(self.cosine)
    }

    /// DiLoCo's synchronisation as these flags describe it, from `defaults` (DiLoCo's or
    /// MuLoCo's) for what they leave unset.
    fn diloco_communicator(&self, defaults: DiLoCoCommunicatorConfig) -> DiLoCoCommunicatorConfig {
        DiLoCoCommunicatorConfig {
            sync_interval: self.sync_interval.unwrap_or(defaults.sync_interval),
            outer_optimizer: self.outer_optimizer(&defaults.outer_optimizer),
            outer_lr: self.outer_lr.unwrap_or(defaults.outer_lr),
            compression: self.compression_or(defaults.compression),
            quorum: self.quorum().or(defaults.quorum),
        }
    }

    /// The outer SGD `--outer-momentum` describes (Nesterov; plain at 0), or `default`.
    fn outer_optimizer(&self, default: &OptimizerConfig) -> OptimizerConfig {
        match self.outer_momentum {
            Some(0.0) => OptimizerConfig::sgd(),
            Some(momentum) => OptimizerConfig::sgd_momentum(momentum, true),
            None => default.clone(),
        }
    }

    /// `--compression`, or `default` when it is not given.
    fn compression_or(&self, default: CompressionConfig) -> CompressionConfig {
        self.compression
            .as_deref()
            .map(|spec| spec.parse().expect("checked when parsed"))
            .unwrap_or(default)
    }

    /// SPARTA's sparse averaging as these flags describe it.
    fn sparse_communicator(&self) -> SparseCommunicatorConfig {
        SparseCommunicatorConfig::new()
            .with_p(self.p_sparta)
            .with_sync_interval(self.sparta_sync_interval)
            .with_selector(match self.sparta_selector {
                SelectorName::Random => IndexSelectorKind::Random,
                SelectorName::ShuffledSequential => IndexSelectorKind::ShuffledSequential,
                SelectorName::Partitioned => IndexSelectorKind::Partitioned,
            })
    }

    /// Where this run's logs go.
    pub fn run_dir(&self, run_name: &str) -> PathBuf {
        self.log_dir.join(run_name)
    }
}

/// A value parser that checks a spec parses as `T` and keeps it as written (so that the
/// run configuration saves the spec the user gave).
fn checked<T: FromStr<Err = String>>(spec: &str) -> Result<String, String> {
    spec.parse::<T>().map(|_| spec.to_string())
}

/// The value parser of `--faults`: checks that the argument reads as a fault schedule (a
/// file or a spec) and keeps it as written, as [`checked`] does.
fn checked_faults(arg: &str) -> Result<String, String> {
    match FaultSchedule::from_arg(arg) {
        Ok(_) => Ok(arg.to_string()),
        // clap names the flag and the value; the kind of error adds nothing.
        Err(GymError::InvalidConfig(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

/// Exits with clap's status for a bad command line (2), naming the flag and the strategy,
/// when `common` holds flags its strategy does not take
/// ([`CommonArgs::check_strategy_flags`]): for binaries that train one strategy.
pub fn exit_on_strategy_flag_error(common: &CommonArgs) {
    if let Err(why) = common.check_strategy_flags() {
        clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, format!("{why}\n")).exit();
    }
}

/// `spec` parsed as `T`, or an error naming `flag`.
fn parsed<T: FromStr<Err = String>>(flag: &str, spec: &str) -> Result<T, String> {
    spec.parse().map_err(|e| format!("{flag}: {e}"))
}

/// A bad `--config` file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or JSON, or holds a value no flag can take.
    #[error("config file {path}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// Flags read from a run-configuration file.
///
/// Each top-level key is a flag, in snake or kebab case (`num_nodes = 4` is
/// `--num-nodes 4`); `true` is a bare switch (`cosine = true`), `false` leaves it off; an
/// array is a comma-separated list (`strategies = ["allreduce", "diloco"]`). A table
/// `[overrides.<strategy>]` holds flags for one strategy only (used by `compare`, e.g. DeMo's
/// own learning rate). The file is TOML unless its name ends in `.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigFile {
    /// The file the flags came from.
    pub path: Option<PathBuf>,
    /// Its top-level flags, as command-line words.
    pub flags: Vec<String>,
    /// Per strategy name: the flags of its `[overrides.<strategy>]` table.
    pub overrides: BTreeMap<String, Vec<String>>,
}

impl ConfigFile {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |why: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        let value: serde_json::Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?
        } else {
            let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
            serde_json::to_value(table).map_err(|e| invalid(e.to_string()))?
        };
        let serde_json::Value::Object(mut top) = value else {
            return Err(invalid("expected a table of flags".into()));
        };
        let mut overrides = BTreeMap::new();
        if let Some(o) = top.remove("overrides") {
            let serde_json::Value::Object(o) = o else {
                return Err(invalid("`overrides` must be a table of tables".into()));
            };
            for (strategy, flags) in o {
                let serde_json::Value::Object(flags) = flags else {
                    return Err(invalid(format!("`overrides.{strategy}` must be a table")));
                };
                let words = flag_words(&flags).map_err(invalid)?;
                overrides.insert(strategy.replace('_', "-"), words);
            }
        }
        Ok(ConfigFile {
            path: Some(path.to_path_buf()),
            flags: flag_words(&top).map_err(invalid)?,
            overrides,
        })
    }

    /// The flags of the overrides table of `label` (a strategy's name, or a `compare`
    /// variant's label; none if it has no table).
    pub fn overrides_for(&self, label: &str) -> &[String] {
        self.overrides.get(label).map_or(&[], Vec::as_slice)
    }
}

/// A table of flags as command-line words.
fn flag_words(table: &serde_json::Map<String, serde_json::Value>) -> Result<Vec<String>, String> {
    use serde_json::Value;
    let scalar = |key: &str, v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!("`{key}`: {other} is not a flag value")),
    };
    let mut words = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            Value::Bool(true) => words.push(flag),
            Value::Bool(false) | Value::Null => {}
            Value::Array(items) => {
                let items = items
                    .iter()
                    .map(|v| scalar(key, v))
                    .collect::<Result<Vec<_>, _>>()?;
                words.extend([flag, items.join(",")]);
            }
            Value::Object(_) => return Err(format!("`{key}` is a table; flags are values")),
            v => words.extend([flag, scalar(key, v)?]),
        }
    }
    Ok(words)
}

/// Parses `T` from `argv` (program name first) with `command` (`T::command()`, possibly
/// with other defaults), after the flags of its `--config FILE`: the command line wins
/// over the file. Returns the file too, for per-strategy overrides.
pub fn try_parse_from<T: FromArgMatches>(
    command: &clap::Command,
    argv: &[OsString],
) -> Result<(T, ConfigFile), clap::Error> {
    let file = match config_path(argv) {
        Some(path) => ConfigFile::load(&path)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?,
        None => ConfigFile::default(),
    };
    Ok((parse_with(command, argv, &file, &[])?, file))
}

/// Parses `T` from `argv` with `file`'s flags first and `extra` flags last (they win).
pub fn parse_with<T: FromArgMatches>(
    command: &clap::Command,
    argv: &[OsString],
    file: &ConfigFile,
    extra: &[String],
) -> Result<T, clap::Error> {
    // A flag given twice (in the file, then on the command line) takes its last value.
    let matches = command
        .clone()
        .args_override_self(true)
        .try_get_matches_from(with_flags_first(argv, &file.flags, extra))?;
    T::from_arg_matches(&matches)
}

/// Parses the process's command line as [`try_parse_from`] does, exiting with clap's
/// message on an error.
pub fn parse<T: Parser>() -> (T, ConfigFile) {
    parse_command(&T::command())
}

/// [`parse`] with a customised `command` (other defaults, say).
pub fn parse_command<T: FromArgMatches>(command: &clap::Command) -> (T, ConfigFile) {
    let argv: Vec<OsString> = std::env::args_os().collect();
    try_parse_from(command, &argv).unwrap_or_else(|e| e.exit())
}

fn with_flags_first(argv: &[OsString], flags: &[String], extra: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = argv.iter().take(1).cloned().collect();
    args.extend(flags.iter().map(OsString::from));
    args.extend(argv.iter().skip(1).cloned());
    args.extend(extra.iter().map(OsString::from));
    args
}

/// The value of `--config FILE` or `--config=FILE` in `argv`.
fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let mut words = argv.iter().skip(1).map(|w| w.to_string_lossy());
    while let Some(w) = words.next() {
        if w == "--" {
            break;
        }
        if w == "--config" {
            return words.next().map(|p| PathBuf::from(p.as_ref()));
        }
        if let Some(p) = w.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    None
}

/// Writes `args` as `run_config.toml` into `dir`: the resolved configuration of a run,
/// which `--config` reads back.
pub fn save_run_config<A: Serialize>(args: &A, dir: &Path) -> std::io::Result<PathBuf> {
    // Through JSON, to drop unset options (TOML has no null).
    let mut value = serde_json::to_value(args).map_err(std::io::Error::other)?;
    if let serde_json::Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
    }
    let text = toml::to_string(&value).map_err(std::io::Error::other)?;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("run_config.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_become_flags() {
        let table = serde_json::json!({
            "num_nodes": 4,
            "lr": 1e-3,
            "cosine": true,
            "no_progress": false,
            "strategies": ["allreduce", "demo"],
            "run-name": "x",
        });
        let words = flag_words(table.as_object().unwrap()).unwrap();
        let expected = [
            "--cosine",
            "--lr",
            "0.001",
            "--num-nodes",
            "4",
            "--run-name",
            "x",
            "--strategies",
            "allreduce,demo",
        ];
        assert_eq!(words, expected);
        let nested = serde_json::json!({ "a": { "b": 1 } });
        assert!(flag_words(nested.as_object().unwrap()).is_err());
    }

    #[test]
    fn the_config_path_is_found_in_either_spelling() {
        let argv = |w: &[&str]| w.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            config_path(&argv(&["p", "--lr", "1", "--config", "a.toml"])),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            config_path(&argv(&["p", "--config=b.json"])),
            Some(PathBuf::from("b.json"))
        );
        assert_eq!(config_path(&argv(&["p", "--", "--config", "c"])), None);
        assert_eq!(
            config_path(&argv(&["--config"])),
            None,
            "argv[0] is the program"
        );
    }
}
