//! A node's model as a strategy sees it.
//!
//! Strategies work on parameters, not on a model type: a [`Replica`] shows the trainable
//! parameters as one flat buffer (in [`ParamLayout`] order) and lets Burn's optimizers step
//! them. This is what lets a strategy be a value (`Box<dyn StrategyConfig>`) that trains any
//! model: the model's type stays with the node loop, inside a [`ModelReplica`].

use crate::state::params::ParamLayout;
use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::tensor::Tensor;

/// One node's model replica, type-erased for its [`Strategy`](crate::Strategy).
pub trait Replica {
    /// The trainable parameters, flat in layout order, without autodiff.
    fn params(&mut self) -> Tensor<1>;

    /// Replaces the trainable parameters. Burn's parameter ids are kept, so optimizer state
    /// stays attached to its parameter.
    ///
    /// # Panics
    /// If `params` does not have the layout's number of elements.
    fn set_params(&mut self, params: Tensor<1>);

    /// One step of Burn's `optimizer` with the flat gradient `grads` (layout order) at the
    /// learning rate(s) `lr`.
    fn optimizer_step(
        &mut self,
        optimizer: &mut ModuleOptimizer,
        lr: ModuleLearningRate,
        grads: Tensor<1>,
    );
}

/// A [`Replica`] over a Burn module.
///
/// Flat values are made on demand and written back into the module once, when the model
/// is next needed ([`model`](Self::model)) or the strategy's step ends
/// ([`flush`](Self::flush)): strategies that compose several communication modules touch
/// the model once per step, not once per module.
pub struct ModelReplica<M> {
    model: Option<M>,
    layout: ParamLayout,
    flat: Option<Tensor<1>>,
    dirty: bool,
}

impl<M: Module> ModelReplica<M> {
    /// The replica of `model`, whose trainable parameters are `layout`
    /// ([`ParamLayout::trainable`] of the model).
    pub fn new(model: M, layout: ParamLayout) -> Self {
        ModelReplica {
            model: Some(model),
            layout,
            flat: None,
            dirty: false,
        }
    }

    /// The layout of the trainable parameters.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The model, with every parameter set so far written into it.
    pub fn model(&mut self) -> &M {
        self.flush();
        self.model.as_ref().expect("the model is always present")
    }

    /// Writes pending parameters into the model and drops the flat copy.
    pub fn flush(&mut self) {
        if let Some(flat) = self.flat.take()
            && std::mem::take(&mut self.dirty)
        {
            let model = self.take();
            self.model = Some(self.layout.load(model, flat));
        }
    }

    /// Replaces the model by `f` of it (every parameter set so far written in first).
    pub fn map_model(&mut self, f: impl FnOnce(M) -> M) {
        self.flush();
        self.flat = None;
        let model = self.take();
        self.model = Some(f(model));
    }

    /// The model, with every parameter set so far written into it.
    pub fn into_model(mut self) -> M {
        self.flush();
        self.take()
    }

    fn take(&mut self) -> M {
        self.model.take().expect("the model is always present")
    }
}

impl<M: Module> Replica for ModelReplica<M> {
    fn params(&mut self) -> Tensor<1> {
        if self.flat.is_none() {
            let model = self.model.as_ref().expect("the model is always present");
            self.flat = Some(self.layout.flatten(model));
        }
        self.flat.clone().expect("just set")
    }

    fn set_params(&mut self, params: Tensor<1>) {
        assert_eq!(
            params.shape().num_elements(),
            self.layout.num_elements(),
            "the parameters do not match the layout"
        );
        self.flat = Some(params);
        self.dirty = true;
    }

    fn optimizer_step(
        &mut self,
        optimizer: &mut ModuleOptimizer,
        lr: ModuleLearningRate,
        grads: Tensor<1>,
    ) {
        self.flush();
        let model = self.take();
        let grads = self.layout.to_gradients_params(grads);
        self.model = Some(optimizer.step(lr, model, grads));
    }
}

/// A [`Replica`] that is only its flat parameters, without a model: for driving a strategy,
/// a communication module or a compressor by hand (a [`StepContext`](crate::StepContext)
/// needs a replica), in tests and small experiments.
///
/// # Panics
/// In [`optimizer_step`](Replica::optimizer_step): there is no module for Burn's optimizer
/// to step; step the values by hand with [`set_params`](Replica::set_params).
pub struct FlatReplica(pub Tensor<1>);

impl Replica for FlatReplica {
    fn params(&mut self) -> Tensor<1> {
        self.0.clone()
    }

    fn set_params(&mut self, params: Tensor<1>) {
        self.0 = params;
    }

    fn optimizer_step(&mut self, _: &mut ModuleOptimizer, _: ModuleLearningRate, _: Tensor<1>) {
        panic!("a FlatReplica has no module for Burn's optimizer to step")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::SgdConfig;
    use burn::tensor::{Device, TensorData};

    fn values(t: Tensor<1>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn parameters_set_are_seen_by_the_model_and_by_an_optimizer_step() {
        let device = Device::default().autodiff();
        let lin: Linear = LinearConfig::new(2, 1).init(&device);
        let layout = ParamLayout::trainable(&lin);
        let mut r = ModelReplica::new(lin, layout);
        let host = device.clone().inner();
        let flat = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [3]), &host);
        r.set_params(flat(vec![1.0, 2.0, 3.0]));
        assert_eq!(
            values(r.params()),
            vec![1.0, 2.0, 3.0],
            "read back before a flush"
        );
        // SGD lr 0.5 with gradient 1 everywhere, on the values set above.
        let mut sgd = SgdConfig::new().init();
        r.optimizer_step(&mut sgd, 0.5.into(), flat(vec![1.0, 1.0, 1.0]));
        assert_eq!(values(r.params()), vec![0.5, 1.5, 2.5]);
        let model = r.into_model();
        assert_eq!(
            values(model.weight.val().inner().reshape([2])),
            vec![0.5, 1.5]
        );
    }
}
