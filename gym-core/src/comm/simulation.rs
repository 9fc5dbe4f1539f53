//! Simulated time: the cluster a run is timed on — its [network](crate::comm::network) and its
//! nodes' compute — and how long each node's step takes.
//!
//! With a [`SimulationConfig`] in the [`TrainerConfig`](crate::TrainerConfig), every node
//! keeps a simulated clock: its forward and backward passes advance it by the time the
//! [`ComputeModel`] gives, divided by the node's speed factor and multiplied by its seeded
//! jitter; every collective advances it by the time its algorithm takes on the network
//! (a node that arrives first waits, idle, for the last). The run then reports, per step and
//! in total, simulated compute, exposed communication and idle time.
//!
//! With the modelled compute (the default), simulated time is a pure function of the
//! configuration and the seed: the same run gives the same simulated seconds, bit for bit.
//! Only the forward and backward passes are timed; the strategy's own compute (an
//! optimizer step, DeMo's transforms) is not, and neither are evaluations, which go through
//! the uncounted observer handle as their bytes do.

use crate::comm::network::Network;
use crate::error::{GymError, Result};
use crate::state::rng::derive_seed;
use burn::config::Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// How long a node's forward and backward passes take in simulated time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ComputeModel {
    /// The step's FLOPs ([`TrainModel::flops_per_example`](crate::TrainModel::flops_per_example)
    /// × examples per node) divided by the node's effective FLOP/s.
    Modelled {
        /// Effective FLOP/s of a node at speed 1 (peak × model FLOPs utilisation).
        flops_per_s: f64,
    },
    /// The wall time of the forward and backward passes on this machine. Not reproducible:
    /// it measures the host, and on a shared CPU mostly the host's load.
    Measured,
}

/// Node presets: name, effective FLOP/s, and where the figure comes from. The accelerators'
/// are their peak dense BF16 rate at 40% model FLOPs utilisation (MFU; 30–50% is typical
/// of well-tuned LLM training).
pub const NODE_PRESETS: [(&str, f64, &str); 3] = [
    (
        "h100",
        989e12 * 0.4,
        "NVIDIA H100 SXM data sheet: 989 TFLOPS dense BF16, at 40% MFU",
    ),
    (
        "a100",
        312e12 * 0.4,
        "NVIDIA A100 data sheet: 312 TFLOPS dense BF16, at 40% MFU",
    ),
    (
        "cpu",
        25e9,
        "measured on this project's 2-core machine: one node of the 2×2×64 GPT (context 64, \
         16 sequences, 0.73 GFLOP per step) ran its forward and backward passes in 30.7 ms",
    ),
];

impl ComputeModel {
    /// The modelled compute of the preset `name` (see [`NODE_PRESETS`]).
    pub fn preset(name: &str) -> Option<Self> {
        NODE_PRESETS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, flops_per_s, _)| ComputeModel::Modelled { flops_per_s })
    }

    /// The default: the `cpu` preset, which matches the CPU-sized models of the examples.
    pub fn cpu() -> Self {
        ComputeModel::preset("cpu").expect("the cpu preset exists")
    }
}

impl FromStr for ComputeModel {
    type Err = String;

    /// A preset (`h100`, `a100`, `cpu`), a number of effective TFLOPS (`50`), or
    /// `measured`.
    fn from_str(spec: &str) -> std::result::Result<Self, String> {
        let spec = spec.trim();
        if spec == "measured" {
            return Ok(ComputeModel::Measured);
        }
        if let Some(preset) = ComputeModel::preset(spec) {
            return Ok(preset);
        }
        match spec.parse::<f64>() {
            Ok(tflops) if tflops.is_finite() && tflops > 0.0 => Ok(ComputeModel::Modelled {
                flops_per_s: tflops * 1e12,
            }),
            _ => Err(format!(
                "`{spec}` is not a node: use h100, a100, cpu, measured, or effective TFLOPS (e.g. 50)"
            )),
        }
    }
}

/// The simulated cluster of a run.
#[derive(Config, Debug)]
pub struct SimulationConfig {
    /// The network and its topology.
    pub network: Network,
    /// How long forward and backward passes take (default: the `cpu` preset).
    #[config(default = "ComputeModel::cpu()")]
    pub compute: ComputeModel,
    /// Per-node speed factors: node `r`'s step takes `1/node_speed[r]` of the modelled time.
    /// Empty: every node at speed 1; otherwise one factor per node.
    #[config(default = "Vec::new()")]
    pub node_speed: Vec<f64>,
    /// σ of each node's step-time jitter: a factor `exp(σ·z − σ²/2)`, `z` standard normal
    /// drawn from the seed, the rank and the step (lognormal with mean 1); 0: none.
    #[config(default = 0.0)]
    pub jitter: f64,
}

