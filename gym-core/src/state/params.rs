//! A model's parameters as one flat buffer, and back.
//!
//! Strategies communicate a whole model in one collective call: a [`ParamLayout`] records
//! where each parameter lives in a flat `Tensor<1>` (in Burn's visit order, which is
//! deterministic), flattens values or gradients into that buffer, and writes a buffer back
//! while keeping each parameter's [`ParamId`], so optimizer state stays attached.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Gradients, Tensor};

/// Where one parameter sits in the flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamEntry {
    /// Burn's identifier, which keys optimizer state and gradients.
    pub id: ParamId,
    /// Dotted module path, e.g. `conv1.weight`.
    pub path: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// First element in the flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub numel: usize,
}

/// The layout of a model's float tensors in one flat buffer.
///
/// Two selections exist: [`trainable`](Self::trainable) (parameters that receive gradients,
/// what optimizers and strategies work on) and [`all_float`](Self::all_float) (also
/// buffers such as batch-norm running statistics, what the final model average covers).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamLayout {
    entries: Vec<ParamEntry>,
    /// For each float tensor in visit order: whether it belongs to the layout.
    selected: Vec<bool>,
    num_elements: usize,
}

impl ParamLayout {
    /// Parameters that require gradients. Call it on the training model (on an autodiff
    /// device): a [`valid`](Module::valid) snapshot reports no trainable parameter.
    pub fn trainable<M: Module>(model: &M) -> Self {
        Self::collect(model, true)
    }

    /// Every float tensor of the module: parameters and running statistics.
    pub fn all_float<M: Module>(model: &M) -> Self {
        Self::collect(model, false)
    }

    fn collect<M: Module>(model: &M, trainable_only: bool) -> Self {
        let mut v = LayoutVisitor {
            trainable_only,
            path: Vec::new(),
            layout: ParamLayout {
                entries: Vec::new(),
                selected: Vec::new(),
                num_elements: 0,
            },
        };
        model.visit(&mut v);
        v.layout
    }

    /// The parameters, in visit order.
    pub fn entries(&self) -> &[ParamEntry] {
        &self.entries
    }

    /// Total number of elements of the flat buffer.
    pub fn num_elements(&self) -> usize {
        self.num_elements
    }

    /// Concatenates the values into one flat tensor (without autodiff) on the model's device.
    pub fn flatten<M: Module>(&self, model: &M) -> Tensor<1> {
        let mut g = Gather {
            layout: self,
            index: 0,
            grads: None,
            parts: Vec::with_capacity(self.entries.len()),
        };
        model.visit(&mut g);
        Tensor::cat(g.parts, 0)
    }

    /// Writes `flat` back into the model, keeping ids, autodiff and gradient requirements.
    ///
    /// # Panics
    /// If `flat` does not have [`num_elements`](Self::num_elements) elements.
    pub fn load<M: Module>(&self, model: M, flat: Tensor<1>) -> M {
        assert_eq!(
            flat.shape().num_elements(),
            self.num_elements,
            "flat buffer size does not match the layout"
        );
        let mut s = Scatter {
            layout: self,
            index: 0,
            entry: 0,
            flat: flat.inner(),
        };
        model.map(&mut s)
    }

    /// Gives the model's parameters in this layout the ids `ids` (in [`entries`](Self::entries)
    /// order), so that optimizer state saved under those ids applies to them again (a
    /// resumed run's model is built afresh, with new ids).
    pub fn with_ids<M: Module>(&self, model: M, ids: &[ParamId]) -> M {
        let mut m = Renumber {
            layout: self,
            index: 0,
            entry: 0,
            ids,
        };
        model.map(&mut m)
    }

    /// Takes this step's gradients out of `grads` into one flat tensor. A parameter that got
    /// no gradient (unused in the forward pass) contributes zeros, so every node's buffer has
    /// the same layout.
    pub fn flatten_grads<M: Module>(&self, model: &M, grads: &mut Gradients) -> Tensor<1> {
        let mut g = Gather {
            layout: self,
            index: 0,
            grads: Some(grads),
            parts: Vec::with_capacity(self.entries.len()),
        };
        model.visit(&mut g);
        Tensor::cat(g.parts, 0)
    }

    /// Splits a flat gradient into Burn's per-parameter [`GradientsParams`], for
    /// [`ModuleOptimizer::step`](burn::optim::ModuleOptimizer::step).
    pub fn to_gradients_params(&self, flat: Tensor<1>) -> GradientsParams {
        let mut out = GradientsParams::new();
        for e in &self.entries {
            let part = flat.clone().narrow(0, e.offset, e.numel);
            register(&mut out, e, part);
        }
        out
    }

    /// Whether the float tensor visited `index`-th belongs to the layout.
    fn selects(&self, index: usize) -> bool {
        self.selected.get(index).copied().unwrap_or(false)
    }

    /// The slice of `flat` holding parameter `index` (in [`entries`](Self::entries) order).
    pub fn slice(&self, flat: &Tensor<1>, index: usize) -> Tensor<1> {
        let e = &self.entries[index];
        flat.clone().narrow(0, e.offset, e.numel)
    }
}

