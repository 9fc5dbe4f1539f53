//! Learning-rate schedules: the built-in warmup and cosine decay (Burn's linear, cosine and
//! constant schedulers in sequence), and schedules of your own ([`CustomSchedule`]), for
//! the whole model and for each parameter group around its own base rate.

use crate::error::{GymError, Result};
use burn::config::Config;
use burn::module::ParamGroup;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::{ModuleLrScheduler, ModuleLrSchedulerConfig};
use burn::optim::lr_scheduler::sequential::SequentialLrSchedulerConfig;
use burn::optim::lr_scheduler::{LrScheduler, LrSchedulerConfig, LrSchedulerRecord};

/// Checks that `value`, the setting called `field`, is a usable learning rate.
pub fn check_learning_rate(field: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(GymError::InvalidConfig(format!(
            "`{field}` must be a positive, finite learning rate, got {value}"
        )))
    }
}

/// A learning-rate schedule around a base learning rate (the original's `lambda_cosine`),
/// built from Burn's linear, cosine-annealing and constant schedulers, or a schedule of
/// your own ([`CustomSchedule`]).
///
/// With base lr `η`, warmup `W` and `T` total steps, the lr used at step `t` is:
/// * `t < W`: `η·(t+1)/W` — linear warmup reaching `η` at `t = W−1`. (The original starts
///   at `η·t/W`, so its first step runs at lr 0 and is wasted.)
/// * otherwise, with `cosine`: `η·(f + (1−f)·½(1 + cos(π·(t−W)/(T−W))))`, `f` =
///   `min_lr_factor` (0.1 as the original);
/// * otherwise: `η`.
///
/// With `custom`, the lr at step `t` is `η·factor(t, T)` instead.
#[derive(Config, Debug, PartialEq)]
pub struct LrScheduleConfig {
    /// Warmup steps (0: none).
    #[config(default = 0)]
    pub warmup_steps: usize,
    /// Cosine decay after the warmup.
    #[config(default = false)]
    pub cosine: bool,
    /// Floor of the cosine decay, as a fraction of the base lr.
    #[config(default = 0.1)]
    pub min_lr_factor: f64,
    /// A schedule of your own, in place of the warmup and cosine above.
    #[config(default = "None")]
    pub custom: Option<CustomSchedule>,
}

impl LrScheduleConfig {
    /// Checks the schedule's own settings.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.min_lr_factor) {
            return Err(GymError::InvalidConfig(format!(
                "`min_lr_factor` must be in [0, 1], got {}",
                self.min_lr_factor
            )));
        }
        if let Some(custom) = &self.custom
            && (self.warmup_steps > 0 || self.cosine)
        {
            return Err(GymError::InvalidConfig(format!(
                "the custom schedule `{}` replaces the warmup and the cosine decay: set \
                 `warmup_steps` 0 and `cosine` false, or fold them into it",
                custom.name
            )));
        }
        Ok(())
    }

    /// Burn's scheduler configuration for `base_lr` over `total_steps` steps (the built-in
    /// schedules; a custom one is built by [`init`](Self::init)).
    pub fn scheduler(&self, base_lr: f64, total_steps: usize) -> Result<LrSchedulerConfig> {
        check_learning_rate("lr", base_lr)?;
        self.validate()?;
        let main = if self.cosine {
            LrSchedulerConfig::Cosine(
                CosineAnnealingLrSchedulerConfig::new(
                    base_lr,
                    total_steps.saturating_sub(self.warmup_steps).max(1),
                )
                .with_min_lr(base_lr * self.min_lr_factor),
            )
        } else {
            LrSchedulerConfig::Constant(base_lr)
        };
        let schedule = LrSchedulerConfig::Sequential(match self.warmup_steps {
            0 => SequentialLrSchedulerConfig::new(vec![main], vec![]),
            // One warmup step runs at the full rate (η·1/1).
            1 => SequentialLrSchedulerConfig::new(
                vec![LrSchedulerConfig::Constant(base_lr), main],
                vec![1],
            ),
            w => {
                let warmup = LinearLrSchedulerConfig::new(base_lr / w as f64, base_lr, w - 1);
                SequentialLrSchedulerConfig::new(vec![warmup.into(), main], vec![w])
            }
        });
        // Past its end (a run extended with `--resume --max-steps LARGER`) the schedule
        // holds its last rate: Burn's cosine would rise again.
        let mut probe = ModuleLrSchedulerConfig::new(schedule.clone())
            .init()
            .map_err(|why| GymError::InvalidConfig(format!("learning-rate schedule: {why}")))?;
        let last = (0..total_steps.max(1)).fold(base_lr, |_, _| probe.step().base());
        Ok(LrSchedulerConfig::Sequential(
            SequentialLrSchedulerConfig::new(
                vec![schedule, LrSchedulerConfig::Constant(last)],
                vec![total_steps.max(1)],
            ),
        ))
    }

    /// Burn's scheduler for `base_lr` over `total_steps` steps.
    pub fn init(&self, base_lr: f64, total_steps: usize) -> Result<ModuleLrScheduler> {
        self.init_groups(base_lr, &[], total_steps)
    }

    /// Burn's scheduler for `base_lr`, and for each parameter group its own base lr, over
    /// `total_steps` steps.
    pub fn init_groups(
        &self,
        base_lr: f64,
        groups: &[(ParamGroup, f64)],
        total_steps: usize,
    ) -> Result<ModuleLrScheduler> {
        let built = if let Some(custom) = &self.custom {
            self.validate()?;
            let mut schedule = ModuleLrScheduler::new(custom.scheduler(base_lr, total_steps)?);
            for (group, lr) in groups {
                schedule = schedule.with_group(group.clone(), custom.scheduler(*lr, total_steps)?);
            }
            Ok(schedule)
        } else {
            let mut schedule = ModuleLrSchedulerConfig::new(self.scheduler(base_lr, total_steps)?);
            for (group, lr) in groups {
                schedule = schedule.with_group(group.clone(), self.scheduler(*lr, total_steps)?);
            }
            schedule.init()
        };
        built.map_err(|why| GymError::InvalidConfig(format!("learning-rate schedule: {why}")))
    }
}

