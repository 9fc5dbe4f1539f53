//! Composition: a local optimizer step followed by communication modules, each deciding its
//! own timing (the original's `CommunicateOptimizeStrategy`).

use burn::module::Module;
use burn::tensor::Tensor;
use gym_core::{
    InnerOptimizer, InnerOptimizerConfig, NodeInfo, Result, StepContext, Strategy, StrategyConfig,
};
use std::sync::Arc;

/// A node's trainable parameters as one flat buffer, flattened only when a module asks for
/// them and written back only when a module changed them.
pub struct FlatParams<'a> {
    flatten: &'a dyn Fn() -> Tensor<1>,
    flat: Option<Tensor<1>>,
    changed: bool,
}

impl<'a> FlatParams<'a> {
    /// Parameters produced on demand by `flatten`.
    pub fn new(flatten: &'a dyn Fn() -> Tensor<1>) -> Self {
        FlatParams {
            flatten,
            flat: None,
            changed: false,
        }
    }

    /// The current values (flattened on first use).
    pub fn get(&mut self) -> Tensor<1> {
        self.flat.get_or_insert_with(|| (self.flatten)()).clone()
    }

    /// Replaces the values.
    pub fn set(&mut self, values: Tensor<1>) {
        self.flat = Some(values);
        self.changed = true;
    }

    /// The new values, if a module set any.
    pub fn into_changed(self) -> Option<Tensor<1>> {
        self.changed.then_some(self.flat).flatten()
    }
}

/// Whether a module that synchronises every `period` steps does so after the inner step of
/// `step`: after every `period`-th inner step (steps `period−1`, `2·period−1`, …), so each
/// round has exactly `period` local steps. (The original syncs when `t > 0 && t % H == 0`,
/// which makes its first round `H+1` steps long.)
pub fn is_sync_step(step: usize, period: usize) -> bool {
    period > 0 && (step + 1).is_multiple_of(period)
}

/// One communication step of a composed strategy, run after every inner optimizer step.
/// It decides from `ctx.step` whether to act, and talks through `ctx.collective`.
///
/// # Example: parameters quantized to 8 bits before they are averaged
///
/// ```
/// use burn::tensor::Tensor;
/// use gym_core::{NodeInfo, ReduceOp, Result, StepContext};
/// use gym_strategies::communicate::{CommunicationModule, CommunicationModuleConfig, FlatParams};
///
/// /// Every `every` steps, average the parameters after rounding them to 256 levels.
/// #[derive(Debug)]
/// struct QuantizedAverage { every: usize, scale: f32 }
///
/// impl CommunicationModule for QuantizedAverage {
///     fn communicate(&mut self, params: &mut FlatParams<'_>, ctx: &mut StepContext<'_>) -> Result<()> {
///         if !gym_strategies::communicate::is_sync_step(ctx.step, self.every) {
///             return Ok(());
///         }
///         let q = params.get().div_scalar(self.scale).round().clamp(-128.0, 127.0);
///         let mean = ctx.collective.all_reduce(q, ReduceOp::Mean)?;
///         params.set(mean.mul_scalar(self.scale));
///         Ok(())
///     }
/// }
///
/// #[derive(Debug)]
/// struct QuantizedAverageConfig;
/// impl CommunicationModuleConfig for QuantizedAverageConfig {
///     fn name(&self) -> String { "quantized-average".into() }
///     fn to_json(&self) -> serde_json::Value { serde_json::json!({ "every": 10 }) }
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
    /// Runs after the inner step of `ctx.step`; may read and replace `params`.
    fn communicate(&mut self, params: &mut FlatParams<'_>, ctx: &mut StepContext<'_>)
    -> Result<()>;

    /// A master copy of the parameters kept by the module (DiLoCo's outer model), if any.
    fn master_params(&self) -> Option<Tensor<1>> {
        None
    }
}

/// Builds a [`CommunicationModule`] on each node.
pub trait CommunicationModuleConfig: Send + Sync {
    /// Name for logs.
    fn name(&self) -> String;
    /// Settings for `config.json`.
    fn to_json(&self) -> serde_json::Value;
    /// The module of one node.
    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>>;
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
    type Strategy = CommunicateOptimize;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "inner": serde_json::to_value(&self.inner).expect("serialises"),
            "modules": self.modules.iter().map(|m| serde_json::json!({ "name": m.name(), "config": m.to_json() })).collect::<Vec<_>>(),
        })
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<CommunicateOptimize> {
        Ok(CommunicateOptimize {
            optim: self.inner.init(node.max_steps)?,
            modules: self
                .modules
                .iter()
                .map(|m| m.init(node))
                .collect::<Result<_>>()?,
        })
    }
}

impl Strategy for CommunicateOptimize {
    fn step<M: Module>(
        &mut self,
        model: M,
        grads: Tensor<1>,
        ctx: &mut StepContext<'_>,
    ) -> Result<M> {
        let model = self.optim.step(model, grads, ctx.layout);
        let layout = ctx.layout;
        let flatten = || layout.flatten(&model);
        let mut params = FlatParams::new(&flatten);
        for module in &mut self.modules {
            module.communicate(&mut params, ctx)?;
        }
        Ok(match params.into_changed() {
            Some(flat) => layout.load(model, flat),
            None => model,
        })
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        self.modules.iter().find_map(|m| m.master_params())
    }
}

/// Implements [`StrategyConfig`] for a strategy configuration that describes a
/// [`CommunicateOptimizeConfig`] through a `compose()` method.
macro_rules! composed_strategy {
    ($config:ty, $name:literal) => {
        impl gym_core::StrategyConfig for $config {
            type Strategy = $crate::communicate::CommunicateOptimize;

            fn name(&self) -> String {
                $name.into()
            }

            fn to_json(&self) -> serde_json::Value {
                serde_json::to_value(self).expect("config serialises")
            }

            fn init(&self, node: &gym_core::NodeInfo<'_>) -> gym_core::Result<Self::Strategy> {
                self.compose().init(node)
            }
        }
    };
}
pub(crate) use composed_strategy;
