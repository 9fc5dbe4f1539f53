//! Checkpoints and exact resume through `Trainer::fit`, for every strategy: a run resumed
//! from a checkpoint ends with the same parameters, bit for bit, and the same records as
//! the run left alone. `cargo test --release -- resume`.

use gym_core::{
    ComputeModel, FitOutput, GymError, InnerOptimizerConfig, Network, NodeData, SimulationConfig,
    StrategyConfig, Trainer, TrainerConfig,
};
use gym_models::{Mlp, MlpConfig};
use gym_strategies::{
    AllReduceConfig, AsyncDiLoCoConfig, AveragingCommunicatorConfig, Codec, CompressionConfig,
    DeMoConfig, DesLocConfig, DiLoCoCommunicatorConfig, DiLoCoConfig, FedAvgConfig, MuLoCoConfig,
    NoLoCoCommunicatorConfig, NoLoCoConfig, PowerSgdConfig, Quantizer, SparseCommunicatorConfig,
    SparseLoCoConfig, SpartaConfig, SpartaDiLoCoConfig, StreamingDiLoCoConfig,
};
use std::path::{Path, PathBuf};
use tests::{SyntheticBatcher, flat_params, scratch_dir, small_mlp, small_mlp_data};
use tests::{assert_same_run, deterministic};

const STEPS: usize = 20;

fn data() -> NodeData<tests::Example> {
    small_mlp_data()
}

/// A small run on a simulated network with a straggler, evaluated every 4 steps.
fn config() -> TrainerConfig {
    TrainerConfig::new(4)
        .with_max_steps(Some(STEPS))
        .with_batch_size(8)
        .with_val_size(Some(16))
        .with_val_interval(4)
        .with_correlation_interval(Some(3))
        .with_seed(11)
        .with_simulation(Some(
            SimulationConfig::new("internet".parse::<Network>().unwrap())
                .with_compute(ComputeModel::Modelled { flops_per_s: 1e8 })
                .with_node_speed(vec![1.0, 1.0, 1.0, 0.5])
                .with_jitter(0.1),
        ))
}

fn fit(config: TrainerConfig, strategy: &dyn StrategyConfig) -> gym_core::Result<FitOutput<Mlp>> {
    Trainer::new(config).fit(small_mlp, strategy, &data(), &SyntheticBatcher)
}

fn checkpoint(dir: &Path, run: &str, next_step: usize) -> PathBuf {
    dir.join(run)
        .join(gym_core::checkpoint::Checkpoint::file_name(next_step))
}

fn inner() -> InnerOptimizerConfig {
    InnerOptimizerConfig::new().with_lr(3e-3)
}

/// Every strategy, with synchronisation every 5 steps where it has one.
fn strategies() -> Vec<(&'static str, Box<dyn StrategyConfig>)> {
    let diloco = |h| DiLoCoCommunicatorConfig::new().with_sync_interval(h);
    vec![
        (
            "allreduce",
            Box::new(AllReduceConfig::new().with_inner(inner())),
        ),
        (
            "allreduce-topk-ef",
            Box::new(AllReduceConfig::new().with_inner(inner()).with_compression(
                CompressionConfig::with_error_feedback(Codec::TopK {
                    k: 8,
                    chunk: 64,
                    values: Quantizer::F32,
                }),
            )),
        ),
        (
            "diloco",
            Box::new(
                DiLoCoConfig::new()
                    .with_inner(inner())
                    .with_communicator(diloco(5)),
            ),
        ),
        (
            "diloco-int8",
            Box::new(DiLoCoConfig::new().with_inner(inner()).with_communicator(
                diloco(5).with_compression(CompressionConfig::codec(Codec::Dense(
                    Quantizer::Int8 { chunk: 64 },
                ))),
            )),
        ),
        (
            "fedavg-islands",
            Box::new(
                FedAvgConfig::new().with_inner(inner()).with_communicator(
                    AveragingCommunicatorConfig::new()
                        .with_sync_interval(5)
                        .with_island_size(Some(2)),
                ),
            ),
        ),
        (
            "sparta",
            Box::new(
                SpartaConfig::new()
                    .with_inner(inner())
                    .with_communicator(SparseCommunicatorConfig::new().with_p(0.1)),
            ),
        ),
        (
            "sparta-diloco",
            Box::new(
                SpartaDiLoCoConfig::new()
                    .with_inner(inner())
                    .with_sparta(SparseCommunicatorConfig::new().with_p(0.1))
                    .with_diloco(diloco(5)),
            ),
        ),
        ("demo", Box::new(DeMoConfig::new().with_lr(1e-3))),
        (
            "streaming-diloco",
            Box::new(
                StreamingDiLoCoConfig::new()
                    .with_inner(inner())
                    .with_sync_interval(6)
                    .with_fragments(2)
                    .with_overlap(1),
            ),
        ),
        (
            "sparseloco",
            Box::new(
                SparseLoCoConfig::new()
                    .with_inner(inner())
                    .with_sync_interval(5),
            ),
        ),
        (
            "muloco",
            Box::new(
                MuLoCoConfig::new()
                    .with_communicator(gym_strategies::muloco_communicator().with_sync_interval(5)),
            ),
        ),
        (
            "desloc",
            Box::new(DesLocConfig::new().with_lr(3e-3).with_param_interval(2)),
        ),
        (
            "noloco",
            Box::new(
                NoLoCoConfig::new()
                    .with_communicator(NoLoCoCommunicatorConfig::new().with_sync_interval(5)),
            ),
        ),
        (
            "async-diloco",
            Box::new(
                AsyncDiLoCoConfig::new()
                    .with_inner(inner())
                    .with_sync_interval(5),
            ),
        ),
        (
            "powersgd",
            Box::new(PowerSgdConfig::new().with_inner(inner())),
        ),
    ]
}

