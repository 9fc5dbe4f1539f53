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
//!
//! # Proxies
//!
//! With [`SimulationConfig::charge_as`] a run trains its small model, for its loss curve,
//! and charges the clock as if the model had that many parameters: every training
//! collective's payload is counted and timed at `charged / actual` times its size
//! ([`PayloadScale`]), and a node's step computes `6 · charged` FLOPs per token
//! ([`SimulationConfig::flops_per_example`]; a token is a sequence position for a sequence
//! model, and a whole example for a classifier, see
//! [`TrainModel::tokens_per_example`](crate::TrainModel::tokens_per_example)). The times
//! and bytes are then a proxy's: the loss is still the small model's.

use crate::comm::cost::PayloadScale;
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
    /// The wall time of the forward and backward passes on this machine, and of the
    /// strategy's own work between its collective calls (an optimizer step, a codec), less
    /// the time it waited for communication. Not reproducible: it measures the host, and
    /// on a shared CPU mostly the host's load.
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
    /// Charge the clock as if the model had this many parameters (a proxy; see
    /// [the module](self#proxies)): payloads scaled by this count over the model's trainable
    /// parameters, compute `6 ·` this count per token. `None`: the model as it is. Needs a
    /// modelled compute.
    pub charge_as: Option<u64>,
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
        match (self.charge_as, self.compute) {
            (Some(0), _) => bad("`charge_as` must be at least 1 parameter".into()),
            (Some(_), ComputeModel::Measured) => bad(
                "`charge_as` needs a modelled compute (not `measured`): the host's time is the \
                 small model's"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// Ranks per island when the network has islands (what a link cut between islands
    /// refers to); `None` otherwise.
    pub fn island_size(&self) -> Option<usize> {
        match self.network.topology {
            crate::comm::network::Topology::Islands { size, .. } => Some(size),
            _ => None,
        }
    }

    /// How training payloads are charged for a model of `trainable_params` parameters: scaled
    /// to [`charge_as`](Self::charge_as) parameters when it is set (`None` otherwise, or for
    /// a model without parameters).
    pub fn payload_scale(&self, trainable_params: u64) -> Option<PayloadScale> {
        PayloadScale::new(self.charge_as?, trainable_params)
    }

    /// FLOPs of one example's forward and backward passes as the clock charges them: the
    /// model's own count `model_flops`, or under [`charge_as`](Self::charge_as) `6 · charge_as`
    /// per token, `tokens_per_example` tokens an example (the Kaplan et al. 2020 estimate of
    /// a transformer's training FLOPs, attention left out).
    pub fn flops_per_example(&self, model_flops: f64, tokens_per_example: usize) -> f64 {
        match self.charge_as {
            Some(params) => 6.0 * params as f64 * tokens_per_example as f64,
            None => model_flops,
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

/// A number of model parameters, as `--charge-as` (and a planner's `--params`) takes it:
/// `124M`, `1.3B`, `7e9`, `70B`, `125000000` ([`parse_param_count`]). Displayed with a
/// suffix, e.g. `1.3B` ([`format_param_count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ParamCount(std::num::NonZeroU64);

impl ParamCount {
    /// `n` parameters; `None` for zero.
    pub fn new(n: u64) -> Option<Self> {
        std::num::NonZeroU64::new(n).map(ParamCount)
    }

    /// The count.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl FromStr for ParamCount {
    type Err = String;

    /// See [`parse_param_count`].
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_param_count(s).map(|n| ParamCount::new(n).expect("a parsed count is positive"))
    }
}

impl std::fmt::Display for ParamCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_param_count(self.get()))
    }
}

