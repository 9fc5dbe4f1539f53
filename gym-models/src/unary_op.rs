//! One-input operations of the autodiff graph whose gradient is a function of a kept state
//! and the output gradient: the fused softmaxes, GELU, attention and cross-entropy, and the
//! 2×2 max pooling. Their graph bookkeeping is written once here.

use burn::backend::Backend;
use burn::backend::tensor::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};

/// The input's gradient from the kept state and the output gradient.
type Gradient<B, S> = fn(S, FloatTensor<B>) -> FloatTensor<B>;

/// The graph's node of a one-input operation: its gradient function.
#[derive(Debug)]
struct UnaryOp<B: Backend, S> {
    gradient: Gradient<B, S>,
}

impl<B: Backend, S: Clone + Send + std::fmt::Debug + 'static> Backward<B, 1> for UnaryOp<B, S> {
    type State = S;

    fn backward(self, ops: Ops<S, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        unary::<B, _>(ops.parents, ops.node, grads, |dy| {
            (self.gradient)(ops.state, dy)
        });
    }
}

/// `x` through a one-input operation of the graph, its gradient `gradient(state, dy)`. Where
/// the graph tracks `x`, `tracked` gives the output and the state the gradient needs;
/// elsewhere `untracked` gives the output alone.
pub(crate) fn unary_op<B: Backend, C: CheckpointStrategy, S>(
    x: FloatTensor<Autodiff<B, C>>,
    tracked: impl FnOnce(FloatTensor<B>) -> (FloatTensor<B>, S),
    untracked: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
    gradient: Gradient<B, S>,
) -> FloatTensor<Autodiff<B, C>>
where
    S: Clone + Send + std::fmt::Debug + 'static,
{
    let op = UnaryOp { gradient };
    match op.prepare::<C>([x.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (output, state) = tracked(x.into_primitive());
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(untracked(x.into_primitive())),
    }
}
