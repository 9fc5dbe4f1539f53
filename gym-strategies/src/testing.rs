//! Test doubles shared by the strategies' tests: what a node's module needs to be built and
//! stepped by hand (with gym-core's [`FlatReplica`]).

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{NodeInfo, ParamLayout, Replica};

pub(crate) use gym_core::FlatReplica;

/// A flat tensor of `values`.
pub(crate) fn flat(values: &[f32]) -> Tensor<1> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        &Device::default(),
    )
}

/// A flat tensor's values.
pub(crate) fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 values")
}

/// Node `k`'s move at step (or round) `t`, over `n` values: distinct per node and step,
/// in [−0.4, 0.56).
pub(crate) fn drift(k: usize, t: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((k * 31 + t * 17 + i * 7) % 23) as f32 / 23.0 - 0.4)
        .collect()
}

/// A layout to hand to `NodeInfo` (modules that read only the initial parameters).
pub(crate) fn any_layout() -> ParamLayout {
    let device = Device::default().autodiff();
    ParamLayout::trainable(&burn::nn::LinearConfig::new(1, 1).init(&device))
}

/// Two linear layers of 13×7 and 7×8 (+ biases): four parameters of 7 to 91 elements.
#[derive(burn::module::Module, Debug)]
struct TwoLinear {
    a: burn::nn::Linear,
    b: burn::nn::Linear,
}

/// The layout of [`TwoLinear`]: parameters of several sizes, each of at least 7 elements.
pub(crate) fn two_linear_layout() -> ParamLayout {
    let d = Device::default().autodiff();
    let m = TwoLinear {
        a: burn::nn::LinearConfig::new(13, 7).init(&d),
        b: burn::nn::LinearConfig::new(7, 8).init(&d),
    };
    ParamLayout::trainable(&m)
}

/// What node `rank` of `k` knows, starting from `initial`, all nodes of speed 1.
pub(crate) fn node_info<'a>(
    rank: usize,
    k: usize,
    initial: Tensor<1>,
    layout: &'a ParamLayout,
    speeds: &'a [f64],
    device: &'a Device,
) -> NodeInfo<'a> {
    NodeInfo {
        rank,
        world_size: k,
        max_steps: 100,
        seed: 5,
        device,
        layout,
        initial_params: initial,
        node_speeds: speeds,
        faults: false,
    }
}

/// Runs `steps` steps of the module `config` builds on `k` nodes whose flat parameters are
/// `n` values starting at 1 (`layout` is what their `NodeInfo` names), each node's inner
/// phase moving it by [`drift`] before the module communicates; every node's parameters
/// after each step, and its exposed communication time when `network` (with that much
/// compute per step) is given. With `resume_at`, each node saves its module's state before
/// that step and continues with a fresh module that loaded it.
pub(crate) fn run_module(
    config: &dyn crate::communicate::CommunicationModuleConfig,
    k: usize,
    steps: usize,
    (layout, n): (&ParamLayout, usize),
    network: Option<(gym_core::Network, f64)>,
    resume_at: Option<usize>,
) -> (Vec<Vec<Vec<f32>>>, Vec<f64>) {
    use gym_core::{Collective, InProcessGroup, StepContext};
    let group = match &network {
        Some((net, _)) => InProcessGroup::simulated(k, net.clone()),
        None => InProcessGroup::new(k),
    };
    let results = group
        .run(|comm: Collective| {
            let (device, speeds) = (Device::default(), vec![1.0; k]);
            let initial = flat(&vec![1.0; n]);
            let info = node_info(comm.rank(), k, initial.clone(), layout, &speeds, &device);
            let mut module = config.init(&info).unwrap();
            let mut replica = FlatReplica(initial);
            let mut after = Vec::new();
            for t in 0..steps {
                if resume_at == Some(t) {
                    let saved = module.save_state().unwrap();
                    module = config.init(&info).unwrap();
                    module.load_state(&saved).unwrap();
                }
                if let Some((_, compute_s)) = network {
                    comm.compute(compute_s);
                }
                let moved = replica.0.clone() - flat(&drift(comm.rank(), t, n));
                replica.set_params(moved);
                let mut ctx = StepContext {
                    rank: comm.rank(),
                    world_size: k,
                    step: t,
                    max_steps: steps,
                    replica: &mut replica,
                    collective: &comm,
                    layout,
                };
                module.communicate(&mut ctx).unwrap();
                after.push(host(replica.0.clone()));
            }
            (after, comm.simulated_time().map_or(0.0, |t| t.comm_s))
        })
        .unwrap();
    results.into_iter().map(|r| r.unwrap()).unzip()
}
