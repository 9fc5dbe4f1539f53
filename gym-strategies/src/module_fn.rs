//! Modules of one's own without a configuration type: a closure that builds each node's
//! module ([`module_fn`]), or two closures, one that makes a node's state and one run at
//! the end of every round ([`round_fn`]), as [`std::iter::from_fn`] makes an iterator of a
//! closure.

use crate::communicate::{CommunicationModule, CommunicationModuleConfig};
use burn::tensor::Tensor;
use gym_core::state::fields::{Record, Values};
use gym_core::{NodeInfo, Result, StateDict, StepContext};

/// A communication module's configuration made of a name and a function that builds each
/// node's module ([`module_fn`]).
pub struct ModuleFn<F> {
    name: String,
    build: F,
}

/// A module of one's own without a configuration type: `build` makes each node's module
/// from its [`NodeInfo`] (the settings it captures, and the node's starting parameters,
/// rank, layout…), as [`std::iter::from_fn`] makes an iterator of a closure. Its state is
/// not checkpointed unless the module implements
/// [`save_state`](CommunicationModule::save_state) and
/// [`load_state`](CommunicationModule::load_state). For a module that acts once a round
/// with one tensor of state, [`round_fn`] needs no module type at all.
pub fn module_fn<F, M>(name: impl Into<String>, build: F) -> ModuleFn<F>
where
    F: Fn(&NodeInfo<'_>) -> M + Send + Sync,
    M: CommunicationModule + 'static,
{
    ModuleFn {
        name: name.into(),
        build,
    }
}

impl<F, M> CommunicationModuleConfig for ModuleFn<F>
where
    F: Fn(&NodeInfo<'_>) -> M + Send + Sync,
    M: CommunicationModule + 'static,
{
    fn name(&self) -> String {
        self.name.clone()
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        Ok(Box::new((self.build)(node)))
    }
}

/// A module that acts at the end of every round of `h` steps ([`StepContext::ends_round`])
/// with one tensor of state per node, which checkpoints save: `init` makes a node's state
/// from its [`NodeInfo`] (its starting parameters, rank…), and `round` runs at the end of
/// each round with the state and the step's context (the replica in it). With
/// [`CommunicateOptimizeConfig`](crate::CommunicateOptimizeConfig) a DiLoCo-like strategy
/// is one function: `examples/examples/lookahead.rs`, DiLoCo with a Lookahead outer step.
///
/// ```
/// use gym_core::{InnerOptimizerConfig, ReduceOp};
/// use gym_strategies::{CommunicateOptimizeConfig, round_fn};
///
/// // Every 10 steps, the replicas restart from their mean (DiLoCo with a plain outer step).
/// let average = round_fn("average", 10, |node| node.initial_params.clone(), |_, ctx| {
///     let mean = ctx.collective.all_reduce(ctx.replica.params(), ReduceOp::Mean)?;
///     ctx.replica.set_params(mean);
///     Ok(())
/// });
/// let strategy = CommunicateOptimizeConfig::new("average", InnerOptimizerConfig::new())
///     .with_module(average);
/// # let _ = strategy;
/// ```
pub fn round_fn<I, R>(name: impl Into<String>, h: usize, init: I, round: R) -> RoundFn<I, R>
where
    I: Fn(&NodeInfo<'_>) -> Tensor<1> + Send + Sync,
    R: RoundStep,
{
    RoundFn {
        name: name.into(),
        h,
        init,
        round,
    }
}

/// What [`round_fn`] runs at the end of each round: any closure of this shape.
pub trait RoundStep:
    Fn(&mut Tensor<1>, &mut StepContext<'_>) -> Result<()> + Clone + Send + Sync + 'static
{
}

impl<R> RoundStep for R where
    R: Fn(&mut Tensor<1>, &mut StepContext<'_>) -> Result<()> + Clone + Send + Sync + 'static
{
}

/// A communication module's configuration made of a name, a round length and two closures
/// ([`round_fn`]).
pub struct RoundFn<I, R> {
    name: String,
    h: usize,
    init: I,
    round: R,
}

impl<I, R> CommunicationModuleConfig for RoundFn<I, R>
where
    I: Fn(&NodeInfo<'_>) -> Tensor<1> + Send + Sync,
    R: RoundStep,
{
    fn name(&self) -> String {
        self.name.clone()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "h": self.h })
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        if self.h == 0 {
            return Err(gym_core::GymError::InvalidConfig(format!(
                "module `{}`: a round is at least one step (h = 0)",
                self.name
            )));
        }
        Ok(Box::new(RoundModule {
            h: self.h,
            state: (self.init)(node),
            round: self.round.clone(),
            uncommitted: false,
        }))
    }
}

/// One node's module of a [`round_fn`].
struct RoundModule<R> {
    h: usize,
    state: Tensor<1>,
    round: R,
    /// Steps taken since the last round ended: this node's work not merged yet.
    uncommitted: bool,
}

impl<R: RoundStep> CommunicationModule for RoundModule<R> {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        self.uncommitted = !ctx.ends_round(self.h);
        if !self.uncommitted {
            (self.round)(&mut self.state, ctx)?;
        }
        Ok(())
    }

    fn committed(&self) -> bool {
        !self.uncommitted
    }

    fn save_state(&self) -> Result<StateDict> {
        RoundRecord {
            state: Values::of(&self.state)?,
            uncommitted: self.uncommitted,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = RoundRecord::from_state(state)?;
        let (n, device) = (self.state.dims()[0], self.state.device());
        self.state = record.state.tensor(n, &device)?;
        self.uncommitted = record.uncommitted;
        Ok(())
    }
}

gym_core::record! {
    /// What a [`round_fn`] module carries between rounds.
    pub struct RoundRecord {
        /// The node's state.
        pub state: Values,
        /// Whether steps were taken since the last round ended.
        pub uncommitted: bool,
    }
}
