//! The dense formats, one file each, registered in [`quantizer`](super::quantizer)'s list.

pub(crate) mod bf16;
pub(crate) mod fp4;
pub(crate) mod fp8;
pub(crate) mod int8;
pub(crate) mod qsgd;
pub(crate) mod two_bit;
