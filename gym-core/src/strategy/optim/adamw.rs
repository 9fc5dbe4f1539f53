//! Burn's AdamW, its arithmetic in one pass over each parameter on the CPU.
//!
//! Burn's `AdamW::step` is about fifteen tensor operations per parameter (each moment's two
//! scales and a sum, the square, both bias corrections, the root, ε, the division, the
//! decay, the learning rate), each one pass over the parameter into a fresh buffer. On a
//! small model that is much of a node's step: 42% of the MNIST MLP's (`perf`, 203k
//! parameters), and every pass streams the parameter through the cache that the node
//! threads share. Here, for `f32` tensors in host memory (flex, ndarray), the same
//! operations run in the same order on each element in one loop, so the parameters and
//! moments are Burn's bit for bit (tests), and the state is Burn's own `AdamWState`, so a
//! checkpoint does not know the difference. AMSGrad, cautious weight decay, other devices
//! and other types take Burn's `AdamW` itself.

use burn::optim::{AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, LearningRate, Optimizer};
use burn::tensor::{DType, Device, Tensor, TensorData};

/// AdamW as Burn computes it, in one pass per parameter where the tensors allow it.
#[derive(Clone)]
pub(crate) struct OnePassAdamW {
    burns: AdamW,
    /// `None`: every step is Burn's (AMSGrad, cautious weight decay).
    settings: Option<Settings>,
}

/// The settings of the one-pass step, read from Burn's configuration.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
struct Settings {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
    #[serde(default)]
    cautious_weight_decay: bool,
    #[serde(default)]
    amsgrad: bool,
}

impl OnePassAdamW {
    /// The optimizer of `config`.
    pub(crate) fn new(config: &AdamWConfig) -> Self {
        // Burn keeps the fields private; its configuration serialises them.
        let settings = serde_json::to_value(config)
            .ok()
            .and_then(|v| serde_json::from_value::<Settings>(v).ok())
            .filter(|s| !s.amsgrad && !s.cautious_weight_decay);
        Self {
            burns: config.build(),
            settings,
        }
    }
}

/// Whether `t` is an `f32` tensor in host memory, whose values [`values`] takes without a
/// copy where `t` holds the only reference to them.
fn host_f32<const D: usize>(t: &Tensor<D>) -> bool {
    t.dtype() == DType::F32 && crate::model::is_host(&t.device())
}

/// The values of a tensor [`host_f32`] accepted.
fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .try_into_vec::<f32>()
        .expect("an f32 tensor, checked by host_f32")
}

/// `values` as a tensor of shape `like` on `device`.
fn tensor<const D: usize>(values: Vec<f32>, like: &[usize], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, like.to_vec()), device)
}

/// One step's constants, in `f32` as Burn's scalar operations use them.
#[derive(Clone, Copy)]
struct Step {
    beta_1: f32,
    beta_2: f32,
    factor_1: f32,
    factor_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    /// `1 − lr·decay`; `None` for no decay (Burn then leaves the parameter as it is).
    keep: Option<f32>,
    rate: f32,
    /// The first step starts the moments at `g·(1 − β)`, as Burn does (not at
    /// `0·β + g·(1 − β)`, which differs for `g = −0`).
    first: bool,
}

impl Step {
    /// Burn's operations, in its order, on each element.
    #[inline(always)]
    fn element(&self, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        (*m, *v) = if self.first {
            (g * self.factor_1, g * g * self.factor_2)
        } else {
            (
                *m * self.beta_1 + g * self.factor_1,
                *v * self.beta_2 + g * g * self.factor_2,
            )
        };
        let delta = (*m / self.correction_1) / ((*v / self.correction_2).sqrt() + self.epsilon);
        let decayed = match self.keep {
            Some(keep) => *p * keep,
            None => *p,
        };
        *p = decayed - delta * self.rate;
    }
}

