//! The flags of `bench --suite`, `--node-cost` and `--soak`, and the configurations they
//! make.

use std::path::PathBuf;

use super::{NodeCostConfig, SoakConfig, SuiteConfig, SuiteModel};

/// The sizes of the soak (`--soak`); the defaults are issue 30's.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Soak: steps to run.
    #[arg(long, default_value_t = 10_000)]
    pub soak_steps: usize,
    /// Soak: nodes.
    #[arg(long, default_value_t = 1024)]
    pub soak_nodes: usize,
    /// Soak: DiLoCo's H (steps between the nodes' all-reduces).
    #[arg(long, default_value_t = 10)]
    pub soak_sync_interval: usize,
    /// Soak: expected random leaves per node over the run.
    #[arg(long, default_value_t = 2.0)]
    pub soak_faults_per_node: f64,
    /// Soak: steps a node that left stays away.
    #[arg(long, default_value_t = 20)]
    pub soak_down_steps: usize,
    /// Soak: seed of the model, the data orders and the faults.
    #[arg(long, default_value_t = 42)]
    pub soak_seed: u64,
}

/// The sizes of the benchmark suite (`--suite`); the defaults take about 6 minutes on a
/// 2-core machine, and the cost-of-a-node-step part (`--node-cost`) about 8 more.
#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// Suite: tiny-shakespeare's folder, for the GPT.
    #[arg(long, default_value = "../shared/data/shakespeare")]
    pub gpt_data_dir: PathBuf,
    /// Suite: models of the overhead part, comma-separated (mlp, cnn, gpt; '' skips the
    /// part).
    #[arg(long, value_delimiter = ',', default_value = "mlp,cnn,gpt")]
    pub suite_models: Vec<String>,
    /// Suite: node counts of the overhead part (K = 1, the baseline, is always run).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub suite_ks: Vec<usize>,
    /// Suite: the largest K of the overhead part, for every model.
    #[arg(long, default_value_t = 16)]
    pub suite_max_k: usize,
    /// Suite: the largest K of the CNN's overhead runs (its steps are the slow ones: K = 16
    /// adds about half a minute on 2 cores).
    #[arg(long, default_value_t = 16)]
    pub suite_cnn_max_k: usize,
    /// Suite: warm-up steps discarded before timing (a run of this many steps is timed
    /// too, and subtracted).
    #[arg(long, default_value_t = 1)]
    pub suite_warmup: usize,
    /// Suite: timings of each model and node count; the overhead figures are their median.
    #[arg(long, default_value_t = 5)]
    pub suite_repeats: usize,
    /// Suite: skip the precision part (each model's one-node step in f32 and under
    /// `--autocast bf16`).
    #[arg(long)]
    pub suite_no_precision: bool,
    /// Suite: timed steps of the MLP (its step is under 1 ms: fewer steps time noise).
    #[arg(long, default_value_t = 1000)]
    pub suite_mlp_steps: usize,
    /// Suite: timed steps of the CNN.
    #[arg(long, default_value_t = 3)]
    pub suite_cnn_steps: usize,
    /// Suite: timed steps of the GPT.
    #[arg(long, default_value_t = 120)]
    pub suite_gpt_steps: usize,
    /// Suite: tensor sizes of the bandwidth part in MiB (0: skip the part).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    pub suite_mb: Vec<usize>,
    /// Suite: group sizes of the bandwidth part.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    pub suite_collective_ks: Vec<usize>,
    /// Suite: timed calls per collective figure (their median).
    #[arg(long, default_value_t = 3)]
    pub suite_reps: usize,
    /// Suite: node counts of the peak-memory runs of `mnist` (0: skip the part).
    #[arg(long, value_delimiter = ',', default_value = "1,64,256,1024")]
    pub suite_rss_ks: Vec<usize>,
    /// Suite: node count of the start-up run of `mnist` (0: skip).
    #[arg(long, default_value_t = 16)]
    pub suite_startup_k: usize,
    /// Suite: skip the planner's row (10,000 nodes, 1,000 rounds of DiLoCo).
    #[arg(long)]
    pub suite_no_planner: bool,
    /// With --node-cost: node counts of the MLP's cost-of-a-node-step rows (0: none).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
    pub suite_node_cost_mlp_ks: Vec<usize>,
    /// With --node-cost: node counts of the small GPT's cost-of-a-node-step rows (0: none).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    pub suite_node_cost_gpt_ks: Vec<usize>,
    /// With --node-cost: timings of each cost-of-a-node-step row (their median).
    #[arg(long, default_value_t = 3)]
    pub suite_node_cost_repeats: usize,
    /// The compute-limit part's sizes.
    #[command(flatten)]
    pub compute: super::compute::ComputeArgs,
    /// One process of the suite's MPI rows, as `mpirun` starts it, for a job of this many
    /// nodes (one per process).
    #[cfg(feature = "mpi")]
    #[arg(long, hide = true)]
    pub mpi_bandwidth_worker: Option<usize>,
}