/// Parses a parameter count: a number (an integer, a decimal, or in exponent notation:
/// `7e9`) with an optional suffix `K`, `M`, `B` or `T` (1e3, 1e6, 1e9, 1e12; either case),
/// rounded to the nearest whole count: `124M`, `1.3B`, `7e9`, `70b`, `125000000`. Zero,
/// negative, infinite or NaN counts, counts that round to zero or exceed `u64::MAX`, and
/// anything else are refused with a message that says why (callers add the flag's name).
pub fn parse_param_count(spec: &str) -> std::result::Result<u64, String> {
    let t = spec.trim();
    let (number, scale) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() && "kmbt".contains(c.to_ascii_lowercase()) => {
            let scale = match c.to_ascii_lowercase() {
                'k' => 1e3,
                'm' => 1e6,
                'b' => 1e9,
                _ => 1e12,
            };
            (t[..i].trim_end(), scale)
        }
        _ => (t, 1.0),
    };
    let value: f64 = number.parse().map_err(|_| {
        format!(
            "`{spec}` is not a parameter count: write a number with an optional K, M, B or T \
             suffix (124M, 1.3B, 7e9, 70B)"
        )
    })?;
    if !value.is_finite() {
        return Err(format!("`{spec}` is not a finite parameter count"));
    }
    if value < 0.0 {
        return Err(format!(
            "`{spec}` is negative: a parameter count must be positive"
        ));
    }
    if value == 0.0 {
        return Err(format!(
            "`{spec}` is zero: a parameter count must be positive"
        ));
    }
    let count = (value * scale).round();
    if count < 1.0 {
        return Err(format!(
            "`{spec}` rounds to zero parameters: a parameter count must be positive"
        ));
    }
    // `u64::MAX as f64` is 2^64, the first value that does not fit.
    if count >= u64::MAX as f64 {
        return Err(format!(
            "`{spec}` is more parameters than can be counted (at most {})",
            u64::MAX
        ));
    }
    Ok(count as u64)
}

