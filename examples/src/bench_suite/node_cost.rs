//! Part 6 of the suite, the cost of a node-step as the nodes multiply: the CPU time one
//! node's training step takes when K nodes share the process, for K from tens to
//! thousands (`bench --node-cost`; with `--suite` too, after the other parts).
//!
//! A simulated node should cost the same whether it shares the process with 15 others or
//! with 1,023. What can make it cost more is state the node threads share: a process-wide
//! lock every tensor operation takes, a sweep that visits every node's graphs after each
//! backward (Burn's autodiff registry before `vendor/burn-autodiff`), the allocator's
//! arenas, the nodes' turns on the cores. The table sets each K against the first (the
//! smallest), so that a cost growing with K shows as a ratio above 1.
//!
//! The set-up is DiLoCo with H = 10 (the nodes all-reduce their models every ten steps, so
//! the collective's share is in the figure), batch 32 of MNIST on the MLP, and the suite's
//! small GPT with 16 sequences per node. Each figure is the process's CPU time (user and
//! system, every thread) of a run of W + N steps minus that of a run of W steps, divided by
//! K × N node-steps: start-up, model initialisation and the first round's page faults are in
//! both runs and cancel. N is chosen so that every K times about the same number of
//! node-steps.

use burn::tensor::Device;
use gym_data::MnistBatcher;
use gym_models::MlpConfig;

use super::overhead::{GPT_BATCH, StepTiming, gpt_data, mnist_data};
use super::{SuiteConfig, SuiteResult, backend_tag, median};
use crate::runner::BoxError;

/// DiLoCo's H in these runs: the set-up, a synchronisation every ten steps.
const SYNC_INTERVAL: usize = 10;
/// MNIST examples per node per step.
const MLP_BATCH: usize = 32;

/// What the part runs.
#[derive(Debug, Clone)]
pub struct NodeCostConfig {
    /// Node counts of the MLP's rows (empty: no MLP rows).
    pub mlp_ks: Vec<usize>,
    /// Node counts of the small GPT's rows (empty: no GPT rows).
    pub gpt_ks: Vec<usize>,
    /// Node-steps each MLP figure times (N = this ÷ K, rounded up to whole rounds).
    pub mlp_node_steps: usize,
    /// Node-steps each GPT figure times.
    pub gpt_node_steps: usize,
    /// Timings of each row; the figures are their median.
    pub repeats: usize,
}

impl Default for NodeCostConfig {
    /// The rows: the MLP at K = 16, 64, 256, 1,024 and the GPT at 16 and 64, about
    /// 20,000 MLP node-steps and 2,500 GPT node-steps a figure, the median of 3 (about 6
    /// minutes on 2 cores).
    fn default() -> Self {
        NodeCostConfig {
            mlp_ks: vec![16, 64, 256, 1024],
            gpt_ks: vec![16, 64],
            mlp_node_steps: 20_480,
            gpt_node_steps: 2_560,
            repeats: 3,
        }
    }
}

impl NodeCostConfig {
    /// No rows: the part is skipped.
    pub fn off() -> Self {
        NodeCostConfig {
            mlp_ks: Vec::new(),
            gpt_ks: Vec::new(),
            ..NodeCostConfig::default()
        }
    }

    /// Whether the part has any row to run.
    pub fn any(&self) -> bool {
        self.mlp_ks.iter().chain(&self.gpt_ks).any(|&k| k > 0)
    }

    /// The largest K of any row (what the process's allocator is set for).
    pub fn max_k(&self) -> usize {
        self.mlp_ks
            .iter()
            .chain(&self.gpt_ks)
            .copied()
            .max()
            .unwrap_or(0)
    }
}

/// The timed steps for `k` nodes: `node_steps ÷ k`, at least two rounds, in whole rounds.
pub fn timed_steps(node_steps: usize, k: usize) -> usize {
    let steps = node_steps.div_ceil(k.max(1)).max(2 * SYNC_INTERVAL);
    steps.div_ceil(SYNC_INTERVAL) * SYNC_INTERVAL
}

