//! Composition: a local optimizer step followed by communication modules, each deciding its
//! own timing (the original's `CommunicateOptimizeStrategy`).

use burn::tensor::Tensor;
use gym_core::planner::{PlanInfo, PlannedEvent, Traffic};
use gym_core::state::fields::Record;
use gym_core::{
    GymError, InnerOptimizer, InnerOptimizerConfig, NodeInfo, Replica, Result, StateDict,
    StepContext, Strategy, StrategyConfig,
};
use gym_core::{InnerOptimizerRecord, Pending, TransferTiming};
use std::sync::Arc;

/// Whether a module that synchronises every H steps does so after `step`'s inner step
/// (defined beside [`StepContext`]: [`StepContext::ends_round`]).
pub use gym_core::strategy::is_sync_step;

/// Refuses a synchronisation interval H of 0 (a round without steps), naming `strategy`.
pub(crate) fn check_sync_interval(strategy: &str, sync_interval: usize) -> Result<()> {
    if sync_interval == 0 {
        return Err(GymError::InvalidConfig(format!(
            "{strategy}: `sync_interval` (H) must be at least 1"
        )));
    }
    Ok(())
}

/// One communication step of a composed strategy, run after every inner optimizer step.
/// It decides from `ctx.step` whether to act, reads and replaces the replica's parameters,
/// and talks through `ctx.collective`.
///
/// # Example: parameters quantized to 8 bits before they are averaged
///
/// ```
/// use gym_core::{NodeInfo, ReduceOp, Result, StepContext};
/// use gym_strategies::communicate::{CommunicationModule, CommunicationModuleConfig, is_sync_step};
///
/// /// Every `every` steps, average the parameters after rounding them to 256 levels.
/// struct QuantizedAverage { every: usize, scale: f32 }
///
/// impl CommunicationModule for QuantizedAverage {
///     fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
///         if is_sync_step(ctx.step, self.every) {
///             let q = ctx.replica.params().div_scalar(self.scale).round().clamp(-128.0, 127.0);
///             let mean = ctx.collective.all_reduce(q, ReduceOp::Mean)?;
///             ctx.replica.set_params(mean.mul_scalar(self.scale));
///         }
///         Ok(())
///     }
/// }
///
/// struct QuantizedAverageConfig;
///
/// impl CommunicationModuleConfig for QuantizedAverageConfig {
///     fn name(&self) -> String { "quantized-average".into() }
///     fn init(&self, _node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
///         Ok(Box::new(QuantizedAverage { every: 10, scale: 0.01 }))
///     }
/// }
///
/// let inner = gym_core::InnerOptimizerConfig::new();
/// let strategy = gym_strategies::CommunicateOptimizeConfig::new("quantized", inner)
///     .with_module(QuantizedAverageConfig);
/// # let _ = strategy;
/// ```
pub trait CommunicationModule: Send {
    /// Runs after the inner step of `ctx.step`; may read and replace the replica's
    /// parameters ([`StepContext::replica`]).
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()>;

    /// Whether all of this node's work is merged into the shared model
    /// ([`Strategy::committed`]).
    fn committed(&self) -> bool {
        true
    }

    /// Whether the last call dropped this node's unmerged work
    /// ([`Strategy::take_discarded`]); reading it resets it.
    fn take_discarded(&mut self) -> bool {
        false
    }

    /// The node has just loaded a peer's state ([`Strategy::rejoined`]).
    fn rejoined(&mut self, _replica: &mut dyn Replica) -> Result<()> {
        Ok(())
    }

    /// A master copy of the parameters kept by the module (DiLoCo's outer model), if any.
    fn master_params(&self) -> Option<Tensor<1>> {
        None
    }

    /// The module's state, for a checkpoint (see [`Strategy::save_state`]); the default
    /// refuses.
    fn save_state(&self) -> Result<StateDict> {
        Err(GymError::Checkpoint(
            "a communication module does not implement `save_state`/`load_state`".into(),
        ))
    }

