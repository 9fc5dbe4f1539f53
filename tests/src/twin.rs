//! The set-up the planner's and the trace's tests share: the synthetic MLP on four
//! simulated nodes, trained and planned alike (a training run's twin plan).

use burn::tensor::Device;
use gym_core::planner::PlanConfig;
use gym_core::{ComputeModel, Link, Network, ParamLayout, SimulationConfig, Topology, TrainModel};

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

/// The plan of [`crate::small_mlp`] on `simulation` for `steps` steps (no faults), and
/// the model's trainable layout.
pub fn mlp_plan(simulation: SimulationConfig, steps: usize) -> (PlanConfig, ParamLayout) {
    let model = crate::small_mlp(&Device::default().autodiff());
    let layout = ParamLayout::trainable(&model);
    let config = PlanConfig {
        num_nodes: NODES,
        steps,
        seed: SEED,
        params: layout.num_elements() as u64,
        step_flops: model.flops_per_example() * BATCH as f64,
        simulation,
        faults: None,
        rejoin_bytes: Default::default(),
    };
    (config, layout)
}
