//! The flag groups several strategies read, each declared once ([`Shared`](super::Shared)),
//! and what they build: the inner optimizer, the synchronisation period, the outer
//! optimizer, the compression and the quorum.

use crate::compress::CompressionConfig;
use burn::optim::{
    AdaGradConfig, AdafactorConfig, AdanConfig, AdjustLrFn, LambConfig, LionConfig, MuonConfig,
    RmsPropConfig,
};
use clap::{Args, ValueEnum};
use gym_core::{
    InnerOptimizerConfig, LrScheduleConfig, OptimizerConfig, OptimizerGroup, ParamSelection,
    QuorumRule,
};
use serde::Serialize;
use std::str::FromStr;

/// The inner optimizers of the command line: Burn's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerName {
    /// AdamW (PyTorch's defaults: ε 1e-8, weight decay 0.01).
    Adamw,
    /// Adam (PyTorch's defaults: ε 1e-8).
    Adam,
    /// SGD, no momentum.
    Sgd,
    /// Muon for the 2-D weights (its update scaled to AdamW's RMS, so one lr serves both),
    /// AdamW for the other parameters.
    Muon,
    /// Lion (Burn's defaults: betas 0.9/0.99).
    Lion,
    /// Adan (Burn's defaults).
    Adan,
    /// LAMB (Burn's defaults).
    Lamb,
    /// RMSprop (Burn's defaults: α 0.99, momentum 0.9).
    Rmsprop,
    /// AdaGrad (Burn's defaults).
    Adagrad,
    /// Adafactor (Burn's defaults: relative step sizes).
    Adafactor,
}

/// Each node's own optimizer ([`Shared::Optimizer`](super::Shared::Optimizer)).
#[derive(Debug, Clone, Args, Serialize)]
pub struct OptimizerArgs {
    /// Inner optimizer.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerName,
    /// Learning rate of the inner optimizer (DeMo: of its sign step).
    #[arg(long, default_value_t = 3e-4, value_parser = positive)]
    pub lr: f64,
    /// Weight decay of the inner optimizer (default: the optimizer's own, 0.01 for AdamW;
    /// DeMo: decoupled, default 0).
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// Cosine decay to 10% of the lr after the warmup.
    #[arg(long)]
    pub cosine: bool,
    /// Clip gradients to this global L2 norm.
    #[arg(long, value_parser = positive)]
    pub max_norm: Option<f64>,
}

impl OptimizerArgs {
    /// Each node's own optimizer as these flags describe it.
    pub fn inner(&self) -> InnerOptimizerConfig {
        let decayed = |c: OptimizerConfig| match self.weight_decay {
            Some(wd) => c.with_weight_decay(wd),
            None => c,
        };
        let base = match self.optimizer {
            OptimizerName::Adamw | OptimizerName::Muon => OptimizerConfig::adamw(),
            OptimizerName::Adam => OptimizerConfig::adam(),
            OptimizerName::Sgd => OptimizerConfig::sgd(),
            OptimizerName::Lion => LionConfig::new().into(),
            OptimizerName::Adan => AdanConfig::new().into(),
            OptimizerName::Lamb => LambConfig::new().into(),
            OptimizerName::Rmsprop => RmsPropConfig::new().into(),
            OptimizerName::Adagrad => AdaGradConfig::new().into(),
            OptimizerName::Adafactor => AdafactorConfig::new().into(),
        };
        let inner = InnerOptimizerConfig::new()
            .with_optimizer(decayed(base))
            .with_lr(self.lr)
            .with_schedule(self.schedule())
            .with_max_norm(self.max_norm);
        match self.optimizer {
            OptimizerName::Muon => inner.with_group(OptimizerGroup::new(
                ParamSelection::matrices(),
                decayed(
                    MuonConfig::new()
                        .with_adjust_lr_fn(AdjustLrFn::MatchRmsAdamW)
                        .into(),
                ),
            )),
            _ => inner,
        }
    }

    /// The learning-rate schedule these flags describe.
    pub fn schedule(&self) -> LrScheduleConfig {
        LrScheduleConfig::new()
            .with_warmup_steps(self.warmup_steps)
            .with_cosine(self.cosine)
    }
}

/// The synchronisation period ([`Shared::Sync`](super::Shared::Sync)).
#[derive(Debug, Clone, Args, Serialize)]
pub struct SyncArgs {
    /// Steps between synchronisations (default: the strategy's; see its heading).
    #[arg(short = 'H', long)]
    pub sync_interval: Option<usize>,
}

