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
        .map(parse_device)
        .collect::<Result<Vec<_>, _>>()?;
    if devices.is_empty() {
        return Err(format!("--devices {list:?}: no device named"));
    }
    Ok(devices)
}

/// One `--devices` entry.
fn parse_device(entry: &str) -> Result<Device, String> {
    let (name, index) = match entry.split_once(':') {
        Some((name, index)) => {
            let index: usize = index
                .parse()
                .map_err(|_| format!("device {entry:?}: {index:?} is not a device index"))?;
            (name, Some(index))
        }
        None => (entry, None),
    };
    let missing = |feature: &str| {
        format!("device {entry:?} needs the `{feature}` feature (cargo run --features {feature})")
    };
    // Each is used only by the backends this build leaves out (or has).
    let _ = (&missing, index);
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
                let kind = burn::tensor::DeviceKind::DiscreteGpu(index.unwrap_or(0));
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
            #[cfg(feature = "tch")]
            return Ok(Device::libtorch());
            #[cfg(not(feature = "tch"))]
            return Err(missing("tch"));
        }
        "tch-cuda" => {
            #[cfg(feature = "tch")]
            return Ok(Device::libtorch_cuda(index.unwrap_or(0)));
            #[cfg(not(feature = "tch"))]
            return Err(missing("tch"));
        }
        _ => Err(format!(
            "device {entry:?}: expected default, flex, ndarray, cuda:N, wgpu:N, vulkan:N, \
             metal:N, tch or tch-cuda:N"
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
    }
}
