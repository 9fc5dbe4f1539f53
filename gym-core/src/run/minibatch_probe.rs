//! Finding the largest minibatch that fits in memory ([`Trainer::probe_minibatch`]), as the
//! original's `minibatch_size=None` does: short one-node trials, halving from the batch size,
//! until K nodes' worth of the trial's peak memory, with a margin, fits the budget.
//!
//! Memory is the process's resident memory as Linux reports it: before each trial the
//! allocator gives back what it holds free (`malloc_trim`) and the peak is reset
//! (`/proc/self/clear_refs`); the trial's cost is its peak (`VmHWM`) above the memory
//! resident before it. That covers everything a node allocates for a step: its replica,
//! gradient, optimizer and strategy state and the minibatch's activations. Elsewhere than
//! Linux, and for memory on a GPU, the probe is refused with an error saying so: give the
//! minibatch size by hand there.

use super::config::TrainerConfig;
use super::data::NodeData;
use super::trainer::Trainer;
use crate::error::{GymError, Result};
use crate::model::TrainModel;
use crate::strategy::StrategyConfig;
use burn::config::Config;
use burn::data::dataloader::batcher::Batcher;
use burn::tensor::Device;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How [`Trainer::probe_minibatch`] looks for the minibatch size.
#[derive(Config, Debug)]
pub struct MinibatchProbeConfig {
    /// Bytes the K nodes may use together; unset, half of the memory available when the
    /// probe starts (`MemAvailable` of `/proc/meminfo`).
    pub budget_bytes: Option<u64>,
    /// A trial's measured memory is multiplied by this before it is compared with the budget
    /// (what one trial does not see: longer runs' fragmentation, evaluation, checkpoints).
    #[config(default = 1.3)]
    pub margin: f64,
    /// Steps per trial (the first step allocates the optimizer's and strategy's state).
    #[config(default = 3)]
    pub trial_steps: usize,
    /// A JSON file that remembers what each trial measured, keyed by the model (type and
    /// size), the strategy, the precision, the kernel threads and the minibatch size, so a
    /// later probe of the same set-up runs no trial for a size already measured, whatever
    /// its nodes, batch and budget; unset, nothing is remembered.
    pub cache_file: Option<String>,
}

/// What [`Trainer::probe_minibatch`] chose, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinibatchChoice {
    /// The largest minibatch size tried that fits; it divides the batch size.
    pub minibatch_size: usize,
    /// The budget the K nodes had, in bytes.
    pub budget_bytes: u64,
    /// The sizes tried, largest first.
    pub trials: Vec<MinibatchTrial>,
}

/// One size tried by the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinibatchTrial {
    /// The minibatch size.
    pub minibatch: usize,
    /// One node's memory for a step at this size, in bytes (peak above the memory resident
    /// before the trial).
    pub bytes: u64,
    /// Whether the figure came from the cache rather than a trial run now.
    pub cached: bool,
}

impl MinibatchProbeConfig {
    /// The default cache file: `minibatch-sizes.json` in `$XDG_CACHE_HOME/exogym-rs` or
    /// `~/.cache/exogym-rs`; `None` when neither variable is set.
    pub fn default_cache_file() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("exogym-rs").join("minibatch-sizes.json"))
    }
}

