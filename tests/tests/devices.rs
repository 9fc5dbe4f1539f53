//! Nodes on several devices of one process (rank r on `devices[r % len]`): here Burn's
//! CPU backends, flex beside ndarray or LibTorch, which share no kernels. `cargo test
//! --release -p tests --features ndarray --test devices` (and `--features tch` with
//! LibTorch installed).
#![cfg(any(feature = "ndarray", feature = "tch"))]
// Burn deprecates its ndarray and LibTorch backends but still ships them: the other
// backends at hand on a CPU.
#![allow(deprecated)]

use burn::tensor::Device;
use gym_core::{NodeData, Trainer, TrainerConfig};
use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};
use std::sync::Mutex;
use tests::{Synthetic, SyntheticBatcher, flat_params, max_abs_diff, small_mlp, small_mlp_data};

/// Rank r's tensor on `devices[r % 2]`: the all-reduce moves the contributions between the
/// backends, adds them in rank order, and hands each rank the result on its own device.
#[cfg(feature = "ndarray")]
#[test]
fn an_all_reduce_across_two_backends_is_the_rank_order_sum_on_each_ranks_device() {
    use gym_core::{InProcessGroup, ReduceOp};
    use tests::{host, rank_values};
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
#[cfg(feature = "ndarray")]
#[test]
fn allreduce_on_two_backends_trains_as_on_one() {
    use gym_strategies::AllReduceConfig;
    let data = small_mlp_data();
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

/// The CPU backends compiled in besides flex.
fn other_backends() -> Vec<Device> {
    [
        #[cfg(feature = "ndarray")]
        Device::ndarray(),
        #[cfg(feature = "tch")]
        Device::libtorch(),
    ]
    .into()
}

/// One seed, one start, whatever backend the nodes run on: `fit` draws the weights on the
/// host (`rng::host_device`: flex here) and moves them to the nodes' devices, and the data
/// order is the run's own, so a run on ndarray or LibTorch starts where the same run on
/// flex does and follows its curve. (LibTorch and the GPU backends have generators of their
/// own: drawn on their devices, their runs would start elsewhere.)
#[test]
fn a_seed_gives_the_same_start_and_curve_on_every_backend() {
    let data = small_mlp_data();
    let fit = |device: Device| {
        let built_on = Mutex::new(Vec::new());
        let config = TrainerConfig::new(2)
            .with_max_steps(Some(40))
            .with_batch_size(16)
            .with_val_size(Some(0))
            .with_seed(5);
        let run = Trainer::new(config)
            .with_devices(vec![device])
            .fit(
                |d: &Device| {
                    built_on.lock().unwrap().push(d.clone());
                    small_mlp(d)
                },
                &DiLoCoConfig::new()
                    .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(4)),
                &data,
                &SyntheticBatcher,
            )
            .expect("trains");
        (run, built_on.into_inner().unwrap())
    };
    let (on_flex, _) = fit(Device::flex());
    let a = &on_flex.report;
    let losses: Vec<f64> = a.train.iter().map(|r| r.train_loss).collect();
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(
        mean(&losses[35..]) < mean(&losses[..5]) - 0.05,
        "it trains: {losses:?}"
    );
    for device in other_backends() {
        let (on_other, built_on) = fit(device.clone());
        assert_eq!(
            built_on[0],
            Device::flex(),
            "{device:?}: the weights drawn on the host"
        );
        assert!(
            built_on[1..].iter().all(|d| d.clone().inner() == device),
            "{device:?}: the replicas live on the nodes' device"
        );
        let b = &on_other.report;
        assert_eq!(
            a.init_fingerprint, b.init_fingerprint,
            "{device:?}: initial weights"
        );
        assert_eq!(
            a.data_fingerprint, b.data_fingerprint,
            "{device:?}: data order"
        );
        // The first loss is the same weights on the same batch: the kernels' last bits apart.
        let first = (a.train[0].train_loss, b.train[0].train_loss);
        assert!(
            (first.0 - first.1).abs() <= 1e-6 * first.0.abs(),
            "{device:?}: first loss {first:?}"
        );
        for (x, y) in a.train.iter().zip(&b.train) {
            let gap = (x.train_loss - y.train_loss).abs();
            assert!(
                gap <= 1e-4 * x.train_loss.abs(),
                "{device:?}, step {}: {x:?} against {y:?}",
                x.step
            );
        }
        let apart = max_abs_diff(&flat_params(&on_flex.model), &flat_params(&on_other.model));
        assert!(apart < 1e-4, "{device:?}: final weights apart by {apart:e}");
    }
}