fn register(out: &mut GradientsParams, e: &ParamEntry, part: Tensor<1>) {
    macro_rules! reg {
        ($d:literal) => {{
            let shape: [usize; $d] = e.shape.clone().try_into().expect("rank checked");
            out.register::<$d>(e.id, part.reshape(shape))
        }};
    }
    match e.shape.len() {
        1 => reg!(1),
        2 => reg!(2),
        3 => reg!(3),
        4 => reg!(4),
        5 => reg!(5),
        6 => reg!(6),
        r => panic!("parameters of rank {r} are not supported"),
    }
}

struct LayoutVisitor {
    trainable_only: bool,
    path: Vec<String>,
    layout: ParamLayout,
}

impl ModuleVisitor for LayoutVisitor {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let keep = !self.trainable_only || param.is_require_grad();
        self.layout.selected.push(keep);
        if keep {
            let shape = param.lazy_shape().dims::<D>().to_vec();
            let numel: usize = shape.iter().product();
            self.layout.entries.push(ParamEntry {
                id: param.id,
                path: self.path.join("."),
                shape,
                offset: self.layout.num_elements,
                numel,
            });
            self.layout.num_elements += numel;
        }
    }
}

/// Collects the selected tensors' values, or with `grads` their gradients, as flat parts.
struct Gather<'a> {
    layout: &'a ParamLayout,
    index: usize,
    grads: Option<&'a mut Gradients>,
    parts: Vec<Tensor<1>>,
}

impl ModuleVisitor for Gather<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let keep = self.layout.selects(self.index);
        self.index += 1;
        if !keep {
            return;
        }
        let value = param.val();
        let n = value.shape().num_elements();
        let part = match self.grads.as_deref_mut() {
            None => value.inner().reshape([n]),
            Some(grads) => match value.grad_remove(grads) {
                Some(g) => g.reshape([n]),
                None => Tensor::zeros([n], &value.device().inner()),
            },
        };
        self.parts.push(part);
    }
}

struct Scatter<'a> {
    layout: &'a ParamLayout,
    index: usize,
    entry: usize,
    flat: Tensor<1>,
}

impl ModuleMapper for Scatter<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let keep = self.layout.selects(self.index);
        self.index += 1;
        if !keep {
            return param;
        }
        let e = &self.layout.entries[self.entry];
        self.entry += 1;
        let part = self.flat.clone().narrow(0, e.offset, e.numel);
        param.map(|t| {
            let device = t.device();
            let v = part.reshape(t.shape()).to_device(&device.clone().inner());
            let v = if t.is_autodiff() { v.autodiff() } else { v };
            v.set_require_grad(t.is_require_grad())
        })
    }
}

struct Renumber<'a> {
    layout: &'a ParamLayout,
    index: usize,
    entry: usize,
    ids: &'a [ParamId],
}

impl ModuleMapper for Renumber<'_> {
    fn map_float<const D: usize>(&mut self, mut param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let keep = self.layout.selects(self.index);
        self.index += 1;
        if keep {
            if let Some(&id) = self.ids.get(self.entry) {
                param.id = id;
            }
            self.entry += 1;
        }
        param
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
    use burn::tensor::{Device, TensorData};

    #[derive(Module, Debug)]
    struct Net {
        a: Linear,
        norm: BatchNorm,
    }

    fn net(device: &Device) -> Net {
        Net {
            a: LinearConfig::new(3, 2).init(device),
            norm: BatchNormConfig::new(2).init(device),
        }
    }

    #[test]
    fn layouts_select_trainable_parameters_or_every_float_tensor() {
        let m = net(&Device::default().autodiff());
        let t = ParamLayout::trainable(&m);
        let paths: Vec<&str> = t.entries().iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a.weight", "a.bias", "norm.gamma", "norm.beta"]);
        assert_eq!(t.num_elements(), 6 + 2 + 2 + 2);
        // Plus the running mean and variance.
        assert_eq!(ParamLayout::all_float(&m).num_elements(), 12 + 4);
    }

    #[test]
    fn load_then_flatten_round_trips_and_keeps_ids() {
        let device = Device::default().autodiff();
        let m = net(&device);
        let layout = ParamLayout::trainable(&m);
        let values: Vec<f32> = (0..layout.num_elements()).map(|i| i as f32 * 0.5).collect();
        let flat = Tensor::<1>::from_data(TensorData::new(values.clone(), [values.len()]), &device);
        let m = layout.load(m, flat);
        let back: Vec<f32> = layout.flatten(&m).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(back, values);
        assert_eq!(
            ParamLayout::trainable(&m),
            layout,
            "ids, paths and require_grad kept"
        );
    }

    #[test]
    fn gradients_flatten_in_layout_order() {
        let device = Device::default().autodiff();
        let lin = LinearConfig::new(2, 1).init(&device);
        let layout = ParamLayout::trainable(&lin);
        let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0], [1, 2]), &device);
        // d/dw (w·x + b) = x, d/db = 1.
        let mut grads = lin.forward(x).sum().backward();
        let g: Vec<f32> = layout
            .flatten_grads(&lin, &mut grads)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(g, vec![1.0, 2.0, 1.0]);
        let gp =
            layout.to_gradients_params(Tensor::from_data(TensorData::new(g, [3]), &device.inner()));
        assert_eq!(gp.len(), 2);
    }
}
