//! Nodes on several devices of one process (rank r on `devices[r % len]`): here Burn's two
//! CPU backends, flex and ndarray, which share no kernels. `cargo test --release -p tests
//! --features ndarray --test devices`.
#![cfg(feature = "ndarray")]
// Burn deprecates its ndarray backend but still ships it: the second backend at hand on CPU.
#![allow(deprecated)]

use burn::tensor::Device;
use gym_core::{InProcessGroup, NodeData, ReduceOp, Trainer, TrainerConfig};
use gym_strategies::AllReduceConfig;
use tests::{Synthetic, SyntheticBatcher, flat_params, host, max_abs_diff, rank_values, small_mlp};

/// Rank r's tensor on `devices[r % 2]`: the all-reduce moves the contributions between the
/// backends, adds them in rank order, and hands each rank the result on its own device.
#[test]
fn an_all_reduce_across_two_backends_is_the_rank_order_sum_on_each_ranks_device() {
    let devices = [Device::flex(), Device::ndarray()];
    for n in [257, 100_003] {
        let got = InProcessGroup::new(4)
            .run(|c| {
                let device = &devices[c.rank() % 2];
                let values = rank_values(c.rank(), n);
                let t = burn::tensor::Tensor::<1>::from_data(
                    burn::tensor::TensorData::new(values, [n]),
                    device,
                );
                let out = c.all_reduce(t, ReduceOp::Sum).unwrap();
                (out.device() == *device, host(out))
            })
            .unwrap();
        let mut reference = rank_values(0, n);
        for r in 1..4 {
            for (a, b) in reference.iter_mut().zip(rank_values(r, n)) {
                *a += b;
            }
        }
        for (rank, r) in got.into_iter().enumerate() {
            let (on_own_device, values) = r.unwrap();
            assert!(on_own_device, "rank {rank}: result on another device");
            assert_eq!(values, reference, "rank {rank}, {n} values");
        }
    }
}

/// AllReduce with the nodes alternating between flex and ndarray trains as on flex alone:
/// every node applies the same averaged gradient, whatever backend computed its share.
#[test]
fn allreduce_on_two_backends_trains_as_on_one() {
    let data = NodeData::shared(Synthetic::new(1024, 16, 4, 1), Synthetic::new(64, 16, 4, 2));
    let fit = |devices: Vec<Device>| {
        let config = TrainerConfig::new(4)
            .with_max_steps(Some(10))
            .with_batch_size(16)
            .with_val_size(Some(0))
            .with_seed(3);
        Trainer::new(config)
            .with_devices(devices)
            .fit(small_mlp, &AllReduceConfig::new(), &data, &SyntheticBatcher)
            .expect("trains")
    };
    let one = fit(vec![Device::flex()]);
    let two = fit(vec![Device::flex(), Device::ndarray()]);
    // The run's starting weights: `fit` draws them from its seed.
    let start = flat_params(&gym_core::rng::init_seeded(
        &Device::flex().autodiff(),
        3,
        small_mlp,
    ));
    let moved = max_abs_diff(&flat_params(&one.model), &start);
    let apart = max_abs_diff(&flat_params(&one.model), &flat_params(&two.model));
    assert!(moved > 1e-3, "training moved the parameters by {moved}");
    // Kernels differ in the last bits between backends, nothing more.
    assert!(
        apart < 1e-4 * moved.max(1.0),
        "max |Δ| = {apart:e} (moved {moved:e})"
    );
    assert_eq!(one.report.comm, two.report.comm, "traffic");
}
