//! Autocast (`TrainerConfig::autocast`): forward and backward passes in bf16 with f32 master
//! weights. The run trains as in f32 within bf16's rounding, yet not bit for bit (the bf16
//! path is taken); parameters and batch-norm statistics stay f32; a model that feeds f32
//! inputs to bf16 parameters is refused before any step. `cargo test --release --test
//! autocast`; the MNIST and nanoGPT accuracy bounds are in `examples/tests/autocast.rs`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{DType, Device, Tensor};
use gym_core::{
    Autocast, GymError, ImageBatch, InnerOptimizerConfig, NodeData, TrainModel, Trainer,
    TrainerConfig,
};
use gym_models::{MnistCnn, MnistCnnConfig};
use gym_strategies::{AllReduceConfig, DiLoCoCommunicatorConfig, DiLoCoConfig};
use tests::{Synthetic, SyntheticBatcher, flat_params, small_mlp};

fn data() -> NodeData<tests::Example> {
    NodeData::shared(
        Synthetic::new(1024, 16, 4, 1),
        Synthetic::new(128, 16, 4, 2),
    )
}

fn config(autocast: Option<Autocast>) -> TrainerConfig {
    TrainerConfig::new(2)
        .with_max_steps(Some(60))
        .with_batch_size(32)
        .with_val_size(Some(128))
        .with_val_interval(60)
        .with_autocast(autocast)
}

#[test]
fn bf16_trains_the_mlp_as_f32_does_within_its_rounding() {
    let strategy = DiLoCoConfig::new()
        .with_inner(InnerOptimizerConfig::new().with_lr(1e-2))
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(10));
    let fit = |autocast| {
        Trainer::new(config(autocast))
            .fit(small_mlp, &strategy, &data(), &SyntheticBatcher)
            .unwrap()
    };
    let (f32_run, bf16_run) = (fit(None), fit(Some(Autocast::Bf16)));
    let loss =
        |o: &gym_core::FitOutput<gym_models::Mlp>| o.report.final_validation().unwrap().global_loss;
    let (a, b) = (loss(&f32_run), loss(&bf16_run));
    assert!(a < 0.8, "the task is learned: {a}");
    assert!((a - b).abs() < 0.05 * a, "f32 {a} vs bf16 {b}");
    // Not vacuous: the bf16 passes ran (the parameters differ from f32's, slightly).
    let (pa, pb) = (flat_params(&f32_run.model), flat_params(&bf16_run.model));
    assert_ne!(pa, pb);
    let scale = pa.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = pa
        .iter()
        .zip(&pb)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff < 0.1 * scale, "{diff} vs {scale}");
    // The master weights stay f32.
    let mut dtypes = Dtypes(Vec::new());
    bf16_run.model.visit(&mut dtypes);
    assert!(dtypes.0.iter().all(|&d| d == DType::F32), "{:?}", dtypes.0);
    // Every step's loss is logged like f32's (finite, falling).
    let train = &bf16_run.report.train;
    assert!(train[59].train_loss < train[0].train_loss);
}

/// The type of every float tensor of a module: parameters and buffers.
struct Dtypes(Vec<DType>);

impl ModuleVisitor for Dtypes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push(param.val().dtype());
    }
}

#[test]
fn bf16_keeps_the_cnn_weights_and_batch_norm_statistics_in_f32() {
    use gym_data::{MnistBatcher, MnistDataset, MnistSplit};
    let dir = tests::shared_data("mnist");
    let data = NodeData::shared(
        MnistDataset::load(&dir, MnistSplit::Test).unwrap(),
        MnistDataset::load(&dir, MnistSplit::Test).unwrap(),
    );
    let out = Trainer::new(
        TrainerConfig::new(2)
            .with_max_steps(Some(3))
            .with_batch_size(8)
            .with_val_size(Some(16))
            .with_autocast(Some(Autocast::Bf16)),
    )
    .fit(
        |d: &Device| {
            let _guard = gym_core::rng::lock_backend_rng();
            MnistCnnConfig::new().init(d)
        },
        &AllReduceConfig::new(),
        &data,
        &MnistBatcher,
    )
    .unwrap();
    let model: &MnistCnn = &out.model;
    let mut dtypes = Dtypes(Vec::new());
    model.visit(&mut dtypes);
    // Weights, biases, gains and the running means and variances: 4 per batch norm.
    let layout = gym_core::ParamLayout::all_float(model);
    assert_eq!(dtypes.0.len(), layout.entries().len());
    assert!(dtypes.0.iter().all(|&d| d == DType::F32), "{:?}", dtypes.0);
    assert!(out.report.train.iter().all(|r| r.train_loss.is_finite()));
}

/// A model that feeds its f32 input straight to its (bf16, under autocast) weights.
#[derive(Module, Debug)]
struct Uncast {
    linear: Linear,
}

impl TrainModel for Uncast {
    type Batch = ImageBatch;

    fn loss(&self, batch: &ImageBatch) -> Tensor<1> {
        let x = batch.images.clone().flatten::<2>(1, 3);
        gym_models::cross_entropy(self.linear.forward(x), batch.targets.clone())
    }
}

#[test]
fn a_model_that_does_not_cast_its_inputs_is_refused_before_any_step() {
    let init = |d: &Device| {
        let _guard = gym_core::rng::lock_backend_rng();
        Uncast {
            linear: LinearConfig::new(16, 4).init(d),
        }
    };
    // In f32 it trains.
    Trainer::new(config(None))
        .fit(init, &AllReduceConfig::new(), &data(), &SyntheticBatcher)
        .unwrap();
    match Trainer::new(config(Some(Autocast::Bf16))).fit(
        init,
        &AllReduceConfig::new(),
        &data(),
        &SyntheticBatcher,
    ) {
        Err(GymError::InvalidConfig(why)) => {
            assert!(
                why.contains("autocast bf16") && why.contains("like_params"),
                "{why}"
            )
        }
        Err(other) => panic!("expected InvalidConfig, got {other}"),
        Ok(_) => panic!("a model mixing f32 and bf16 was accepted"),
    }
}
