//! The CIFAR CNN learns on a handful of CIFAR-like images with four simulated nodes.

use burn::data::dataset::Dataset;
use gym_core::{InnerOptimizerConfig, NodeData, Trainer, TrainerConfig};
use gym_data::{Cifar10, CifarBatcher};
use gym_models::CifarCnnConfig;
use gym_strategies::AllReduceConfig;
use tests::shared_data;

#[test]
fn the_cifar_cnn_trains_on_four_nodes() {
    let file = shared_data("cifar10").join("approx/test_classordered.bin.gz");
    let (train, _) = Cifar10::approx(&file, 0.2, 0).unwrap();
    // 32 images, validated on themselves: the loss on them must fall.
    let (few, _) = train.split_at(32);
    assert!(few.len() == 32 && few.class_counts().iter().filter(|&&c| c > 0).count() > 5);
    let data = NodeData::shared(few.clone(), few);
    let config = TrainerConfig::new(4)
        .with_max_steps(Some(12))
        .with_batch_size(8)
        .with_val_size(Some(32))
        .with_val_interval(12)
        .with_seed(1);
    let inner = InnerOptimizerConfig::new().with_lr(3e-3);
    let out = Trainer::new(config)
        .fit(
            // The model's layers at a quarter of their width, to keep the test fast.
            |d| {
                CifarCnnConfig::new()
                    .with_conv_channels([8, 16, 16])
                    .with_hidden(32)
                    .init(d)
            },
            &AllReduceConfig::new().with_inner(inner),
            &data,
            &CifarBatcher,
        )
        .unwrap();
    let report = &out.report;
    let first = &report.validation[0];
    let last = report.final_validation().unwrap();
    assert_eq!(last.step, 12);
    assert!(
        last.global_loss < 0.9 * first.global_loss,
        "loss {} → {}",
        first.global_loss,
        last.global_loss
    );
    assert!(last.global_accuracy.unwrap() > first.global_accuracy.unwrap());
}
