//! The MNIST CNN's random affine augmentation (the original's `RandomAffine(10°, 10%)`):
//! drawn from each node's own stream, so a run is the same bits from the same seed; it
//! changes training (the losses differ from a run without it) but not evaluation (the
//! initial evaluation, before any step, is the same with and without it).

use burn::data::dataset::transform::PartialDataset;
use gym_core::{NodeData, Trainer, TrainerConfig};
use gym_data::{MnistBatcher, MnistDataset, MnistSplit};
use gym_models::MnistCnnConfig;
use gym_models::augment::RandomAffineConfig;
use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};

fn run(augment: bool) -> gym_core::RunReport {
    let dir = tests::shared_data("mnist");
    // The test split trains; 64 of its images validate (the final evaluation covers all
    // of the validation set).
    let data = NodeData::shared(
        MnistDataset::load(&dir, MnistSplit::Test).unwrap(),
        PartialDataset::new(MnistDataset::load(&dir, MnistSplit::Test).unwrap(), 0, 64),
    );
    let config = TrainerConfig::new(2)
        .with_max_steps(Some(3))
        .with_batch_size(8)
        .with_val_size(Some(16))
        .with_val_interval(100);
    Trainer::new(config)
        .fit(
            move |d: &burn::tensor::Device| {
                let _guard = gym_core::rng::lock_backend_rng();
                MnistCnnConfig::new()
                    .with_augment(augment.then(RandomAffineConfig::new))
                    .init(d)
            },
            &DiLoCoConfig::new()
                .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(2)),
            &data,
            &MnistBatcher,
        )
        .unwrap()
        .report
}

#[test]
fn augmentation_is_reproducible_and_acts_only_in_training() {
    let (a, b, plain) = (run(true), run(true), run(false));
    let losses =
        |r: &gym_core::RunReport| -> Vec<f64> { r.train.iter().map(|t| t.train_loss).collect() };
    assert_eq!(losses(&a), losses(&b), "same seed, same bits");
    assert_ne!(
        losses(&a),
        losses(&plain),
        "the training images are transformed"
    );
    // Step 0's evaluation runs on the unchanged initial model: augmentation is off there.
    assert_eq!(a.validation[0].global_loss, plain.validation[0].global_loss);
    assert!(a.train.iter().all(|t| t.train_loss.is_finite()));
}
