//! The flag vocabulary every example binary shares (kebab-case, as clap users expect), so
//! scripts can drive any of them the same way.

use clap::{Args, ValueEnum};
use gym_core::{
    AdamSpec, AdamWSpec, InnerOptimizerConfig, LrScheduleConfig, OptimizerSpec, SgdSpec,
    StrategyConfig, TrainerConfig,
};
use gym_strategies::{
    AllReduceConfig, AveragingCommunicatorConfig, DeMoConfig, DiLoCoCommunicatorConfig,
    DiLoCoConfig, FedAvgConfig, IndexSelectorKind, SparseCommunicatorConfig, SpartaConfig,
    SpartaDiLoCoConfig,
};
use std::path::PathBuf;

/// The strategies the examples can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrategyName {
    /// Gradients averaged every step (PyTorch DDP).
    Allreduce,
    /// H local steps, then an outer Nesterov step on the averaged replicas.
    Diloco,
    /// Replicas averaged every H steps, optionally within random islands.
    Fedavg,
    /// A fraction p of the parameters averaged every step.
    Sparta,
    /// SPARTA every --sparta-interval steps plus DiLoCo every H steps.
    SpartaDiloco,
    /// DeMo: top-k DCT coefficients of a local gradient buffer, sign step (lr: --lr).
    Demo,
}

/// SPARTA's index selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SelectorName {
    /// Each element with probability p.
    Random,
    /// Chunks of one fixed permutation, in turn.
    ShuffledSequential,
    /// Parts of a balanced random partition, in turn.
    Partitioned,
}

/// The inner optimizers the examples can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerName {
    /// AdamW.
    Adamw,
    /// Adam.
    Adam,
    /// SGD.
    Sgd,
}

/// Flags shared by every example.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
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
    /// Threads each node's tensor kernels may use (0: share all node threads).
    #[arg(long, default_value_t = 1)]
    pub kernel_threads_per_node: usize,
    /// Inner steps between synchronisations (DiLoCo default 100, FedAvg default 1).
    #[arg(short = 'H', long)]
    pub inner_steps: Option<usize>,
    /// DiLoCo's outer learning rate.
    #[arg(long, default_value_t = 0.7)]
    pub outer_lr: f64,
    /// DiLoCo's outer Nesterov momentum.
    #[arg(long, default_value_t = 0.9)]
    pub outer_momentum: f64,
    /// FedAvg: average within random islands of this many nodes (default: all nodes).
    #[arg(long)]
    pub island_size: Option<usize>,
    /// SPARTA: fraction of the parameters averaged per synchronisation.
    #[arg(long, default_value_t = 0.005)]
    pub p_sparta: f64,
    /// SPARTA: synchronise every this many steps.
    #[arg(long, default_value_t = 1)]
    pub sparta_interval: usize,
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

/// A job to run with whichever strategy the flags name (see [`CommonArgs::dispatch`]):
/// strategies are different types, so the job is generic over them.
pub trait WithStrategy {
    /// What the job returns.
    type Output;

    /// Runs the job with `strategy`.
    fn run<S: StrategyConfig>(self, strategy: &S) -> Self::Output;
}

impl CommonArgs {
    /// Runs `job` with the strategy named by `--strategy`, configured by these flags.
    pub fn dispatch<J: WithStrategy>(&self, job: J) -> J::Output {
        match self.strategy {
            StrategyName::Allreduce => job.run(&self.all_reduce()),
            StrategyName::Diloco => job.run(&self.diloco()),
            StrategyName::Fedavg => job.run(&self.fedavg()),
            StrategyName::Sparta => job.run(&self.sparta()),
            StrategyName::SpartaDiloco => job.run(&self.sparta_diloco()),
            StrategyName::Demo => job.run(&self.demo()),
        }
    }

    /// The trainer configuration these flags describe.
    pub fn trainer_config(&self) -> TrainerConfig {
        TrainerConfig::new(self.num_nodes)
            .with_num_epochs(self.epochs)
            .with_max_steps(self.max_steps)
            .with_batch_size(self.batch_size)
            .with_minibatch_size(self.minibatch_size)
            .with_val_size(self.val_size)
            .with_val_interval(self.val_interval)
            .with_seed(self.seed)
            .with_run_name(self.run_name.clone())
            .with_log_dir(Some(self.log_dir.to_string_lossy().into_owned()))
            .with_progress(!self.no_progress)
            .with_kernel_threads_per_node(self.kernel_threads_per_node)
    }

