//! Flex tensors as contiguous `f32` values, the form every flex kernel of this crate reads.

use burn::backend::DType;
use burn::backend::flex::FlexTensor;

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