impl Trainer {
    /// Finds the largest minibatch size that divides the batch size and lets this trainer's
    /// `num_nodes` nodes fit in the memory budget: one-node trials of `trial_steps` steps
    /// (same model, strategy, data, batcher, precision and kernel threads; no logs, no
    /// evaluation), halving from the batch size, each measured as the module docs say;
    /// a size fits when `nodes × measured × margin ≤ budget`.
    ///
    /// Returns [`GymError::InvalidConfig`] when not even a minibatch of one fits (naming the
    /// smallest size tried and its memory), on a device other than the CPU, and where the
    /// OS does not report a process's peak memory (anything but Linux). Set the result with
    /// [`TrainerConfig::with_minibatch_size`] for the real run.
    pub fn probe_minibatch<M, I, B>(
        &self,
        init: impl Fn(&Device) -> M + Sync,
        strategy: &dyn StrategyConfig,
        data: &NodeData<I>,
        batcher: &B,
        probe: &MinibatchProbeConfig,
    ) -> Result<MinibatchChoice>
    where
        M: TrainModel,
        I: Send + 'static,
        B: Batcher<I, M::Batch>,
    {
        let cfg = &self.config;
        if let Some(device) = self.devices.iter().find(|d| !is_cpu(d)) {
            return Err(GymError::InvalidConfig(format!(
                "the minibatch probe measures the process's memory, not {device:?}'s: give \
                 the minibatch size by hand on a GPU"
            )));
        }
        if !(probe.margin >= 1.0 && probe.margin.is_finite()) || probe.trial_steps == 0 {
            return Err(GymError::InvalidConfig(format!(
                "the minibatch probe needs a margin of at least 1 (got {}) and at least one \
                 trial step",
                probe.margin
            )));
        }
        let budget = match probe.budget_bytes {
            Some(b) => b,
            None => memory::available_bytes()? / 2,
        };
        let params = crate::ParamLayout::all_float(&init(&self.devices[0])).num_elements();
        let key = |minibatch: usize| {
            format!(
                "model={} params={} strategy={} precision={} threads={} minibatch={minibatch}",
                std::any::type_name::<M>(),
                params,
                strategy.name(),
                cfg.autocast.map_or("f32", |a| a.name()),
                cfg.kernel_threads_per_node,
            )
        };
        let cache = probe.cache_file.as_deref().map(Path::new);
        let mut known = cache.map(read_cache).unwrap_or_default();
        let mut measured = false;
        let trial = |minibatch: usize| -> Result<MinibatchTrial> {
            if let Some(&bytes) = known.get(&key(minibatch)) {
                return Ok(MinibatchTrial {
                    minibatch,
                    bytes,
                    cached: true,
                });
            }
            let trial_config = TrainerConfig::new(1)
                .with_max_steps(Some(probe.trial_steps))
                .with_batch_size(minibatch)
                .with_val_size(Some(0))
                .with_seed(cfg.seed)
                .with_autocast(cfg.autocast)
                .with_kernel_threads_per_node(cfg.kernel_threads_per_node);
            let trainer = Trainer {
                config: trial_config,
                devices: self.devices[..1].to_vec(),
                interrupt: None,
                final_evaluation: false,
                hparams: None,
                loggers: Vec::new(),
            };
            let baseline = memory::reset_peak()?;
            let out = trainer.fit(&init, strategy, data, batcher);
            let peak = memory::peak_bytes()?;
            out.map_err(|e| {
                GymError::InvalidConfig(format!(
                    "the minibatch probe's one-node trial of {minibatch} examples failed: {e}"
                ))
            })?;
            let bytes = peak.saturating_sub(baseline);
            known.insert(key(minibatch), bytes);
            measured = true;
            Ok(MinibatchTrial {
                minibatch,
                bytes,
                cached: false,
            })
        };
        let choice = choose(cfg.batch_size, cfg.num_nodes, budget, probe.margin, trial);
        if let (Some(file), true) = (cache, measured) {
            write_cache(file, &known)?;
        }
        choice
    }
}

/// The halving search: tries `batch`, then the largest divisor of `batch` at most half the
/// last size tried, down to 1, and returns the first that fits.
fn choose(
    batch: usize,
    nodes: usize,
    budget: u64,
    margin: f64,
    mut measure: impl FnMut(usize) -> Result<MinibatchTrial>,
) -> Result<MinibatchChoice> {
    let mut trials = Vec::new();
    let mut size = batch;
    loop {
        let trial = measure(size)?;
        let bytes = trial.bytes;
        trials.push(trial);
        if nodes as f64 * bytes as f64 * margin <= budget as f64 {
            return Ok(MinibatchChoice {
                minibatch_size: size,
                budget_bytes: budget,
                trials,
            });
        }
        if size == 1 {
            return Err(GymError::InvalidConfig(format!(
                "no minibatch fits: {nodes} node(s) of the smallest minibatch tried (1 example, \
                 {bytes} bytes per node, × {margin} margin) need more than the budget of \
                 {budget} bytes"
            )));
        }
        size = (1..=size / 2)
            .rev()
            .find(|d| batch.is_multiple_of(*d))
            .expect("1 divides");
    }
}

fn is_cpu(device: &Device) -> bool {
    let name = format!("{device:?}").to_lowercase();
    ["flex", "ndarray", "cpu"]
        .iter()
        .any(|cpu| name.contains(cpu))
}

