//! `Trainer::fit_node`, one node per call, trains as `Trainer::fit` does: with every node's
//! call on its own thread over an in-process group, the final model, master, traffic,
//! simulated clocks and every logged loss are the bits of the one `fit`. The MPI test
//! (`--features mpi`) runs the same cases with one process per node.

use burn::tensor::Device;
use gym_core::{
    FitOutput, GymError, InProcessGroup, NodeData, StrategyConfig, Trainer, TrainerConfig,
};
use gym_models::Mlp;
use tests::{
    Synthetic, SyntheticBatcher, one_node_per_process_cases, one_node_per_process_config,
    run_digest, small_mlp,
};

const K: usize = 4;

fn data() -> NodeData<tests::Example> {
    NodeData::shared(Synthetic::new(1024, 16, 4, 1), Synthetic::new(64, 16, 4, 2))
}

/// Every node of `config` as its own `fit_node` call, on its own thread.
fn each_node(config: &TrainerConfig, strategy: &dyn StrategyConfig) -> Vec<FitOutput<Mlp>> {
    let k = config.num_nodes;
    let group = match &config.simulation {
        Some(sim) => InProcessGroup::simulated(k, sim.network.clone()),
        None => InProcessGroup::new(k),
    };
    let data = data();
    std::thread::scope(|s| {
        let nodes: Vec<_> = (0..k)
            .map(|rank| {
                let (comm, data) = (group.handle(rank), &data);
                s.spawn(move || {
                    Trainer::new(config.clone())
                        .fit_node(comm, small_mlp, strategy, data, &SyntheticBatcher)
                        .expect("the node trains")
                })
            })
            .collect();
        nodes.into_iter().map(|n| n.join().unwrap()).collect()
    })
}

#[test]
fn each_node_on_its_own_fit_node_gives_the_bits_of_one_fit() {
    for (name, strategy, simulated) in one_node_per_process_cases() {
        let config = one_node_per_process_config(K, 20, 8, 32, simulated);
        let whole = Trainer::new(config.clone())
            .fit(small_mlp, strategy.as_ref(), &data(), &SyntheticBatcher)
            .unwrap();
        let expected = run_digest(&whole);
        // Not vacuous: the run learned, and reports what the case asks for.
        let train = &whole.report.train;
        assert!(train[19].train_loss < train[0].train_loss, "{name}");
        assert_eq!(whole.report.simulated.len(), if simulated { K } else { 0 });
        assert_eq!(whole.report.validation.len(), 3, "{name}: steps 0, 10, 20");
        for (rank, node) in each_node(&config, strategy.as_ref()).iter().enumerate() {
            assert_eq!(run_digest(node), expected, "{name}, rank {rank}");
        }
    }
}

#[test]
fn only_rank_zero_writes_the_run_folder() {
    let dir = std::env::temp_dir().join(format!("gym-fit-node-{}", std::process::id()));
    let (_, strategy, _) = one_node_per_process_cases().remove(0);
    let config = one_node_per_process_config(K, 12, 8, 32, false)
        .with_log_dir(Some(dir.to_string_lossy().into_owned()));
    let nodes = each_node(&config, strategy.as_ref());
    // One name for the run (rank 0's, with its time of day), one folder.
    assert!(
        nodes
            .iter()
            .all(|n| n.report.run_name == nodes[0].report.run_name)
    );
    let folders: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(folders.len(), 1);
    let run = dir.join(&nodes[0].report.run_name);
    let train = std::fs::read_to_string(run.join("train.csv")).unwrap();
    assert_eq!(
        train.lines().count(),
        1 + 12,
        "a header and every step once"
    );
    let validation = std::fs::read_to_string(run.join("validation.csv")).unwrap();
    assert_eq!(validation.lines().count(), 1 + 3, "steps 0, 10 and 12");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn fit_node_refuses_what_it_cannot_run_yet() {
    let group = InProcessGroup::new(2);
    let strategy = gym_strategies::AllReduceConfig::new();
    let fit = |config: TrainerConfig| {
        Trainer::new(config)
            .fit_node(
                group.handle(0),
                |d: &Device| small_mlp(d),
                &strategy,
                &data(),
                &SyntheticBatcher,
            )
            .err()
            .map(|e| match e {
                GymError::InvalidConfig(why) => why,
                other => panic!("expected InvalidConfig, got {other}"),
            })
            .expect("refused")
    };
    let two = one_node_per_process_config(2, 5, 8, 0, false);
    assert!(fit(one_node_per_process_config(3, 5, 8, 0, false)).contains("2 ranks"));
    let faults: gym_core::faults::FaultSchedule = "crash:1@2".parse().unwrap();
    assert!(fit(two.clone().with_faults(Some(faults))).contains("fault schedule"));
    assert!(
        fit(two.clone().with_resume_from(Some("nowhere".into()))).contains("resuming"),
        "refused before the file is looked for"
    );
}
