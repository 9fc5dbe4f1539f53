//! AllReduce: the data-parallel baseline, equivalent to PyTorch DDP (the original's
//! `SimpleReduceStrategy`).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::Tensor;
use gym_core::{
    InnerOptimizer, InnerOptimizerConfig, NodeInfo, ReduceOp, Result, StepContext, Strategy,
    StrategyConfig,
};

/// Configuration of [`AllReduce`].
#[derive(Config, Debug)]
pub struct AllReduceConfig {
    /// The optimizer every node steps with the averaged gradient (clipped after averaging).
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
}

/// Every step: mean of the gradients over all nodes → clip → optimizer step (the
/// original's `SimpleReduceStrategy`). All replicas
/// stay identical, so K nodes with batch `b` train as one node with batch `K·b`.
///
/// Traffic per step: one all-reduce of the gradient (ring: 2(K−1)/K × 4 bytes per
/// parameter, per node).
pub struct AllReduce {
    optim: InnerOptimizer,
}

impl StrategyConfig for AllReduceConfig {
    type Strategy = AllReduce;

    fn name(&self) -> String {
        "allreduce".into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<AllReduce> {
        Ok(AllReduce {
            optim: self.inner.init(node.max_steps)?,
        })
    }
}

impl Strategy for AllReduce {
    fn step<M: Module>(
        &mut self,
        model: M,
        grads: Tensor<1>,
        ctx: &mut StepContext<'_>,
    ) -> Result<M> {
        let grads = ctx.collective.all_reduce(grads, ReduceOp::Mean)?;
        Ok(self.optim.step(model, grads, ctx.layout))
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }
}