impl SyncArgs {
    /// `-H`, or `default`.
    pub fn or(&self, default: usize) -> usize {
        self.sync_interval.unwrap_or(default)
    }
}

/// The outer optimizer ([`Shared::Outer`](super::Shared::Outer)).
#[derive(Debug, Clone, Args, Serialize)]
pub struct OuterArgs {
    /// Outer learning rate (default: the strategy's; DiLoCo 0.7).
    #[arg(long, value_parser = positive)]
    pub outer_lr: Option<f64>,
    /// Outer momentum (default: the strategy's; DiLoCo's Nesterov 0.9).
    #[arg(long, value_parser = below_one)]
    pub outer_momentum: Option<f64>,
    /// Nesterov momentum in an outer SGD: `--nesterov` or `--nesterov true|false` (default:
    /// the strategy's; DiLoCo's true), as the original's `--nesterov`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub nesterov: Option<bool>,
}

impl OuterArgs {
    /// `--outer-lr`, or `default`.
    pub fn lr_or(&self, default: f64) -> f64 {
        self.outer_lr.unwrap_or(default)
    }

    /// `--outer-momentum`, or `default`, for an outer step with a momentum of its own
    /// (`who`'s); `--nesterov` is refused there rather than ignored.
    pub fn momentum_or(&self, default: f64, who: &str) -> Result<f64, String> {
        if self.nesterov.is_some() {
            return Err(format!(
                "--nesterov sets an outer SGD's momentum; {who}'s outer step has its own                  (set --outer-momentum)"
            ));
        }
        Ok(self.outer_momentum.unwrap_or(default))
    }

    /// The outer SGD that `--outer-momentum` and `--nesterov` describe (plain at momentum
    /// 0; what is not given is DiLoCo's: 0.9, Nesterov), or `default` when neither is given.
    pub fn optimizer_or(&self, default: &OptimizerConfig) -> OptimizerConfig {
        if self.outer_momentum.is_none() && self.nesterov.is_none() {
            return default.clone();
        }
        match self.outer_momentum.unwrap_or(0.9) {
            0.0 => OptimizerConfig::sgd(),
            momentum => OptimizerConfig::sgd_momentum(momentum, self.nesterov.unwrap_or(true)),
        }
    }
}

/// How averaged vectors travel ([`Shared::Compression`](super::Shared::Compression)).
#[derive(Debug, Clone, Args, Serialize)]
pub struct CompressionArgs {
    /// How averaged vectors travel: none, bf16 (2 bytes a value, no scale), int8, fp8, fp4,
    /// 2bit (these four optionally :CHUNK), `qsgd[:LEVELS]` (QSGD: stochastic rounding to
    /// LEVELS levels per 512 values, default 15, unbiased), topk:K/CHUNK, randomk:DENSITY
    /// (each optionally +Q, a dense format for the kept values), then ,ef or ,ef=DECAY for
    /// error feedback and ,senders to average sparse values over their senders; or
    /// powersgd:RANK (default: the strategy's).
    #[arg(long, value_parser = checked::<CompressionConfig>)]
    pub compression: Option<String>,
}

impl CompressionArgs {
    /// `--compression`, or `default` when it is not given.
    pub fn or(&self, default: CompressionConfig) -> CompressionConfig {
        self.compression
            .as_deref()
            .map(|spec| spec.parse().expect("checked when parsed"))
            .unwrap_or(default)
    }
}

/// Decoupled DiLoCo's quorum ([`Shared::Quorum`](super::Shared::Quorum)).
#[derive(Debug, Clone, Default, Args, Serialize)]
pub struct QuorumArgs {
    /// Decoupled DiLoCo's quorum. An outer step waits for the first M nodes to arrive, then
    /// --grace more seconds, and goes on without the nodes still missing (they take the
    /// step's result; their inner steps of the round are lost). Arrivals are simulated times
    /// (--network); untimed, every node arrives at once.
    #[arg(long, value_name = "M", conflicts_with = "fastest")]
    pub min_quorum: Option<usize>,
    /// Simulated seconds an outer step keeps waiting after the --min-quorum-th arrival
    /// (default 0).
    #[arg(long, value_name = "SECONDS", requires = "min_quorum")]
    pub grace: Option<f64>,
    /// Each outer step averages the first M nodes to arrive (fastest m of n, as
    /// SparseLoCo/Covenant); the others take the step's result and lose their round's inner
    /// steps. Ties go to the lower rank.
    #[arg(long, value_name = "M")]
    pub fastest: Option<usize>,
}