impl SoakArgs {
    /// The soak these flags describe (its command line still to be set).
    pub fn config(&self) -> SoakConfig {
        let mut config = SoakConfig::new();
        config.steps = self.soak_steps;
        config.nodes = self.soak_nodes;
        config.sync_interval = self.soak_sync_interval;
        config.faults_per_node = self.soak_faults_per_node;
        config.down_steps = self.soak_down_steps;
        config.seed = self.soak_seed;
        config
    }
}

impl SuiteArgs {
    /// The cost-of-a-node-step part these flags describe.
    fn node_cost(&self) -> NodeCostConfig {
        NodeCostConfig {
            mlp_ks: self.suite_node_cost_mlp_ks.clone(),
            gpt_ks: self.suite_node_cost_gpt_ks.clone(),
            repeats: self.suite_node_cost_repeats,
            ..NodeCostConfig::default()
        }
    }

    /// The suite these flags describe, reading MNIST from `mnist_dir`; `mnist_bin` and
    /// `plan_bin` are the binaries of the memory, start-up and planner parts, and
    /// `node_cost` adds the cost-of-a-node-step part.
    pub fn config(
        &self,
        mnist_dir: PathBuf,
        mnist_bin: Option<PathBuf>,
        plan_bin: Option<PathBuf>,
        node_cost: bool,
    ) -> Result<SuiteConfig, String> {
        let mut models = Vec::new();
        for name in self.suite_models.iter().filter(|s| !s.is_empty()) {
            models.push(
                name.parse::<SuiteModel>()
                    .map_err(|e| format!("--suite-models: {e}"))?,
            );
        }
        let mut config = SuiteConfig::new(mnist_dir, self.gpt_data_dir.clone(), mnist_bin);
        config.models = models;
        config.ks = self.suite_ks.clone();
        config.max_k = self.suite_max_k;
        config.cnn_max_k = self.suite_cnn_max_k;
        config.warmup_steps = self.suite_warmup;
        config.repeats = self.suite_repeats;
        config.precision = !self.suite_no_precision;
        config.mlp_steps = self.suite_mlp_steps;
        config.cnn_steps = self.suite_cnn_steps;
        config.gpt_steps = self.suite_gpt_steps;
        config.collective_mb = self.suite_mb.clone();
        config.collective_ks = self.suite_collective_ks.clone();
        config.collective_reps = self.suite_reps;
        config.rss_ks = self.suite_rss_ks.clone();
        config.startup_k = (self.suite_startup_k > 0).then_some(self.suite_startup_k);
        config.plan_bin = plan_bin.filter(|_| !self.suite_no_planner);
        if node_cost {
            config.node_cost = self.node_cost();
        }
        self.compute.apply(&mut config);
        Ok(config)
    }

    /// The suite with only its cost-of-a-node-step part (`bench --node-cost`).
    pub fn node_cost_config(&self, mnist_dir: PathBuf) -> Result<SuiteConfig, String> {
        let mut config = SuiteConfig::new(mnist_dir, self.gpt_data_dir.clone(), None);
        config.models.clear();
        config.precision = false;
        config.matmul_sizes.clear();
        config.gpt_6l384_steps = 0;
        config.libtorch = false;
        config.collective_mb.clear();
        config.rss_ks.clear();
        config.startup_k = None;
        config.node_cost = self.node_cost();
        if !config.node_cost.any() {
            return Err(
                "--node-cost: no node counts in --suite-node-cost-mlp-ks or \
                        --suite-node-cost-gpt-ks"
                    .into(),
            );
        }
        Ok(config)
    }
}