/// A learning-rate schedule of your own: the factor of the base learning rate at each step,
/// from the step (from 0) and the run's total steps. Groups with their own learning rate
/// follow the same factor. Every factor of the run is checked before the first step
/// (finite, not negative). In a configuration file and a checkpoint's identity it is its
/// name.
///
/// ```
/// use gym_core::{CustomSchedule, InnerOptimizerConfig, LrScheduleConfig};
///
/// // Full rate for the first half, a tenth after (a step decay).
/// let step_decay = CustomSchedule::new("half-then-tenth", |step, total| {
///     if step < total / 2 { 1.0 } else { 0.1 }
/// });
/// let inner = InnerOptimizerConfig::new()
///     .with_lr(3e-4)
///     .with_schedule(LrScheduleConfig::new().with_custom(Some(step_decay)));
/// # let _ = inner;
/// ```
#[derive(Clone)]
pub struct CustomSchedule {
    name: String,
    factor: std::sync::Arc<dyn Fn(usize, usize) -> f64 + Send + Sync>,
}

impl CustomSchedule {
    /// The schedule `factor(step, total_steps)`, named `name` in logs and configurations.
    pub fn new(
        name: impl Into<String>,
        factor: impl Fn(usize, usize) -> f64 + Send + Sync + 'static,
    ) -> Self {
        CustomSchedule {
            name: name.into(),
            factor: std::sync::Arc::new(factor),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The factor at `step` of a run of `total_steps`.
    pub fn factor(&self, step: usize, total_steps: usize) -> f64 {
        (self.factor)(step, total_steps)
    }

    /// Burn's scheduler for `base_lr`, every factor of the run checked first.
    fn scheduler(&self, base_lr: f64, total_steps: usize) -> Result<FactorScheduler> {
        check_learning_rate("lr", base_lr)?;
        for step in 0..total_steps {
            let f = self.factor(step, total_steps);
            if !f.is_finite() || f < 0.0 {
                return Err(GymError::InvalidConfig(format!(
                    "the custom schedule `{}` gives the factor {f} at step {step}; factors \
                     are finite and not negative",
                    self.name
                )));
            }
        }
        Ok(FactorScheduler {
            schedule: self.clone(),
            base_lr,
            total_steps,
            step: 0,
        })
    }
}

impl std::fmt::Debug for CustomSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomSchedule({:?})", self.name)
    }
}

impl PartialEq for CustomSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// Saved as its name (`{"custom": "half-then-tenth"}` in `config.json`).
impl serde::Serialize for CustomSchedule {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name)
    }
}

/// A custom schedule is code: a configuration file can name one but not hold it.
impl<'de> serde::Deserialize<'de> for CustomSchedule {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Err(serde::de::Error::custom(format!(
            "the custom schedule `{name}` is code: give it through `LrScheduleConfig::with_custom`"
        )))
    }
}

/// Burn's view of a [`CustomSchedule`] for one base learning rate.
#[derive(Clone)]
struct FactorScheduler {
    schedule: CustomSchedule,
    base_lr: f64,
    total_steps: usize,
    step: usize,
}

impl LrScheduler for FactorScheduler {
    fn step(&mut self) -> f64 {
        // Past the end (an extended run) the last factor holds.
        let at = self.step.min(self.total_steps.saturating_sub(1));
        let lr = self.base_lr * self.schedule.factor(at, self.total_steps);
        self.step += 1;
        lr
    }

    fn to_record(&self) -> LrSchedulerRecord {
        LrSchedulerRecord::new().with_scalar("step", self.step as u64)
    }