/// Burn's operations, in its order, on every element.
#[inline(always)]
fn step_all(step: &Step, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    for (((p, g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
        step.element(p, *g, m, v);
    }
}

crate::widest_simd! {
    /// [`step_all`] with the widest vectors the CPU has.
    fn step_widest = step_all(step: &Step, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]);
}

impl Optimizer for OnePassAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        param: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let Some(s) = self.settings else {
            return self.burns.step(lr, param, grad, state);
        };
        let moments_on_host = state.as_ref().is_none_or(|s| {
            host_f32(&s.momentum.moment_1)
                && host_f32(&s.momentum.moment_2)
                && s.momentum.max_moment_2.is_none()
        });
        if !(host_f32(&param) && host_f32(&grad) && moments_on_host)
            || param.shape() != grad.shape()
        {
            return self.burns.step(lr, param, grad, state);
        }
        let (device, dims) = (param.device(), param.shape().dims::<D>());
        let mut p = values(param);
        let g = values(grad);
        let (factor_1, factor_2) = (1.0 - s.beta_1, 1.0 - s.beta_2);
        let (time, mut m, mut v) = match state {
            Some(state) => {
                let momentum = state.momentum;
                let (m, v) = (values(momentum.moment_1), values(momentum.moment_2));
                assert!(
                    m.len() == p.len() && v.len() == p.len(),
                    "AdamW: a moment's shape is not its parameter's"
                );
                (momentum.time + 1, m, v)
            }
            None => (1, vec![0.0; p.len()], vec![0.0; p.len()]),
        };
        // Burn's scalars: the corrections in f32, the decay and the rate from f64 to f32.
        let decay_rate = lr * s.weight_decay as f64;
        let step = Step {
            beta_1: s.beta_1,
            beta_2: s.beta_2,
            factor_1,
            factor_2,
            correction_1: 1f32 - s.beta_1.powi(time as i32),
            correction_2: 1f32 - s.beta_2.powi(time as i32),
            epsilon: s.epsilon,
            keep: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
            rate: lr as f32,
            first: time == 1,
        };
        step_widest(&step, &mut p, &g, &mut m, &mut v);
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: tensor(m, &dims, &device),
            moment_2: tensor(v, &dims, &device),
            max_moment_2: None,
        };
        (tensor(p, &dims, &device), Some(AdamWState { momentum }))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        <AdamW as Optimizer>::to_device(state, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{GradientsParams, ModuleOptimizer};
    use burn::tensor::Distribution;

    fn bits<const D: usize>(t: &Tensor<D>) -> Vec<u32> {
        let values = t.to_data().try_to_vec::<f32>().unwrap();
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// Gradients of mixed scales with exact zeros and negative zeros among them.
    fn gradient(step: usize, device: &Device) -> Tensor<2> {
        let g = Tensor::<2>::random([37, 53], Distribution::Normal(0.0, 1.0), device);
        let mut values = g.into_data().try_to_vec::<f32>().unwrap();
        for (i, v) in values.iter_mut().enumerate() {
            *v *= 10f32.powi((i % 7) as i32 - 3);
            match (i + step) % 11 {
                0 => *v = 0.0,
                1 => *v = -0.0,
                _ => {}
            }
        }
        Tensor::from_data(TensorData::new(values, [37, 53]), device)
    }

    #[test]
    fn parameters_and_moments_are_burns_bit_for_bit() {
        let device = Device::flex();
        let configs = [
            // PyTorch's defaults, Burn's, and no decay (the decay-free branch).
            AdamWConfig::new()
                .with_epsilon(1e-8)
                .with_weight_decay(0.01),
            AdamWConfig::new(),
            AdamWConfig::new().with_weight_decay(0.0).with_beta_2(0.95),
        ];
        for config in configs {
            let (ours, burns) = (OnePassAdamW::new(&config), config.build());
            assert!(ours.settings.is_some(), "the one-pass step is taken");
            let start = Tensor::<2>::random([37, 53], Distribution::Normal(0.0, 1.0), &device);
            let (mut a, mut b) = (start.clone(), start);
            let (mut state_a, mut state_b) = (None, None);
            for step in 0..6 {
                let lr = 3e-4 * (step + 1) as f64;
                let g = gradient(step, &device);
                (a, state_a) = ours.step(lr, a, g.clone(), state_a);
                (b, state_b) = burns.step(lr, b, g, state_b);
                assert_eq!(bits(&a), bits(&b), "parameters after step {step}");
                let (ma, mb) = (
                    &state_a.as_ref().unwrap().momentum,
                    &state_b.as_ref().unwrap().momentum,
                );
                assert_eq!(ma.time, mb.time);
                assert_eq!(
                    bits(&ma.moment_1),
                    bits(&mb.moment_1),
                    "m after step {step}"
                );
                assert_eq!(
                    bits(&ma.moment_2),
                    bits(&mb.moment_2),
                    "v after step {step}"
                );
            }
        }
    }

    #[test]
    fn amsgrad_and_cautious_decay_are_left_to_burn() {
        for config in [
            AdamWConfig::new().with_amsgrad(true),
            AdamWConfig::new().with_cautious_weight_decay(true),
        ] {
            assert!(OnePassAdamW::new(&config).settings.is_none());
        }
    }

    /// Three steps of `optim` on `model` for a loss of fixed inputs.
    fn steps(optim: &mut ModuleOptimizer, mut model: Linear, from: usize) -> Linear {
        let device = Device::flex().autodiff();
        for step in from..from + 3 {
            let x: Vec<f32> = (0..32)
                .map(|i| ((i * 37 + step * 11) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let x = Tensor::<2>::from_data(TensorData::new(x, [4, 8]), &device);
            let loss = model.forward(x).powi_scalar(2).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-3, model, grads);
        }
        model
    }

    #[test]
    fn its_record_is_burns_adamw_record() {
        let device = Device::flex().autodiff();
        let config = AdamWConfig::new().with_weight_decay(0.01);
        let model = LinearConfig::new(8, 5).init(&device);
        let mut ours = ModuleOptimizer::from(OnePassAdamW::new(&config));
        let model = steps(&mut ours, model, 0);
        // Burn's AdamW goes on from the one-pass optimizer's record as the one-pass
        // optimizer itself goes on; a fresh optimizer (no moments) does not.
        let mut burns = ModuleOptimizer::from(config.build()).load_record(ours.to_record());
        let mut fresh = ModuleOptimizer::from(config.build());
        let resumed = steps(&mut burns, model.clone(), 3);
        let restarted = steps(&mut fresh, model.clone(), 3);
        let went_on = steps(&mut ours, model, 3);
        let all = |m: &Linear| [bits(&m.weight.val()), bits(&m.bias.as_ref().unwrap().val())];
        assert_eq!(all(&resumed), all(&went_on));
        assert_ne!(all(&restarted), all(&went_on));
    }
}