impl QuorumArgs {
    /// The clap ids of the group's flags.
    pub const IDS: [&'static str; 3] = ["min_quorum", "grace", "fastest"];

    /// The first quorum flag given, as written, for messages.
    pub fn given(&self) -> Option<&'static str> {
        match (self.min_quorum, self.grace, self.fastest) {
            (Some(_), _, _) => Some("--min-quorum"),
            (None, Some(_), _) => Some("--grace"),
            (None, None, Some(_)) => Some("--fastest"),
            (None, None, None) => None,
        }
    }

    /// The rule of `--min-quorum` (with `--grace`) or `--fastest`, if any, checked; an
    /// unusable one names its flag.
    pub fn rule(&self) -> Result<Option<QuorumRule>, String> {
        let rule = match (self.min_quorum, self.fastest) {
            (Some(min), _) => QuorumRule::Grace {
                min,
                grace_s: self.grace.unwrap_or(0.0),
            },
            (None, Some(count)) => QuorumRule::Fastest { count },
            (None, None) => return Ok(None),
        };
        rule.validate().map_err(|why| {
            // The flag whose value is wrong: a bad grace window comes with a good quorum.
            let flag = match rule {
                QuorumRule::Grace { min, .. } if min > 0 => "--grace",
                _ => self.given().unwrap_or("--min-quorum"),
            };
            format!("{flag}: {why}")
        })?;
        Ok(Some(rule))
    }
}

/// SPARTA's index selectors, as the command line names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SelectorName {
    /// Each element with probability p.
    Random,
    /// Chunks of one fixed permutation, in turn.
    ShuffledSequential,
    /// Parts of a balanced random partition, in turn.
    Partitioned,
}

/// SPARTA's sparse averaging ([`Shared::Sparta`](super::Shared::Sparta)): read by sparta and sparta-diloco.
#[derive(Debug, Clone, Args, Serialize)]
pub struct SpartaArgs {
    /// SPARTA: fraction of the parameters averaged per synchronisation.
    #[arg(long, default_value_t = 0.005, value_parser = fraction)]
    pub p_sparta: f64,
    /// SPARTA: steps between sparse averagings (in sparta and sparta-diloco).
    #[arg(long, default_value_t = 1)]
    pub sparta_sync_interval: usize,
    /// SPARTA: how the averaged elements are chosen.
    #[arg(long, value_enum, default_value = "random")]
    #[serde(serialize_with = "super::value_name")]
    pub sparta_selector: SelectorName,
    /// SPARTA: apply each synchronisation's averaged values this many synchronisations
    /// later (0: at once); the all-reduce overlaps the steps in between.
    #[arg(long, value_name = "D", default_value_t = 0)]
    pub sparta_delay: usize,
    /// SPARTA: how p varies over the run: constant, ramp (from 0 to 2p over the run) or
    /// ramp:STEPS (over every STEPS steps, started again after each).
    #[arg(long, value_name = "SCHEDULE", default_value = "constant")]
    pub p_sparta_schedule: String,
}

/// A value parser for a flag that must be positive and finite (a learning rate, a norm, a
/// time): clap's error names the flag, the value and this range.
pub fn positive(value: &str) -> Result<f64, String> {
    number_in(value, |x| x > 0.0, "positive and finite")
}

/// A value parser for a flag in `[0, 1)` (a momentum, a dropout).
pub fn below_one(value: &str) -> Result<f64, String> {
    number_in(value, |x| (0.0..1.0).contains(&x), "in [0, 1)")
}

/// A value parser for a fraction in `(0, 1]`.
pub fn fraction(value: &str) -> Result<f64, String> {
    number_in(value, |x| x > 0.0 && x <= 1.0, "in (0, 1]")
}

/// A value parser for a flag that must be zero or more, and finite.
pub fn non_negative(value: &str) -> Result<f64, String> {
    number_in(value, |x| x >= 0.0, "zero or more, and finite")
}

fn number_in(value: &str, ok: impl Fn(f64) -> bool, range: &str) -> Result<f64, String> {
    let x: f64 = value
        .trim()
        .parse()
        .map_err(|_| format!("not a number (must be {range})"))?;
    if x.is_finite() && ok(x) {
        Ok(x)
    } else {
        Err(format!("must be {range}"))
    }
}

/// A value parser that checks a spec parses as `T` and keeps it as written (so that the
/// run configuration saves the spec the user gave).
pub fn checked<T: FromStr<Err = String>>(spec: &str) -> Result<String, String> {
    spec.parse::<T>().map(|_| spec.to_string())
}