impl SimulationConfig {
    /// Checks the configuration for a run of `num_nodes` nodes.
    pub fn validate(&self, num_nodes: usize) -> Result<()> {
        let bad = |why: String| Err(GymError::InvalidConfig(why));
        if let Err(why) = self.network.validate(num_nodes) {
            return bad(format!("`network`: {why}"));
        }
        if let ComputeModel::Modelled { flops_per_s } = self.compute
            && !(flops_per_s.is_finite() && flops_per_s > 0.0)
        {
            return bad(format!(
                "`compute`: FLOP/s must be positive, got {flops_per_s}"
            ));
        }
        if !self.node_speed.is_empty() && self.node_speed.len() != num_nodes {
            return bad(format!(
                "`node_speed` has {} factors for {num_nodes} nodes",
                self.node_speed.len()
            ));
        }
        if let Some(s) = self
            .node_speed
            .iter()
            .find(|s| !(s.is_finite() && **s > 0.0))
        {
            return bad(format!("`node_speed` factors must be positive, got {s}"));
        }
        if !(self.jitter.is_finite() && self.jitter >= 0.0) {
            return bad(format!(
                "`jitter` must be finite and non-negative, got {}",
                self.jitter
            ));
        }
        Ok(())
    }

    /// Ranks per island when the network has islands (what a link cut between islands
    /// refers to); `None` otherwise.
    pub fn island_size(&self) -> Option<usize> {
        match self.network.topology {
            crate::comm::network::Topology::Islands { size, .. } => Some(size),
            _ => None,
        }
    }

    /// Simulated seconds of node `rank`'s forward and backward passes at `step`, for a step
    /// of `flops` FLOPs that took `measured_s` seconds on this machine.
    pub fn step_compute_s(
        &self,
        rank: usize,
        step: usize,
        seed: u64,
        flops: f64,
        measured_s: f64,
    ) -> f64 {
        let base = match self.compute {
            ComputeModel::Modelled { flops_per_s } => flops / flops_per_s,
            ComputeModel::Measured => measured_s,
        };
        let speed = self.node_speed.get(rank).copied().unwrap_or(1.0);
        base / speed * self.jitter_factor(rank, step, seed)
    }

    /// The lognormal jitter factor of `rank` at `step` (1 without jitter).
    pub fn jitter_factor(&self, rank: usize, step: usize, seed: u64) -> f64 {
        if self.jitter == 0.0 {
            return 1.0;
        }
        let mut rng =
            ChaCha8Rng::seed_from_u64(derive_seed(seed, &[0x4A49_5454, rank as u64, step as u64]));
        // Box–Muller: one standard normal from two uniforms in (0, 1].
        let u1: f64 = 1.0 - rng.random::<f64>();
        let u2: f64 = rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let s = self.jitter;
        (s * z - s * s / 2.0).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::network::Link;

    fn sim() -> SimulationConfig {
        SimulationConfig::new(Network::switch(Link::symmetric(1e9, 1e-3)))
    }

    #[test]
    fn network_compute_specs_and_the_modelled_step_time() {
        assert_eq!(
            "50".parse::<ComputeModel>().unwrap(),
            ComputeModel::Modelled { flops_per_s: 50e12 }
        );
        assert_eq!(
            "h100".parse::<ComputeModel>().unwrap(),
            ComputeModel::Modelled {
                flops_per_s: 395.6e12
            }
        );
        assert_eq!(
            "measured".parse::<ComputeModel>().unwrap(),
            ComputeModel::Measured
        );
        assert!("fast".parse::<ComputeModel>().is_err() && "-1".parse::<ComputeModel>().is_err());
        let s = sim()
            .with_compute(ComputeModel::Modelled { flops_per_s: 1e9 })
            .with_node_speed(vec![1.0, 0.5]);
        assert_eq!(s.step_compute_s(0, 3, 7, 2e9, 99.0), 2.0);
        assert_eq!(s.step_compute_s(1, 3, 7, 2e9, 99.0), 4.0);
        let measured = sim().with_compute(ComputeModel::Measured);
        assert_eq!(measured.step_compute_s(0, 0, 0, 2e9, 0.25), 0.25);
        assert!(s.validate(2).is_ok());
        assert!(s.validate(3).is_err(), "two factors for three nodes");
        assert!(sim().with_jitter(-1.0).validate(1).is_err());
        assert!(sim().with_node_speed(vec![0.0]).validate(1).is_err());
    }

    /// The jitter is lognormal with mean 1 and log-σ `jitter`, the same for the same seed,
    /// rank and step.
    #[test]
    fn network_jitter_is_lognormal_with_mean_one_and_seeded() {
        let s = sim().with_jitter(0.3);
        let n = 20_000;
        let logs: Vec<f64> = (0..n)
            .map(|i| s.jitter_factor(i % 8, i / 8, 11).ln())
            .collect();
        let mean = logs.iter().sum::<f64>() / n as f64;
        let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // ln(factor) ~ N(−σ²/2, σ²): 5-standard-error bounds.
        assert!(
            (mean + 0.045).abs() < 5.0 * 0.3 / (n as f64).sqrt(),
            "{mean}"
        );
        assert!((var.sqrt() - 0.3).abs() < 0.01, "{}", var.sqrt());
        let factors_mean = logs.iter().map(|x| x.exp()).sum::<f64>() / n as f64;
        assert!((factors_mean - 1.0).abs() < 0.01, "{factors_mean}");
        assert_eq!(s.jitter_factor(3, 9, 11), s.jitter_factor(3, 9, 11));
        assert_ne!(s.jitter_factor(3, 9, 11), s.jitter_factor(3, 9, 12));
        assert_eq!(sim().jitter_factor(3, 9, 11), 1.0);
    }
}
