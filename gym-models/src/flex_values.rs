//! Flex tensors as contiguous `f32` values, the form every flex kernel of this crate reads,
//! and its results as flex tensors again.

use burn::backend::DType;
use burn::backend::flex::FlexTensor;
use burn::tensor::{Shape, TensorData};

/// `t` with its values contiguous (copied if need be); `None` for another type than `f32`.
pub(crate) fn contiguous(t: &FlexTensor) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    Some(if t.as_slice::<f32>().is_some() {
        t.clone()
    } else {
        t.to_contiguous()
    })
}

/// The values of a tensor from [`contiguous`].
pub(crate) fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("a contiguous f32 tensor")
}

/// A contiguous `f32` flex tensor of `shape` holding `values`: what the kernels return.
pub(crate) fn tensor(values: Vec<f32>, shape: impl Into<Shape>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}
