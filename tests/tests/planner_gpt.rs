//! The planner gives the simulated seconds and bytes of training a tiny nanoGPT (two
//! blocks, a synthetic token stream) on four simulated nodes, for every strategy and codec
//! that plans, DeMo and PowerSGD included, with and without faults: planned from the
//! model's layout, and from the shapes its configuration gives without building it.

use burn::tensor::Device;
use gym_core::faults::FaultSchedule;
use gym_core::planner::{PlanConfig, plan};
use gym_core::{ParamLayout, RunReport, StrategyConfig, Trainer};
use gym_data::TokenBatcher;
use gym_strategies::compress::PowerSgdCompressionConfig;
use gym_strategies::{DeMoConfig, PowerSgdConfig};
use std::path::Path;
use tests::twin::{
    checkpointed, cluster, gpt_config, gpt_data, gpt_plan, small_gpt, state_sizes, twin_config,
};
use tests::twin_strategies::{
    more_strategies, overlapped_strategies, shaped_strategies, strategies,
};

const STEPS: usize = 8;

/// Trains the GPT twin with `strategy`, under `faults` checkpointing into their folder
/// (for [`state_sizes`]).
fn train(strategy: &dyn StrategyConfig, faults: Option<(&FaultSchedule, &Path)>) -> RunReport {
    let mut config = twin_config(cluster(), STEPS);
    if let Some((faults, dir)) = faults {
        config = checkpointed(config.with_faults(Some(faults.clone())), STEPS, dir);
    }
    Trainer::new(config)
        .fit(small_gpt, strategy, &gpt_data(), &TokenBatcher)
        .expect("trains")
        .report
}

fn assert_same(plan: &RunReport, trained: &RunReport, case: &str) {
    assert_eq!(plan.simulated, trained.simulated, "{case}: clocks");
    assert_eq!(plan.comm, trained.comm, "{case}: traffic");
    assert_eq!(plan.elastic, trained.elastic, "{case}: work lost");
    assert_eq!(plan.goodput(), trained.goodput(), "{case}: goodput");
    assert!(
        trained.simulated_comm_s().unwrap() > 0.0,
        "{case}: the case exercises communication"
    );
}

#[test]
fn planning_the_gpt_gives_the_simulated_time_and_bytes_of_training() {
    let (config, layout) = gpt_plan(cluster(), STEPS);
    for (name, strategy) in strategies()
        .into_iter()
        .chain(more_strategies())
        .chain(overlapped_strategies())
        .chain(shaped_strategies())
    {
        let trained = train(&*strategy, None);
        let planned =
            plan(&config, &*strategy, Some(&layout)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same(&planned, &trained, name);
    }
}

/// The shapes from the configuration alone are the layout's, in its order; DeMo and
/// PowerSGD planned from them are training's, and with another setting they are not.
#[test]
fn the_gpt_s_shapes_from_its_configuration_plan_demo_and_powersgd() {
    let model = small_gpt(&Device::default().autodiff());
    let layout = ParamLayout::trainable(&model);
    let shapes = gpt_config().param_shapes();
    let from_layout: Vec<Vec<usize>> = layout.entries().iter().map(|e| e.shape.clone()).collect();
    assert_eq!(shapes, from_layout);
    let (config, _) = gpt_plan(cluster(), STEPS);
    let by_shapes = PlanConfig {
        shapes: Some(shapes),
        ..config
    };
    let powersgd = |rank: usize| {
        PowerSgdConfig::new().with_compression(PowerSgdCompressionConfig::new().with_rank(rank))
    };
    let cases: [(&dyn StrategyConfig, &dyn StrategyConfig); 2] = [
        (
            &DeMoConfig::new().with_compression_chunk(8),
            &DeMoConfig::new().with_compression_chunk(16),
        ),
        (&powersgd(2), &powersgd(1)),
    ];
    for (strategy, other) in cases {
        let trained = train(strategy, None);
        let planned = plan(&by_shapes, strategy, None).unwrap();
        assert_same(&planned, &trained, &strategy.name());
        let wrong = plan(&by_shapes, other, None).unwrap();
        assert_ne!(wrong.comm, trained.comm, "{}", strategy.name());
    }
}

/// Under faults (a leave and its rejoin with a slow node, a cut between the islands): a
/// rejoin's source sends its encoded state, measured from training's checkpoints.
#[test]
fn planning_the_gpt_under_faults_gives_the_simulated_time_and_bytes_of_training() {
    let dir = std::env::temp_dir().join(format!("gym-planner-gpt-{}", std::process::id()));
    let (config, layout) = gpt_plan(cluster(), STEPS);
    let cases: Vec<(&str, Box<dyn StrategyConfig>)> = strategies()
        .into_iter()
        .chain(shaped_strategies())
        .chain(overlapped_strategies())
        .filter(|(name, _)| {
            [
                "allreduce int8",
                "diloco H=3",
                "sparta delayed 2, partitioned",
                "streaming diloco F=2 H=4 overlap 1",
                "diloco H=3 quorum 2, grace",
            ]
            .contains(name)
                || name.starts_with("demo")
                || name.starts_with("noloco")
                || name.starts_with("desloc")
                || name.contains("powersgd")
                || name.starts_with("eager diloco H=3")
                || name.starts_with("async diloco H=4")
        })
        .collect();
    for spec in ["leave:1@2+2;slow:3@0+8x0.7", "cut:0-1@3+2"] {
        let faults: FaultSchedule = spec.parse().unwrap();
        for (name, strategy) in &cases {
            let case = format!("{name} under {spec}");
            let trained = train(&**strategy, Some((&faults, &dir)));
            let config = PlanConfig {
                faults: Some(faults.clone()),
                rejoin_bytes: state_sizes(STEPS, &dir),
                ..config.clone()
            };
            let planned =
                plan(&config, &**strategy, Some(&layout)).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_same(&planned, &trained, &case);
            assert!(!trained.elastic.faults.is_empty(), "{case}: faults happen");
        }
    }
}