    /// Restores what [`save_state`](Self::save_state) wrote.
    fn load_state(&mut self, _state: &StateDict) -> Result<()> {
        Err(GymError::Checkpoint(
            "a communication module does not implement `save_state`/`load_state`".into(),
        ))
    }
}

/// Builds a [`CommunicationModule`] on each node.
pub trait CommunicationModuleConfig: Send + Sync {
    /// Name for logs.
    fn name(&self) -> String;
    /// Settings for `config.json`.
    fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// The module of one node.
    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>>;

    /// The module's communication as sizes ([`StrategyConfig::traffic`]); the default
    /// refuses.
    fn traffic(&self, _info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        Err(GymError::InvalidConfig(format!(
            "communication module `{}` cannot be planned: it has no traffic schedule",
            self.name()
        )))
    }

    /// About how many values per parameter the module's state holds (a master copy, an
    /// outer momentum), for [`StrategyConfig::state_values_per_param`]; the default: none.
    fn state_values_per_param(&self) -> f64 {
        0.0
    }
}

/// A strategy made of: local gradient clipping → inner optimizer step → each communication
/// module in order (the schedule advances with the inner step).
#[derive(Clone)]
pub struct CommunicateOptimizeConfig {
    /// Name for logs.
    pub name: String,
    /// Each node's own optimizer; it clips the node's local gradient.
    pub inner: InnerOptimizerConfig,
    /// The communication modules, run in order after each inner step.
    pub modules: Vec<Arc<dyn CommunicationModuleConfig>>,
}

impl CommunicateOptimizeConfig {
    /// A composed strategy called `name` with inner optimizer `inner` and no module yet.
    pub fn new(name: impl Into<String>, inner: InnerOptimizerConfig) -> Self {
        CommunicateOptimizeConfig {
            name: name.into(),
            inner,
            modules: Vec::new(),
        }
    }

    /// Appends a communication module.
    pub fn with_module(mut self, module: impl CommunicationModuleConfig + 'static) -> Self {
        self.modules.push(Arc::new(module));
        self
    }
}

/// The per-node strategy built by [`CommunicateOptimizeConfig`].
pub struct CommunicateOptimize {
    optim: InnerOptimizer,
    modules: Vec<Box<dyn CommunicationModule>>,
}

impl StrategyConfig for CommunicateOptimizeConfig {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "inner": serde_json::to_value(&self.inner).expect("serialises"),
            "modules": self.modules.iter().map(|m| serde_json::json!({ "name": m.name(), "config": m.to_json() })).collect::<Vec<_>>(),
        })
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        Ok(Box::new(CommunicateOptimize {
            optim: self.inner.init(node.layout, node.max_steps)?,
            modules: self
                .modules
                .iter()
                .map(|m| m.init(node))
                .collect::<Result<_>>()?,
        }))
    }

    /// Each module's schedule in order, every step; the handles of started transfers are
    /// told apart by module.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        let mut modules = self
            .modules
            .iter()
            .map(|m| m.traffic(info))
            .collect::<Result<Vec<_>>>()?;
        let count = modules.len().max(1) as u64;
        let mut own = Vec::new();
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                for (i, module) in modules.iter_mut().enumerate() {
                    own.clear();
                    module.step(step, &mut own)?;
                    events.extend(own.drain(..).map(|e| match e {
                        PlannedEvent::Start { id, call } => PlannedEvent::Start {
                            id: id * count + i as u64,
                            call,
                        },
                        PlannedEvent::Wait { id } => PlannedEvent::Wait {
                            id: id * count + i as u64,
                        },
                        call => call,
                    }));
                }
                Ok(())
            },
        ))
    }

    /// The inner optimizer's and every module's.
    fn state_values_per_param(&self) -> Option<f64> {
        let modules: f64 = self
            .modules
            .iter()
            .map(|m| m.state_values_per_param())
            .sum();
        Some(self.inner.state_values_per_param() + modules)
    }
}

