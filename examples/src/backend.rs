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

/// The devices of a `--devices` list (`flex,ndarray`, `cuda:0,cuda:1`, …): each entry a
/// backend compiled into this build, with a device index where the backend has several.
pub fn parse_devices(list: &str) -> Result<Vec<Device>, String> {
    let devices = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| parse_device(entry).and_then(|device| usable(entry, device)))
        .collect::<Result<Vec<_>, _>>()?;
    if devices.is_empty() {
        return Err(format!("--devices {list:?}: no device named"));
    }
    Ok(devices)
}

/// `device` if it can hold a tensor. A device its backend cannot open (a CUDA device on a
/// machine without a driver or a GPU, a Vulkan device without a driver) makes the backend
/// panic at the first tensor, sometimes on a thread of its own (wgpu's device server, whose
/// end the caller then sees as a closed channel); here that becomes an error naming the
/// entry and the first thing the backend said, before training starts.
fn usable(entry: &str, device: Device) -> Result<Device, String> {
    let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let hook = std::panic::take_hook();
    let heard = said.clone();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "it panicked".into());
        heard.lock().unwrap_or_else(|p| p.into_inner()).push(text);
    }));
    let probe = std::panic::catch_unwind(|| {
        burn::tensor::Tensor::<1>::zeros([1], &device).into_data();
    });
    std::panic::set_hook(hook);
    if probe.is_ok() {
        return Ok(device);
    }
    let said = said.lock().unwrap_or_else(|p| p.into_inner());
    let text = said.first().map_or("it panicked", String::as_str);
    // LibTorch's messages come wrapped in tch's `Torch("…")` and carry a C++ stack after
    // their first line.
    let text = text.split_once("Torch(\"").map_or(text, |(_, rest)| rest);
    let first = text
        .split("\\n")
        .next()
        .unwrap_or(text)
        .lines()
        .next()
        .unwrap_or(text);
    Err(format!("device {entry:?} cannot be used: {first}"))
}

/// One `--devices` entry.
fn parse_device(entry: &str) -> Result<Device, String> {
    // `cpu` as the index: a software device of wgpu's (Mesa's lavapipe for Vulkan), how
    // its path is checked without a GPU.
    let (name, index, software) = match entry.split_once(':') {
        Some((name @ ("wgpu" | "vulkan"), "cpu")) => (name, None, true),
        Some((name, index)) => {
            let index: usize = index
                .parse()
                .map_err(|_| format!("device {entry:?}: {index:?} is not a device index"))?;
            (name, Some(index), false)
        }
        None => (entry, None, false),
    };
    let missing = |feature: &str| {
        format!("device {entry:?} needs the `{feature}` feature (cargo run --features {feature})")
    };
    // Each is used only by the backends this build leaves out (or has).
    let _ = (&missing, index, software);
    match name {
        "default" => Ok(Device::default()),
        "flex" => {
            #[cfg(feature = "flex")]
            return Ok(Device::flex());
            #[cfg(not(feature = "flex"))]
            return Err(missing("flex"));
        }
        "ndarray" => {
            // Burn deprecates its ndarray backend but still ships it.
            #[cfg(feature = "ndarray")]
            #[allow(deprecated)]
            return Ok(Device::ndarray());
            #[cfg(not(feature = "ndarray"))]
            return Err(missing("ndarray"));
        }
        "cuda" => {
            #[cfg(feature = "cuda")]
            return Ok(Device::cuda(index.unwrap_or(0)));
            #[cfg(not(feature = "cuda"))]
            return Err(missing("cuda"));
        }
        "wgpu" | "vulkan" | "metal" => {
            #[cfg(feature = "wgpu")]
            {
                let kind = if software {
                    burn::tensor::DeviceKind::Cpu
                } else {
                    burn::tensor::DeviceKind::DiscreteGpu(index.unwrap_or(0))
                };
                return Ok(match name {
                    #[cfg(feature = "vulkan")]
                    "vulkan" => Device::vulkan(kind),
                    #[cfg(feature = "metal")]
                    "metal" => Device::metal(kind),
                    _ => Device::wgpu(kind),
                });
            }
            #[cfg(not(feature = "wgpu"))]
            return Err(missing(name));
        }
        "tch" => {
            // Burn deprecates its LibTorch backend but still ships it.
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            return Ok(Device::libtorch());
            #[cfg(not(feature = "tch"))]
            return Err(missing("tch"));
        }
        "tch-cuda" => {
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            return Ok(Device::libtorch_cuda(index.unwrap_or(0)));
            #[cfg(not(feature = "tch"))]
            return Err(missing("tch"));
        }
        _ => Err(format!(
            "device {entry:?}: expected default, flex, ndarray, cuda:N, wgpu:N, wgpu:cpu, \
             vulkan:N, vulkan:cpu, metal:N, tch or tch-cuda:N"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_list_is_parsed_in_order_and_bad_entries_are_named() {
        let devices = parse_devices("default, default").unwrap();
        assert_eq!(devices, vec![Device::default(), Device::default()]);
        #[cfg(feature = "flex")]
        assert_eq!(parse_devices("flex").unwrap(), vec![Device::flex()]);
        let err = parse_devices("gpu7").unwrap_err();
        assert!(err.contains("\"gpu7\""), "{err}");
        let err = parse_devices("cuda:x").unwrap_err();
        assert!(err.contains("not a device index"), "{err}");
        assert!(parse_devices(" , ").is_err());
        #[cfg(not(feature = "cuda"))]
        assert!(
            parse_devices("cuda:1")
                .unwrap_err()
                .contains("`cuda` feature")
        );
        #[cfg(not(feature = "wgpu"))]
        assert!(
            parse_devices("flex,vulkan:cpu")
                .unwrap_err()
                .contains("`vulkan` feature")
        );
    }
}