fn read_cache(file: &Path) -> BTreeMap<String, u64> {
    // A missing or unreadable cache is an empty one: it only saves trials.
    std::fs::read(file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

fn write_cache(file: &Path, all: &BTreeMap<String, u64>) -> Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
    }
    let json = serde_json::to_vec_pretty(all).expect("figures serialise");
    // Written whole and renamed, so a reader never sees half a file.
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, json).map_err(|e| GymError::io(&tmp, e))?;
    std::fs::rename(&tmp, file).map_err(|e| GymError::io(file, e))
}

/// The process's memory as Linux reports it.
mod memory {
    use crate::error::{GymError, Result};

    fn unsupported(what: &str) -> GymError {
        GymError::InvalidConfig(format!(
            "the minibatch probe needs Linux's /proc to measure memory ({what}); give the \
             minibatch size by hand"
        ))
    }

    /// A `kB` field of a /proc file, in bytes.
    fn proc_field(file: &str, field: &str) -> Result<u64> {
        let text = std::fs::read_to_string(file).map_err(|_| unsupported(file))?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| unsupported(&format!("{field} in {file}")))
    }

    /// Memory available for new work (`MemAvailable`).
    pub(super) fn available_bytes() -> Result<u64> {
        proc_field("/proc/meminfo", "MemAvailable")
    }

    /// Gives free memory back to the OS and resets the peak; returns the resident memory.
    pub(super) fn reset_peak() -> Result<u64> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: `malloc_trim` only returns free pages to the OS, under the allocator's lock.
        unsafe {
            libc::malloc_trim(0);
        }
        // Writing 5 resets VmHWM to the current resident size (Linux 4.0 and later).
        std::fs::write("/proc/self/clear_refs", "5")
            .map_err(|_| unsupported("resetting the peak in /proc/self/clear_refs"))?;
        proc_field("/proc/self/status", "VmRSS")
    }

    /// The peak resident memory since the last reset (`VmHWM`).
    pub(super) fn peak_bytes() -> Result<u64> {
        proc_field("/proc/self/status", "VmHWM")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory that grows linearly with the minibatch (fixed state plus activations).
    fn linear(fixed: u64, per_example: u64) -> impl FnMut(usize) -> Result<MinibatchTrial> {
        move |mb| Ok(measured(mb, fixed + per_example * mb as u64))
    }

    fn measured(minibatch: usize, bytes: u64) -> MinibatchTrial {
        MinibatchTrial {
            minibatch,
            bytes,
            cached: false,
        }
    }

    #[test]
    fn halving_stops_at_the_largest_size_that_fits() {
        // 4 nodes × 1.3 × (1000 + 100·mb) ≤ 30_000 ⇔ mb ≤ 47.69: 64 does not fit, 32 does.
        let c = choose(64, 4, 30_000, 1.3, linear(1000, 100)).unwrap();
        assert_eq!(c.minibatch_size, 32);
        assert_eq!(c.trials, vec![measured(64, 7400), measured(32, 4200)]);
        // The whole batch when it fits: one trial.
        let c = choose(64, 1, 1 << 20, 1.3, linear(1000, 100)).unwrap();
        assert_eq!((c.minibatch_size, c.trials.len()), (64, 1));
    }

    #[test]
    fn sizes_tried_divide_the_batch() {
        // 48 → 24 → 12 → 6 → 3 → 1: each the largest divisor of 48 at most half the last.
        let mut tried = Vec::new();
        let err = choose(48, 1, 10, 1.0, |mb| {
            tried.push(mb);
            Ok(measured(mb, 1000))
        })
        .unwrap_err();
        assert_eq!(tried, vec![48, 24, 12, 6, 3, 1]);
        assert!(err.to_string().contains("no minibatch fits"), "{err}");
        assert!(err.to_string().contains("1000 bytes"), "{err}");
        // 40 → 20 → 10 → 5 → 2 → 1.
        let mut tried = Vec::new();
        let _ = choose(40, 1, 10, 1.0, |mb| {
            tried.push(mb);
            Ok(measured(mb, 1000))
        });
        assert_eq!(tried, vec![40, 20, 10, 5, 2, 1]);
    }

    #[test]
    fn a_failed_trial_is_the_error() {
        let err = choose(8, 1, 10, 1.0, |_| {
            Err(GymError::InvalidConfig("boom".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("boom"));
    }
}