    fn load_record(&mut self, record: LrSchedulerRecord) {
        if let Some(step) = record.scalar::<u64>("step") {
            self.step = step as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The original's `lambda_cosine` with our warmup offset (`t+1`), in closed form.
    fn reference(base: f64, warmup: usize, total: usize, cosine: bool, t: usize) -> f64 {
        if t < warmup {
            return base * (t + 1) as f64 / warmup as f64;
        }
        if !cosine {
            return base;
        }
        let progress = (t - warmup) as f64 / (total - warmup).max(1) as f64;
        base * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
    }

    #[test]
    fn schedules_match_the_closed_form() {
        for (warmup, cosine) in [
            (0, false),
            (0, true),
            (1, true),
            (10, false),
            (10, true),
            (100, true),
        ] {
            let total = 120;
            let mut s = LrScheduleConfig::new()
                .with_warmup_steps(warmup)
                .with_cosine(cosine)
                .init(3e-4, total)
                .unwrap();
            for t in 0..total {
                let got = s.step().base();
                let want = reference(3e-4, warmup, total, cosine, t);
                assert!(
                    (got - want).abs() < 1e-12,
                    "warmup {warmup} cosine {cosine} t {t}: {got} vs {want}"
                );
            }
            // An extended run: past the end the last rate holds (Burn's cosine would rise).
            let last = reference(3e-4, warmup, total, cosine, total - 1);
            for t in total..total + 3 * total {
                let got = s.step().base();
                assert!((got - last).abs() < 1e-12, "t {t}: {got} vs {last}");
            }
        }
        let mut halves = LrScheduleConfig::new()
            .with_custom(Some(CustomSchedule::new("halves", |t, n| {
                if t < n / 2 { 1.0 } else { 0.5 }
            })))
            .init(1.0, 10)
            .unwrap();
        let rates: Vec<f64> = (0..14).map(|_| halves.step().base()).collect();
        assert_eq!(
            rates[4..].to_vec(),
            [1.0].into_iter().chain([0.5; 9]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_custom_schedule_gives_its_factor_and_can_be_the_built_in_cosine() {
        let total = 50;
        let halves =
            CustomSchedule::new("halves", |t, total| if t < total / 2 { 1.0 } else { 0.5 });
        let config = LrScheduleConfig::new().with_custom(Some(halves));
        let mut s = config.init(2e-3, total).unwrap();
        for t in 0..total {
            let want = if t < 25 { 2e-3 } else { 1e-3 };
            assert_eq!(s.step().base(), want, "step {t}");
        }
        // The built-in warmup + cosine written as a custom schedule gives the same rates.
        let cosine = CustomSchedule::new("cosine", |t, total| reference(1.0, 10, total, true, t));
        let mut custom = LrScheduleConfig::new()
            .with_custom(Some(cosine))
            .init(3e-4, 120)
            .unwrap();
        let mut built_in = LrScheduleConfig::new()
            .with_warmup_steps(10)
            .with_cosine(true)
            .init(3e-4, 120)
            .unwrap();
        for t in 0..120 {
            let (a, b) = (custom.step().base(), built_in.step().base());
            assert!((a - b).abs() < 1e-12, "step {t}: {a} vs {b}");
        }
    }

    #[test]
    fn a_custom_schedule_follows_each_groups_own_rate() {
        use burn::module::ParamId;
        let group = ParamGroup::from_ids(vec![ParamId::from(7u64)]);
        let decay = CustomSchedule::new("linear", |t, total| 1.0 - t as f64 / total as f64);
        let mut s = LrScheduleConfig::new()
            .with_custom(Some(decay))
            .init_groups(1e-3, &[(group, 4e-2)], 10)
            .unwrap();
        for t in 0..10 {
            let lr = s.step();
            let f = 1.0 - t as f64 / 10.0;
            assert!((lr.base() - 1e-3 * f).abs() < 1e-15, "step {t}");
            let grouped = lr.lr_from_param(ParamId::from(7u64), None);
            assert!((grouped - 4e-2 * f).abs() < 1e-15, "step {t}: {grouped}");
        }
    }

    #[test]
    fn a_custom_schedule_is_checked_before_any_step() {
        let nan_late = CustomSchedule::new("breaks", |t, _| if t == 17 { f64::NAN } else { 1.0 });
        let err = LrScheduleConfig::new()
            .with_custom(Some(nan_late))
            .init(1e-3, 20)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`breaks`") && err.contains("step 17"), "{err}");
        let flat = CustomSchedule::new("flat", |_, _| 1.0);
        let err = LrScheduleConfig::new()
            .with_warmup_steps(5)
            .with_custom(Some(flat.clone()))
            .init(1e-3, 20)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("replaces the warmup"), "{err}");
        // Named in a configuration, not readable from one.
        let json = serde_json::to_string(&LrScheduleConfig::new().with_custom(Some(flat))).unwrap();
        assert!(json.contains(r#""custom":"flat""#), "{json}");
        let back = serde_json::from_str::<LrScheduleConfig>(&json)
            .err()
            .unwrap()
            .to_string();
        assert!(back.contains("is code"), "{back}");
    }
}