/// `n` parameters for a label: `1.3B`, `124.44M`, `7B`, `950` (the largest suffix of K, M, B,
/// T under which the count is at least 1 at two decimals, trailing zeros dropped).
pub fn format_param_count(n: u64) -> String {
    for (scale, suffix) in [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")] {
        let hundredths = (n as f64 / scale * 100.0).round();
        if hundredths >= 100.0 {
            let text = format!("{:.2}", hundredths / 100.0);
            let text = text.trim_end_matches('0').trim_end_matches('.');
            return format!("{text}{suffix}");
        }
    }
    n.to_string()
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

    #[test]
    fn parameter_counts_parse_with_suffixes_and_bad_ones_say_why() {
        for (spec, n) in [
            ("124M", 124_000_000),
            ("1.3B", 1_300_000_000),
            ("7e9", 7_000_000_000),
            ("70B", 70_000_000_000),
            ("70b", 70_000_000_000),
            (" 2 t ", 2_000_000_000_000),
            ("1.5k", 1_500),
            ("125000000", 125_000_000),
            ("1", 1),
        ] {
            assert_eq!(parse_param_count(spec), Ok(n), "{spec}");
        }
        for (spec, says) in [
            ("0", "zero"),
            ("0B", "zero"),
            ("-7B", "negative"),
            ("-1", "negative"),
            ("inf", "finite"),
            ("NaN", "finite"),
            ("0.3", "rounds to zero"),
            ("1e30", "more parameters"),
            ("", "not a parameter count"),
            ("7X", "not a parameter count"),
            ("B", "not a parameter count"),
            ("1KB", "not a parameter count"),
        ] {
            let err = parse_param_count(spec).unwrap_err();
            assert!(err.contains(says) && err.contains(spec), "{spec}: {err}");
        }
        assert_eq!("1.3B".parse::<ParamCount>().unwrap().get(), 1_300_000_000);
        assert!("0".parse::<ParamCount>().is_err());
        for (n, text) in [
            (7_000_000_000, "7B"),
            (1_300_000_000, "1.3B"),
            (124_439_808, "124.44M"),
            (999_999_999, "1B"),
            (101_770, "101.77K"),
            (950, "950"),
            (2_000_000_000_000, "2T"),
        ] {
            assert_eq!(format_param_count(n), text);
        }
        assert_eq!(ParamCount::new(70_000_000_000).unwrap().to_string(), "70B");
    }

    #[test]
    fn a_proxy_is_checked_and_charges_six_flops_per_parameter_and_token() {
        let proxy = sim().with_charge_as(Some(7_000_000_000));
        assert!(proxy.validate(2).is_ok());
        assert_eq!(proxy.flops_per_example(123.0, 64), 6.0 * 7e9 * 64.0);
        assert_eq!(sim().flops_per_example(123.0, 64), 123.0);
        assert_eq!(
            proxy.payload_scale(1000).unwrap().apply(4000),
            28_000_000_000
        );
        assert_eq!(sim().payload_scale(1000), None);
        assert!(sim().with_charge_as(Some(0)).validate(2).is_err());
        let measured = proxy.with_compute(ComputeModel::Measured);
        assert!(
            matches!(measured.validate(2), Err(GymError::InvalidConfig(why)) if why.contains("measured"))
        );
        // Rounded to the nearest byte, halves up, the same everywhere.
        let third = PayloadScale::new(1, 3).unwrap();
        assert_eq!((third.apply(1), third.apply(2), third.apply(3)), (0, 1, 1));
        let half = PayloadScale::new(1, 2).unwrap();
        assert_eq!((half.apply(1), half.apply(3)), (1, 2));
    }

    /// With `charge_as` at 10× the model's parameters, an all-reduce counts 10× the bytes
    /// and takes the network's time for 10× the payload; observer traffic stays as it is.
    #[test]
    fn a_proxy_all_reduce_counts_and_times_the_scaled_payload() {
        use crate::comm::{CollectiveOp, Group, InProcessGroup, ReduceOp, cost};
        use burn::tensor::{Device, Tensor};
        let (k, n) = (4, 1000_usize);
        let cfg = sim().with_charge_as(Some(10 * n as u64));
        let scale = cfg.payload_scale(n as u64).expect("a proxy");
        let results = InProcessGroup::simulated(k, cfg.network.clone())
            .run(|c| {
                let c = c.with_payload_scale(scale);
                let grads = Tensor::<1>::ones([n], &Device::default());
                let mean = c.all_reduce(grads.clone(), ReduceOp::Mean).unwrap();
                c.observer().all_reduce(grads, ReduceOp::Mean).unwrap();
                (
                    mean.into_data().try_into_vec::<f32>().unwrap(),
                    c.stats(),
                    c.observer_stats(),
                    c.simulated_time().unwrap(),
                )
            })
            .unwrap();
        let real = 4 * n as u64;
        let world = Group::world(k);
        let op = CollectiveOp::AllReduce(ReduceOp::Mean);
        // The closed form: a ring sends ⌊2(k−1)·n/k⌋ of an n-byte payload.
        let sent = |payload: u64| 2 * (k as u64 - 1) * payload / k as u64;
        for r in results {
            let (mean, stats, observer, time) = r.unwrap();
            assert!(
                mean.iter().all(|&x| x == 1.0),
                "the data moved is the real data"
            );
            assert_eq!(stats.bytes_sent, 10 * sent(real));
            assert_eq!(stats.bytes_sent, cost(op, &world, 0, 10 * real).0);
            assert_eq!(stats.bytes_received, stats.bytes_sent);
            assert_eq!(observer.bytes_sent, sent(real));
            let charged = cfg.network.collective_time(op, &world, 10 * real);
            assert_eq!(time.comm_s, charged);
            assert_eq!(time.now_s, charged);
            // Alpha-beta on one switch: 2(k−1)·α + 2(k−1)/k · n/β, β = 1 Gbit/s = 1.25e8 B/s.
            let closed = 2.0 * 3.0 * 1e-3 + 2.0 * 3.0 / 4.0 * (10 * real) as f64 / 1.25e8;
            assert!(
                (charged - closed).abs() < 1e-12 * closed,
                "{charged} vs {closed}"
            );
        }
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
