//! The set-ups the planner's and the trace's tests share: the synthetic MLP and a tiny
//! nanoGPT on four simulated nodes, trained and planned alike (a training run's twin plan).

use burn::tensor::Device;
use gym_core::checkpoint::Checkpoint;
use gym_core::planner::{PlanConfig, RejoinBytes, peer_state_bytes};
use gym_core::{
    ComputeModel, Link, Network, NodeData, ParamLayout, SimulationConfig, Topology, TrainModel,
    TrainerConfig,
};
use gym_data::{TokenWindow, TokenWindows};
use gym_models::{Gpt, GptConfig};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Nodes of the twin runs.
pub const NODES: usize = 4;
/// Examples per node step.
pub const BATCH: usize = 8;
/// The run seed.
pub const SEED: u64 = 5;

/// Two islands of two on a slow wide-area link (20 MB/s, 20 ms), node 1 at half speed,
/// node 3 at 0.8, jitter 0.2: a cluster where traffic costs about as much as the MLP's
/// compute.
pub fn cluster() -> SimulationConfig {
    let wan = Link::symmetric(20e6, 0.02);
    SimulationConfig::new(
        Network::switch(Link::symmetric(1e9, 1e-4))
            .with_topology(Topology::Islands { size: 2, wan }),
    )
    .with_compute(ComputeModel::Modelled { flops_per_s: 2e6 })
    .with_node_speed(vec![1.0, 0.5, 1.0, 0.8])
    .with_jitter(0.2)
}

/// A twin training run of `steps` steps on `simulation`: [`NODES`] nodes of [`BATCH`]
/// examples, the twins' seed, no evaluation.
pub fn twin_config(simulation: SimulationConfig, steps: usize) -> TrainerConfig {
    TrainerConfig::new(NODES)
        .with_max_steps(Some(steps))
        .with_batch_size(BATCH)
        .with_val_size(Some(0))
        .with_seed(SEED)
        .with_simulation(Some(simulation))
}

/// The plan of [`crate::small_mlp`] on `simulation` for `steps` steps (no faults), and
/// the model's trainable layout.
pub fn mlp_plan(simulation: SimulationConfig, steps: usize) -> (PlanConfig, ParamLayout) {
    twin_plan(
        &crate::small_mlp(&Device::default().autodiff()),
        simulation,
        steps,
    )
}

/// The plan of `model` on [`NODES`] nodes of [`BATCH`] examples, with the twins' seed.
fn twin_plan<M: TrainModel>(
    model: &M,
    simulation: SimulationConfig,
    steps: usize,
) -> (PlanConfig, ParamLayout) {
    let layout = ParamLayout::trainable(model);
    let config = PlanConfig {
        num_nodes: NODES,
        steps,
        seed: SEED,
        params: layout.num_elements() as u64,
        shapes: None,
        step_flops: model.flops_per_example() * BATCH as f64,
        simulation,
        faults: None,
        rejoin_bytes: Default::default(),
    };
    (config, layout)
}

/// Tokens of the GPT twin's vocabulary.
pub const GPT_VOCAB: usize = 16;
/// The GPT twin's context, in tokens (a training example is one window of it).
pub const GPT_BLOCK: usize = 8;

/// The GPT twin: nanoGPT with 2 blocks of width 16 (2 heads) over a 16-token vocabulary and
/// a context of 8, 6,976 parameters in 28 tensors (vectors, square and wide matrices,
/// embeddings of two sizes).
pub fn gpt_config() -> GptConfig {
    GptConfig::new(GPT_VOCAB, GPT_BLOCK)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(16)
}

/// [`gpt_config`]'s model, its initial values drawn under
/// [`gym_core::rng::lock_backend_rng`] (as [`crate::small_mlp`]'s).
pub fn small_gpt(device: &Device) -> Gpt {
    let _guard = gym_core::rng::lock_backend_rng();
    let model = gpt_config().init(device).expect("a valid GPT");
    gym_core::rng::materialize(&model);
    model
}

/// A synthetic token stream for the GPT twin (hashed from the index: no data files): its
/// training windows (stride 1) and a few validation windows, shared by every node.
pub fn gpt_data() -> NodeData<TokenWindow> {
    let tokens: Arc<[u32]> = (0..2048u64)
        .map(|i| (gym_core::rng::derive_seed(3, &[i]) % GPT_VOCAB as u64) as u32)
        .collect();
    let train = TokenWindows::over(tokens.clone(), 0..1900, GPT_BLOCK, 1).expect("windows");
    let val = TokenWindows::over(tokens, 1900..2048, GPT_BLOCK, GPT_BLOCK).expect("windows");
    TokenWindows::shared(train, val)
}

/// The plan of [`small_gpt`] on `simulation` for `steps` steps (no faults), and the
/// model's trainable layout.
pub fn gpt_plan(simulation: SimulationConfig, steps: usize) -> (PlanConfig, ParamLayout) {
    twin_plan(&small_gpt(&Device::default().autodiff()), simulation, steps)
}

/// `config` writing a checkpoint before every step into `dir` (emptied first), which
/// changes nothing of the run: [`state_sizes`] reads what a rejoin's source sends.
pub fn checkpointed(config: TrainerConfig, steps: usize, dir: &Path) -> TrainerConfig {
    std::fs::remove_dir_all(dir).ok();
    config
        .with_log_dir(Some(dir.to_string_lossy().into_owned()))
        .with_run_name(Some("run".into()))
        .with_checkpoint_interval(Some(1))
        .with_keep_checkpoints(steps + 1)
}

/// The size of every node's encoded state before every step after 0 of a run trained
/// [`checkpointed`] into `dir`, by (step, rank): what a rejoin's source sends
/// ([`RejoinBytes::BySource`]); then empties `dir`.
pub fn state_sizes(steps: usize, dir: &Path) -> RejoinBytes {
    let mut sizes = BTreeMap::new();
    for next_step in 1..steps {
        let file = dir.join("run").join(Checkpoint::file_name(next_step));
        let (checkpoint, _) = Checkpoint::load(&file).expect("a checkpoint");
        for (rank, node) in checkpoint.nodes.iter().enumerate() {
            let bytes = peer_state_bytes(&node.model, &node.strategy).expect("a state");
            sizes.insert((next_step, rank), bytes);
        }
    }
    std::fs::remove_dir_all(dir).ok();
    RejoinBytes::BySource(Arc::new(move |step, source| sizes[&(step, source)]))
}
