//! Which Burn backend the examples run on.

use burn::tensor::Device;

/// The device to train on: the first backend compiled in (features `cuda`, `wgpu`/`metal`/
/// `vulkan`, `tch`, `flex`, `ndarray`, in Burn's order of preference), unless the
/// `BURN_DEVICE` environment variable names another (`flex`, `ndarray`, `wgpu`, `vulkan`,
/// `cuda`, …). Returns the device and a printable name of its backend.
pub fn select() -> (Device, String) {
    let device = Device::default();
    let name = format!("{device:?}");
    (device, name)
}