impl Strategy for CommunicateOptimize {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        self.optim.step(ctx.replica, grads);
        for module in &mut self.modules {
            module.communicate(ctx)?;
        }
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        self.modules.iter().find_map(|m| m.master_params())
    }

    fn committed(&self) -> bool {
        self.modules.iter().all(|m| m.committed())
    }

    fn take_discarded(&mut self) -> bool {
        // Every module's flag is read (and so reset), not just up to the first set one.
        let mut any = false;
        for module in &mut self.modules {
            any |= module.take_discarded();
        }
        any
    }

    fn rejoined(&mut self, replica: &mut dyn Replica) -> Result<()> {
        self.modules
            .iter_mut()
            .try_for_each(|m| m.rejoined(replica))
    }

    fn save_state(&self) -> Result<StateDict> {
        ComposedRecord {
            inner: self.optim.record()?,
            module: self
                .modules
                .iter()
                .map(|m| m.save_state())
                .collect::<Result<_>>()?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = ComposedRecord::from_state(state)?;
        self.optim.load_record(record.inner)?;
        let mut saved = record.module.into_iter();
        for module in &mut self.modules {
            module.load_state(&saved.next().unwrap_or_default())?;
        }
        Ok(())
    }
}

gym_core::record! {
    /// What a [`CommunicateOptimize`] node carries from one step to the next.
    pub struct ComposedRecord {
        /// The inner optimizer's state.
        pub inner: InnerOptimizerRecord,
        /// Each communication module's state, in order.
        pub module: Vec<StateDict>,
    }
}

/// Makes a strategy configuration a composition: `composed_strategy!(Config, NAME, |c| [module,
/// …])` gives it `compose()` (its `inner` optimizer, then the modules the expressions build
/// from `c`, the configuration) and implements [`StrategyConfig`] through it.
macro_rules! composed_strategy {
    ($config:ty, $name:expr, |$c:ident| [$($module:expr),+ $(,)?]) => {
        impl $config {
            /// The composed strategy it describes: its inner optimizer, then its
            /// communication modules in order.
            pub fn compose(&self) -> $crate::communicate::CommunicateOptimizeConfig {
                let $c = self;
                $crate::communicate::CommunicateOptimizeConfig::new($name, $c.inner.clone())
                    $(.with_module($module))+
            }
        }

        impl gym_core::StrategyConfig for $config {
            fn name(&self) -> String {
                $name.into()
            }

            fn to_json(&self) -> serde_json::Value {
                serde_json::to_value(self).expect("config serialises")
            }

            fn init(
                &self,
                node: &gym_core::NodeInfo<'_>,
            ) -> gym_core::Result<Box<dyn gym_core::Strategy>> {
                self.compose().init(node)
            }

            fn traffic(
                &self,
                info: &gym_core::planner::PlanInfo<'_>,
            ) -> gym_core::Result<Box<dyn gym_core::planner::Traffic>> {
                self.compose().traffic(info)
            }

            fn state_values_per_param(&self) -> Option<f64> {
                self.compose().state_values_per_param()
            }
        }
    };
}
pub(crate) use composed_strategy;

/// The clock's charge for a mean in flight across steps: the collective's own, or, in a
/// resumed run, its saved timing, taken again through
/// [`Collective::resume_pending`](gym_core::Collective::resume_pending).
pub(crate) enum Transfer {
    Started(Pending<()>),
    Resumed(Option<TransferTiming>),
}

impl Transfer {
    pub(crate) fn timing(&self) -> Option<TransferTiming> {
        match self {
            Transfer::Started(p) => p.timing(),
            Transfer::Resumed(t) => *t,
        }
    }

    pub(crate) fn wait(self, ctx: &StepContext<'_>) -> Result<()> {
        match self {
            Transfer::Started(p) => p.wait()?,
            Transfer::Resumed(Some(t)) => ctx.collective.resume_pending(t).wait()?,
            Transfer::Resumed(None) => {}
        }
        Ok(())
    }
}