    /// The inner optimizer these flags describe.
    pub fn optimizer(&self) -> OptimizerSpec {
        let spec = match self.optimizer {
            OptimizerName::Adamw => OptimizerSpec::AdamW(AdamWSpec::new()),
            OptimizerName::Adam => OptimizerSpec::Adam(AdamSpec::new()),
            OptimizerName::Sgd => OptimizerSpec::Sgd(SgdSpec::new()),
        };
        let spec = match self.weight_decay {
            Some(wd) => spec.with_weight_decay(wd),
            None => spec,
        };
        spec.with_lr(self.lr)
    }

    /// The learning-rate schedule these flags describe.
    pub fn schedule(&self) -> LrScheduleConfig {
        LrScheduleConfig::new()
            .with_warmup_steps(self.warmup_steps)
            .with_cosine(self.cosine)
    }

    /// DiLoCo's synchronisation as these flags describe it.
    fn diloco_communicator(&self) -> DiLoCoCommunicatorConfig {
        DiLoCoCommunicatorConfig::new()
            .with_inner_steps(self.inner_steps.unwrap_or(100))
            .with_outer_optimizer(OptimizerSpec::Sgd(
                SgdSpec::new()
                    .with_lr(self.outer_lr)
                    .with_momentum(self.outer_momentum)
                    .with_nesterov(self.outer_momentum > 0.0),
            ))
    }

    /// SPARTA's sparse averaging as these flags describe it.
    fn sparse_communicator(&self) -> SparseCommunicatorConfig {
        SparseCommunicatorConfig::new()
            .with_p(self.p_sparta)
            .with_interval(self.sparta_interval)
            .with_selector(match self.sparta_selector {
                SelectorName::Random => IndexSelectorKind::Random,
                SelectorName::ShuffledSequential => IndexSelectorKind::ShuffledSequential,
                SelectorName::Partitioned => IndexSelectorKind::Partitioned,
            })
    }

    /// The DiLoCo strategy these flags describe.
    pub fn diloco(&self) -> DiLoCoConfig {
        DiLoCoConfig::new()
            .with_inner(self.inner())
            .with_communicator(self.diloco_communicator())
    }

    /// The FedAvg strategy these flags describe.
    pub fn fedavg(&self) -> FedAvgConfig {
        FedAvgConfig::new()
            .with_inner(self.inner())
            .with_communicator(
                AveragingCommunicatorConfig::new()
                    .with_inner_steps(self.inner_steps.unwrap_or(1))
                    .with_island_size(self.island_size),
            )
    }

    /// The SPARTA strategy these flags describe.
    pub fn sparta(&self) -> SpartaConfig {
        SpartaConfig::new()
            .with_inner(self.inner())
            .with_communicator(self.sparse_communicator())
    }

    /// The SPARTA + DiLoCo strategy these flags describe.
    pub fn sparta_diloco(&self) -> SpartaDiLoCoConfig {
        SpartaDiLoCoConfig::new()
            .with_inner(self.inner())
            .with_sparta(self.sparse_communicator())
            .with_diloco(self.diloco_communicator())
    }

    /// The DeMo strategy these flags describe (it has no inner optimizer: --optimizer is
    /// not used).
    pub fn demo(&self) -> DeMoConfig {
        DeMoConfig::new()
            .with_lr(self.lr)
            .with_schedule(self.schedule())
            .with_max_norm(self.max_norm)
            .with_compression_decay(self.compression_decay)
            .with_compression_topk(self.compression_topk)
            .with_compression_chunk(self.compression_chunk)
            .with_weight_decay(self.weight_decay.map_or(0.0, f64::from))
    }

    /// The AllReduce strategy these flags describe.
    pub fn all_reduce(&self) -> AllReduceConfig {
        AllReduceConfig::new().with_inner(self.inner())
    }

    /// Each node's own optimizer as these flags describe it.
    pub fn inner(&self) -> InnerOptimizerConfig {
        InnerOptimizerConfig::new()
            .with_optimizer(self.optimizer())
            .with_schedule(self.schedule())
            .with_max_norm(self.max_norm)
    }

    /// Where this run's logs go.
    pub fn run_dir(&self, run_name: &str) -> PathBuf {
        self.log_dir.join(run_name)
    }
}