/// Runs the part's rows and adds its table and figures to `out`.
pub(super) fn node_cost(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let part = &config.node_cost;
    let tag = backend_tag();
    let cores = out.machine.cores;
    let mut rows = vec![
        "| model | K | timed steps | CPU ms per node-step | ÷ first row | wall ms per node-step | cores busy |"
            .to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let mnist = match part.mlp_ks.iter().any(|&k| k > 0) {
        true => Some(mnist_data(config)?),
        false => None,
    };
    let gpt = match part.gpt_ks.iter().any(|&k| k > 0) {
        true => Some(gpt_data(config, (2, 2, 64), 64)?),
        false => None,
    };
    let device = Device::default();
    let models = [
        ("mlp", &part.mlp_ks, part.mlp_node_steps),
        ("gpt", &part.gpt_ks, part.gpt_node_steps),
    ];
    for (name, ks, node_steps) in models {
        let mut first: Option<f64> = None;
        for &k in ks.iter().filter(|&&k| k > 0) {
            let steps = timed_steps(node_steps, k);
            eprintln!("node cost: {name} on {k} nodes, {steps} timed steps …");
            let mut timings = Vec::new();
            for _ in 0..part.repeats.max(1) {
                // One warm-up round, then the timed steps (see the module documentation).
                let timing = StepTiming {
                    device: &device,
                    k,
                    batch_size: if name == "mlp" { MLP_BATCH } else { GPT_BATCH },
                    warmup: SYNC_INTERVAL,
                    steps,
                    sync_interval: Some(SYNC_INTERVAL),
                    autocast: None,
                };
                let runs = match (name, &mnist, &gpt) {
                    ("mlp", Some(mnist), _) => {
                        timing.runs(|d| MlpConfig::new().init(d), mnist, &MnistBatcher)?
                    }
                    (_, _, Some((tokens, gpt))) => timing.gpt_runs(gpt, tokens)?,
                    _ => unreachable!("the data of every row's model is loaded"),
                };
                timings.push(runs.per_node_step());
            }
            let cpu_ms = median(timings.iter().map(|t| t.cpu_s).collect()) * 1e3;
            let wall_ms = median(timings.iter().map(|t| t.wall_s).collect()) * 1e3;
            let base = *first.get_or_insert(cpu_ms);
            out.figures
                .insert(format!("node_step_cpu_ms_{name}_k{k}_{tag}"), cpu_ms);
            out.figures
                .insert(format!("node_step_wall_ms_{name}_k{k}_{tag}"), wall_ms);
            out.figures.insert(
                format!("node_step_cpu_vs_first_{name}_k{k}_{tag}"),
                cpu_ms / base,
            );
            rows.push(format!(
                "| {name} | {k} | {steps} | {cpu_ms:.3} | {:.2} | {wall_ms:.3} | {:.2} of {cores} |",
                cpu_ms / base,
                cpu_ms / wall_ms
            ));
        }
    }
    let note = format!(
        "CPU ms per node-step = the process's CPU time (user + system, all threads) of a run \
         of W + N steps − that of a run of W steps, ÷ (K × N); W = {SYNC_INTERVAL} (one \
         round), N = about {} node-steps ÷ K (MLP) or {} ÷ K (GPT) in whole rounds; the \
         median of {}. ÷ first row: against the model's smallest K; 1.0 means a node costs \
         the same however many share the process. Wall ms per node-step: the loop's wall \
         time on the same terms; cores busy = CPU ÷ wall. DiLoCo, H = {SYNC_INTERVAL}; MLP \
         784-256-10, batch {MLP_BATCH} of MNIST; GPT 2 layers × 2 heads × 64 dims, context \
         64, {GPT_BATCH} sequences per node; backend {tag}, one kernel thread per node.",
        part.mlp_node_steps,
        part.gpt_node_steps,
        part.repeats.max(1)
    );
    out.push_table("Cost of a node-step", &config.command, &note, rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_k_times_about_the_same_node_steps_in_whole_rounds() {
        assert_eq!(timed_steps(20_480, 16), 1280);
        assert_eq!(timed_steps(20_480, 1024), 20);
        // Never less than two rounds, always whole rounds.
        assert_eq!(timed_steps(20_480, 4096), 20);
        assert_eq!(timed_steps(2_560, 64), 40);
        assert_eq!(timed_steps(1000, 3), 340);
    }
}