#[test]
fn resume_every_strategy_continues_bit_for_bit_from_a_sync_step_and_from_another() {
    for (name, strategy) in strategies() {
        let alone = fit(config(), &*strategy).unwrap();
        let dir = scratch_dir("resume", name);
        let saved = fit(
            config()
                .with_log_dir(Some(dir.to_string_lossy().into_owned()))
                .with_run_name(Some("run".into()))
                .with_checkpoint_interval(Some(1))
                .with_keep_checkpoints(STEPS),
            &*strategy,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same_run(&format!("{name} (checkpointing)"), &alone, &saved);
        // Before step 7 (inside a round), before step 10 (after a synchronisation), and
        // before step 8 (Streaming DiLoCo's fragment prepared at step 7 is in flight).
        for next_step in [7, 8, 10] {
            let resumed = fit(
                config()
                    .with_log_dir(Some(dir.join("resumed").to_string_lossy().into_owned()))
                    .with_resume_from(Some(
                        checkpoint(&dir, "run", next_step)
                            .to_string_lossy()
                            .into_owned(),
                    )),
                &*strategy,
            )
            .unwrap_or_else(|e| panic!("{name} from {next_step}: {e}"));
            assert_same_run(
                &format!("{name} resumed before {next_step}"),
                &alone,
                &resumed,
            );
            // The resumed run's CSV logs hold every step, as the first run's do.
            let csv = std::fs::read_to_string(dir.join("resumed/run/train.csv")).unwrap();
            assert_eq!(csv.lines().count(), STEPS + 1, "{name}: train.csv rows");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn resume_refuses_a_damaged_checkpoint_or_one_from_another_model_or_strategy() {
    let dir = scratch_dir("resume", "refused");
    let diloco = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(5));
    fit(
        config()
            .with_max_steps(Some(4))
            .with_log_dir(Some(dir.to_string_lossy().into_owned()))
            .with_run_name(Some("run".into()))
            .with_checkpoint_interval(Some(2)),
        &diloco,
    )
    .unwrap();
    let file = checkpoint(&dir, "run", 4);
    let resume = |path: &Path| {
        config()
            .with_max_steps(Some(4))
            .with_resume_from(Some(path.to_string_lossy().into_owned()))
    };
    // Truncated by one byte.
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    let err = fit(resume(&cut), &diloco).map(|_| ()).unwrap_err();
    assert!(
        matches!(err, GymError::Checkpoint(_)) && err.to_string().contains("truncated"),
        "{err}"
    );
    // Another model: a wider hidden layer.
    let wide = |d: &burn::tensor::Device| {
        MlpConfig::new()
            .with_input(16)
            .with_hidden(48)
            .with_classes(4)
            .init(d)
    };
    let err = Trainer::new(resume(&file))
        .fit(wide, &diloco, &data(), &SyntheticBatcher)
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("[16, 48]"), "{err}");
    // Another strategy, and another setting of the same strategy.
    let err = fit(resume(&file), &AllReduceConfig::new())
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("`allreduce`"), "{err}");
    let h7 = DiLoCoConfig::new()
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(7));
    let err = fit(resume(&file), &h7).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("sync_interval"), "{err}");
    // The folder: its newest checkpoint.
    assert!(fit(resume(&dir.join("run")), &diloco).is_ok());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resume_after_an_interruption_ends_where_the_run_left_alone_does() {
    let diloco = DiLoCoConfig::new()
        .with_inner(inner())
        .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(5));
    let dir = scratch_dir("resume", "interrupt");
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    // Interrupted before it starts any step: nothing to save, nothing taken.
    let stopped = Trainer::new(
        config()
            .with_log_dir(Some(dir.to_string_lossy().into_owned()))
            .with_run_name(Some("run".into())),
    )
    .with_interrupt(flag.clone())
    .fit(small_mlp, &diloco, &data(), &SyntheticBatcher)
    .unwrap();
    assert_eq!(stopped.report.interrupted_at, Some(0));
    assert!(stopped.report.train.is_empty());
    // Interrupted from another thread while it runs: it stops at a step boundary common to
    // every node and saves a checkpoint there, which resumes to the same end.
    flag.store(false, std::sync::atomic::Ordering::SeqCst);
    // Set once the run has logged 3 steps (not after a fixed time: the run may still be
    // setting up then, on a loaded machine).
    let setter = {
        let flag = flag.clone();
        let log = dir.join("long").join("train.csv");
        std::thread::spawn(move || {
            tests::wait_for_steps(&log, 3);
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let stopped = Trainer::new(
        config()
            .with_max_steps(Some(2000))
            .with_log_dir(Some(dir.to_string_lossy().into_owned()))
            .with_run_name(Some("long".into())),
    )
    .with_interrupt(flag)
    .fit(small_mlp, &diloco, &data(), &SyntheticBatcher)
    .unwrap();
    setter.join().unwrap();
    let at = stopped.report.interrupted_at.expect("interrupted");
    assert!(at > 0 && at < 2000, "{at}");
    assert_eq!(stopped.report.train.len(), at);
    let file = stopped.report.checkpoint.clone().expect("a checkpoint");
    assert_eq!(file, checkpoint(&dir, "long", at));
    let resumed = fit(
        config()
            .with_max_steps(Some(2000))
            .with_resume_from(Some(file.to_string_lossy().into_owned())),
        &diloco,
    )
    .unwrap();
    let long_alone = fit(config().with_max_steps(Some(2000)), &diloco).unwrap();
    assert_same_run("interrupted", &long_alone, &resumed);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resume_with_a_larger_max_steps_extends_the_run_and_its_schedule_holds_its_last_rate() {
    let dir = scratch_dir("resume", "extend");
    let diloco = |cosine: bool| {
        DiLoCoConfig::new()
            .with_inner(
                inner().with_schedule(
                    gym_core::LrScheduleConfig::new()
                        .with_warmup_steps(2)
                        .with_cosine(cosine),
                ),
            )
            .with_communicator(DiLoCoCommunicatorConfig::new().with_sync_interval(4))
    };
    let first = |cosine: bool, run: &str| {
        fit(
            config()
                .with_max_steps(Some(12))
                .with_log_dir(Some(dir.to_string_lossy().into_owned()))
                .with_run_name(Some(run.into()))
                .with_checkpoint_interval(Some(6)),
            &diloco(cosine),
        )
        .unwrap()
    };
    let extend = |cosine: bool, run: &str, steps: usize| {
        fit(
            config().with_max_steps(Some(steps)).with_resume_from(Some(
                checkpoint(&dir, run, 12).to_string_lossy().into_owned(),
            )),
            &diloco(cosine),
        )
    };
    // A constant rate: 12 steps extended to 20 are the 20-step run, bit for bit.
    first(false, "flat");
    let extended = extend(false, "flat", STEPS).unwrap();
    let straight = fit(config(), &diloco(false)).unwrap();
    assert_eq!(extended.report.schedule_steps, Some(12));
    assert_eq!(straight.report.schedule_steps, None);
    assert_eq!(flat_params(&extended.model), flat_params(&straight.model));
    let rows = |o: &FitOutput<Mlp>| o.report.train.iter().map(deterministic).collect::<Vec<_>>();
    assert_eq!(rows(&extended), rows(&straight));
    assert_eq!(extended.report.comm, straight.report.comm);
    assert_eq!(extended.report.simulated, straight.report.simulated);
    // Cosine over 12 steps: the rate of step 11 holds for steps 12-19, where Burn's cosine
    // would climb back.
    let before = first(true, "cosine");
    let extended = extend(true, "cosine", STEPS).unwrap();
    let lr = |o: &FitOutput<Mlp>, step: usize| o.report.train[step].lr;
    assert!(lr(&before, 11) < lr(&before, 2));
    for step in 0..12 {
        assert_eq!(lr(&extended, step).to_bits(), lr(&before, step).to_bits());
    }
    for step in 12..STEPS {
        assert_eq!(
            lr(&extended, step).to_bits(),
            lr(&before, 11).to_bits(),
            "{step}"
        );
    }
    // Its own checkpoints extend again; a shorter run is refused.
    let err = extend(true, "cosine", 8)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not shortened") && err.contains("12 steps"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
