//! Part 1d of the suite: the CNNs' training steps on Burn's flex backend against LibTorch,
//! side by side in one process.
//!
//! `cnn_vs_libtorch` and `cifar_cnn_vs_libtorch` = LibTorch's seconds per step ÷ flex's
//! (above 1: flex is faster), for the MNIST CNN (1.87M parameters) and the CIFAR CNN (189k),
//! one node, batch 64, one kernel thread each, timed as the overhead part times a step
//! (DiLoCo with no synchronisation in the timed steps), alternating the two devices, the
//! median of the suite's repeats. The CIFAR CNN trains on synthetic images (the step's
//! time does not depend on the pixels).
//!
//! Only a build with both the `flex` and the `tch` features (LibTorch: see
//! `examples/scripts/install-libtorch.sh`) measures them, and only with `OMP_NUM_THREADS=1`
//! (LibTorch otherwise gives the node a thread per core, where flex has one). Elsewhere the
//! table says why in its one row, and the keys are absent.

use super::{SuiteConfig, SuiteResult};
use crate::runner::BoxError;

/// Why this process cannot compare with LibTorch, if it cannot.
pub fn unavailable() -> Option<String> {
    if !cfg!(all(feature = "tch", feature = "flex")) {
        return Some(
            "this build has no LibTorch: install it (`bash examples/scripts/install-libtorch.sh`, \
             then `source .venv-libtorch/env.sh`) and build with `--features tch`"
                .into(),
        );
    }
    match std::env::var("OMP_NUM_THREADS").as_deref() {
        Ok("1") => None,
        _ => Some(
            "OMP_NUM_THREADS is not 1: LibTorch would use every core where a flex node has one \
             thread; run with `OMP_NUM_THREADS=1`"
                .into(),
        ),
    }
}

/// The part: one row per CNN, or one row saying why there are none.
pub(super) fn libtorch(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let mut rows = vec![
        "| model (batch 64, one node) | flex ms/step | LibTorch ms/step | LibTorch ÷ flex |"
            .to_string(),
        "|---|---|---|---|".to_string(),
    ];
    match unavailable() {
        Some(why) => {
            eprintln!("libtorch: not measured: {why}");
            rows.push(format!("| not measured: {why} | - | - | - |"));
        }
        None => measure(config, out, &mut rows)?,
    }
    let note = format!(
        "The CNNs' training steps on Burn's flex backend and on LibTorch (the `tch` \
         feature), side by side in this process: one node, batch 64, one kernel thread each, \
         {} timed step(s) after {} warm-up, alternated, the median of {}; the CIFAR CNN on \
         synthetic images. LibTorch ÷ flex above 1: flex is faster.",
        config.cnn_steps.max(1),
        config.warmup_steps,
        config.repeats.max(1)
    );
    out.push_table("Against LibTorch", &config.command, &note, rows);
    Ok(())
}

#[cfg(all(feature = "tch", feature = "flex"))]
fn measure(
    config: &SuiteConfig,
    out: &mut SuiteResult,
    rows: &mut Vec<String>,
) -> Result<(), BoxError> {
    use super::median;
    use super::overhead::{MNIST_BATCH, StepTiming, mnist_data};
    use burn::tensor::Device;
    use gym_core::NodeData;
    use gym_data::{CifarBatcher, MnistBatcher};
    use gym_models::{CifarCnnConfig, MnistCnnConfig};

    #[allow(deprecated)] // burn-tch is deprecated by Burn; it is the comparison here
    let devices = [Device::flex(), Device::libtorch()];
    let steps = config.cnn_steps.max(1);
    let mnist = mnist_data(config)?;
    let cifar = synthetic_cifar(8 * MNIST_BATCH)?;
    let cifar = NodeData::shared(cifar.clone(), cifar);
    for key in ["cnn", "cifar_cnn"] {
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..config.repeats.max(1) {
            for (device, t) in devices.iter().zip(&mut times) {
                eprintln!("libtorch: {key} on {device:?} …");
                let timing = StepTiming {
                    device,
                    k: 1,
                    batch_size: MNIST_BATCH,
                    warmup: config.warmup_steps,
                    steps,
                    sync_interval: None,
                    autocast: None,
                };
                let runs = match key {
                    "cnn" => {
                        timing.runs(|d| MnistCnnConfig::new().init(d), &mnist, &MnistBatcher)?
                    }
                    _ => timing.runs(|d| CifarCnnConfig::new().init(d), &cifar, &CifarBatcher)?,
                };
                t.push(runs.seconds_per_step()?);
            }
        }
        let [flex, tch] = times.map(median);
        out.figures
            .insert(format!("{key}_step_ms_flex_side_by_side"), flex * 1e3);
        out.figures
            .insert(format!("{key}_step_ms_libtorch_side_by_side"), tch * 1e3);
        out.figures.insert(format!("{key}_vs_libtorch"), tch / flex);
        rows.push(format!(
            "| {key} | {:.1} | {:.1} | **{:.2}** |",
            flex * 1e3,
            tch * 1e3,
            tch / flex
        ));
    }
    Ok(())
}

#[cfg(not(all(feature = "tch", feature = "flex")))]
fn measure(_: &SuiteConfig, _: &mut SuiteResult, _: &mut Vec<String>) -> Result<(), BoxError> {
    unreachable!("unavailable() says why first")
}

/// `n` CIFAR-10 records of pseudo-random pixels and labels 0–9 in turn.
#[cfg_attr(not(all(feature = "tch", feature = "flex")), allow(dead_code))]
fn synthetic_cifar(n: usize) -> Result<gym_data::Cifar10, BoxError> {
    let record = gym_data::cifar::RECORD;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut bytes = Vec::with_capacity(n * record);
    for i in 0..n {
        bytes.push((i % 10) as u8);
        bytes.extend((1..record).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 56) as u8
        }));
    }
    Ok(gym_data::Cifar10::from_records(
        &bytes,
        std::path::Path::new("synthetic"),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataset::Dataset;

    #[test]
    fn synthetic_cifar_parses_and_a_build_without_libtorch_says_why() {
        let data = synthetic_cifar(20).unwrap();
        assert_eq!(data.len(), 20);
        assert_eq!(data.get(13).unwrap().label, 3);
        if !cfg!(feature = "tch") {
            assert!(unavailable().unwrap().contains("--features tch"));
        }
    }
}
