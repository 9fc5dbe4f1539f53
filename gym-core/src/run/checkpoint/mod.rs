//! Checkpoints: everything a run needs to continue exactly where it stopped, in one file
//! per save, written atomically.
//!
//! A run whose nodes are spread over processes writes one file per process and save, a
//! *shard* holding that process's ranks (`checkpoint-STEP.ranks-FIRST-LAST.gym`). Loading
//! gathers the shards of a step into the whole checkpoint, so a run resumes under any
//! number of processes, whichever wrote it; a step whose shards do not cover every rank is
//! passed over for an older complete one, or refused naming the ranks whose files are
//! missing.
//!
//! # File format
//!
//! A [safetensors](https://huggingface.co/docs/safetensors) file: every node's parameters and
//! state as typed tensors named `node{rank}/…`, the run's identity, step and seeds in its
//! `__metadata__` ([`safetensors`] lists the names). A file that is truncated, padded or
//! altered by one byte is refused with [`GymError::Checkpoint`] before anything is decoded
//! (the metadata holds the data section's CRC-32), and nothing is allocated from a length
//! the file claims: the whole file is read at its real size first.

use crate::comm::{CommStats, SimulatedTime};
use crate::error::{GymError, Result};
use crate::metrics::ledger::NodeLedger;
use crate::metrics::{CorrelationRecord, TrainRecord, ValRecord};
use crate::state::record::StateDict;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

pub mod safetensors;
mod writer;

pub use super::identity::Identity;
pub(crate) use writer::{CheckpointWriter, StopAgreement};

/// The checkpoint files' extension.
const EXTENSION: &str = ".safetensors";

/// Fails unless `dir` can be created and written to: checked before the first step, so a
/// run never trains to find at its first checkpoint that it cannot save one.
pub(crate) fn check_writable(dir: &Path) -> Result<()> {
    let refuse = |e: std::io::Error| {
        GymError::Checkpoint(format!(
            "the checkpoint folder {} cannot be written: {e}",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(refuse)?;
    // Unique per call: the processes of a spread run check the same folder, and in tests
    // they share one OS process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".write-test-{}-{call}", std::process::id()));
    std::fs::write(&probe, b"ok").map_err(refuse)?;
    std::fs::remove_file(&probe).map_err(refuse)
}

/// One node's state between two steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeCheckpoint {
    /// Every float tensor of the model (parameters and running statistics), flat.
    pub model: Vec<f32>,
    /// The path and shape of each tensor in `model`, in order.
    pub model_tensors: Vec<(String, Vec<usize>)>,
    /// The ids of the trainable parameters, which key the optimizers' states.
    pub param_ids: Vec<u64>,
    /// What the strategy saved.
    pub strategy: StateDict,
    /// The data loader's epoch, position in it, and fingerprint of the indices drawn.
    pub loader: (usize, usize, u64),
    /// The node's random stream (seed, stream, word position).
    pub rng: ([u8; 32], u64, u128),
    /// The node's traffic so far.
    pub comm: CommStats,
    /// The node's simulated clock and when its link is free, when time is simulated.
    pub clock: Option<(SimulatedTime, f64)>,
    /// The work faults have cost the node so far.
    #[serde(default)]
    pub ledger: NodeLedger,
}

/// A whole run between two steps: every node, and the records so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The step the resumed run starts with (the saved run finished the ones before).
    pub next_step: usize,
    /// What the resuming run must agree on.
    pub identity: Identity,
    /// The run's name (its log folder), which a resumed run keeps.
    pub run_name: String,
    /// Every node's state, by rank.
    pub nodes: Vec<NodeCheckpoint>,
    /// Training records of the steps taken.
    pub train: Vec<TrainRecord>,
    /// Evaluations so far.
    pub validation: Vec<ValRecord>,
    /// Replica correlations so far.
    pub correlation: Vec<CorrelationRecord>,
    /// The ranks `nodes` holds when this is one process's shard of a spread run; `None`
    /// when it holds every rank.
    #[serde(default)]
    pub shard: Option<Shard>,
}

/// Which ranks a shard holds: `nodes[i]` is rank `first_rank + i` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// The rank of the shard's first node.
    pub first_rank: usize,
    /// The run's number of nodes.
    pub world_size: usize,
}

impl Checkpoint {
    /// The file name of the whole checkpoint taken before `next_step`.
    pub fn file_name(next_step: usize) -> String {
        format!("checkpoint-{next_step:09}{EXTENSION}")
    }

    /// The file name of the shard of ranks `first..=last` taken before `next_step`.
    pub fn shard_file_name(next_step: usize, first: usize, last: usize) -> String {
        format!("checkpoint-{next_step:09}.ranks-{first}-{last}{EXTENSION}")
    }

    /// The checkpoint files in `dir` (whole checkpoints and shards), oldest first; none if
    /// `dir` does not exist.
    pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
        if !dir.exists() {
            return Ok(Vec::new());
        }
        Ok(list(dir)?.into_iter().map(|f| f.path).collect())
    }

    /// This checkpoint's file name.
    fn own_file_name(&self) -> String {
        match self.shard {
            None => Self::file_name(self.next_step),
            Some(s) => Self::shard_file_name(
                self.next_step,
                s.first_rank,
                s.first_rank + self.nodes.len().max(1) - 1,
            ),
        }
    }

    /// Writes the checkpoint into `dir` atomically (a temporary file, fsync, rename) and
    /// keeps the newest `keep` checkpoints of its kind there (whole, or shards of the same
    /// ranks: a process never deletes another's). Returns the file's path.
    pub fn save(&self, dir: &Path, keep: usize) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        let bytes = safetensors::encode(self)?;
        let name = self.own_file_name();
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.tmp"));
        // The previous checkpoint stays until this one is whole on disk: a crash or a full
        // disk leaves a temporary file (removed here, or by the next save), never a torn one.
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|_| f.sync_all()))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            std::fs::remove_file(&tmp).ok();
            return Err(GymError::io(&path, e));
        }
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        let kind = FileName::parse(&name).map(|(_, ranks)| ranks);
        let mut own: Vec<FileName> = list(dir)?
            .into_iter()
            .filter(|f| Some(f.ranks) == kind)
            .collect();
        while own.len() > keep.max(1) {
            let old = own.remove(0).path;
            std::fs::remove_file(&old).map_err(|e| GymError::io(&old, e))?;
        }
        // Temporary files of this kind and an earlier step, left by a process killed while
        // writing (a later step's is overwritten when that step is saved).
        for leftover in std::fs::read_dir(dir)
            .map_err(|e| GymError::io(dir, e))?
            .flatten()
        {
            let file = leftover.file_name();
            let stale = file
                .to_str()
                .and_then(|n| n.strip_prefix('.')?.strip_suffix(".tmp"))
                .and_then(FileName::parse)
                .is_some_and(|(step, ranks)| Some(ranks) == kind && step < self.next_step);
            if stale {
                std::fs::remove_file(leftover.path()).ok();
            }
        }
        Ok(path)
    }

    /// Reads a checkpoint file, or the newest complete checkpoint in a folder, as the whole
    /// checkpoint: a shard is read with the other shards of its step, beside it. Returns
    /// the checkpoint and the file read (a shard's, the first rank's).
    pub fn load(path: &Path) -> Result<(Checkpoint, PathBuf)> {
        if !path.is_dir() {
            let bytes = std::fs::read(path).map_err(|e| GymError::io(path, e))?;
            let checkpoint = Self::decode(&bytes, path)?;
            if checkpoint.shard.is_none() {
                return Ok((checkpoint, path.to_path_buf()));
            }
            let dir = path.parent().unwrap_or(Path::new("."));
            let siblings: Vec<FileName> = list(dir)?
                .into_iter()
                .filter(|f| f.step == checkpoint.next_step && f.ranks.is_some())
                .collect();
            return gather(&siblings)?.map_err(GymError::Checkpoint);
        }
        let files = list(path)?;
        let mut incomplete = None;
        let mut steps: Vec<usize> = files.iter().map(|f| f.step).collect();
        steps.dedup();
        for step in steps.into_iter().rev() {
            let at: Vec<FileName> = files.iter().filter(|f| f.step == step).cloned().collect();
            if let Some(whole) = at.iter().find(|f| f.ranks.is_none()) {
                let bytes = std::fs::read(&whole.path).map_err(|e| GymError::io(&whole.path, e))?;
                return Ok((Self::decode(&bytes, &whole.path)?, whole.path.clone()));
            }
            match gather(&at)? {
                Ok(whole) => return Ok(whole),
                Err(missing) => {
                    incomplete.get_or_insert(missing);
                }
            }
        }
        Err(GymError::Checkpoint(match incomplete {
            Some(why) => format!("no complete checkpoint in {}: {why}", path.display()),
            None => format!("no checkpoint in {}", path.display()),
        }))
    }

    /// Decodes a checkpoint file's bytes; `file` names it in errors.
    pub fn decode(bytes: &[u8], file: &Path) -> Result<Checkpoint> {
        safetensors::decode(bytes, file)
    }
}

/// A checkpoint file as its name describes it.
#[derive(Debug, Clone)]
struct FileName {
    path: PathBuf,
    step: usize,
    /// The first and last rank of a shard; `None` for a whole checkpoint.
    ranks: Option<(usize, usize)>,
}

impl FileName {
    fn parse(name: &str) -> Option<(usize, Option<(usize, usize)>)> {
        let rest = name.strip_prefix("checkpoint-")?.strip_suffix(EXTENSION)?;
        let (step, ranks) = match rest.split_once(".ranks-") {
            None => (rest, None),
            Some((step, ranks)) => {
                let (a, b) = ranks.split_once('-')?;
                (step, Some((a.parse().ok()?, b.parse().ok()?)))
            }
        };
        Some((step.parse().ok()?, ranks))
    }
}

/// The checkpoint files of `dir`, oldest first (by step, then first rank).
fn list(dir: &Path) -> Result<Vec<FileName>> {
    let mut files: Vec<FileName> = std::fs::read_dir(dir)
        .map_err(|e| GymError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|path| {
            let (step, ranks) = FileName::parse(path.file_name()?.to_str()?)?;
            Some(FileName { path, step, ranks })
        })
        .collect();
    files.sort_by_key(|f| (f.step, f.ranks));
    Ok(files)
}

/// The whole checkpoint from the shards `files` of one step, every rank exactly once, or
/// (inner `Err`) which ranks no shard holds.
fn gather(files: &[FileName]) -> Result<std::result::Result<(Checkpoint, PathBuf), String>> {
    let mut whole: Option<(Checkpoint, PathBuf)> = None;
    let mut nodes: Vec<Option<NodeCheckpoint>> = Vec::new();
    for file in files {
        let bytes = std::fs::read(&file.path).map_err(|e| GymError::io(&file.path, e))?;
        let mut part = Checkpoint::decode(&bytes, &file.path)?;
        let Some(shard) = part.shard else {
            return Err(GymError::Checkpoint(format!(
                "{} is named as a shard and holds every rank",
                file.path.display()
            )));
        };
        if nodes.is_empty() {
            nodes = vec![None; shard.world_size];
        }
        let fits = shard.world_size == nodes.len()
            && shard.first_rank + part.nodes.len() <= nodes.len()
            && whole
                .as_ref()
                .is_none_or(|(w, _)| w.identity == part.identity);
        if !fits {
            return Err(GymError::Checkpoint(format!(
                "{} is from another run than the other shards of step {}",
                file.path.display(),
                part.next_step
            )));
        }
        for (i, node) in std::mem::take(&mut part.nodes).into_iter().enumerate() {
            let rank = shard.first_rank + i;
            if nodes[rank].replace(node).is_some() {
                return Err(GymError::Checkpoint(format!(
                    "rank {rank} is held by two shards of step {} ({} among them): they \
                     are from runs spread differently; move one run's files away",
                    part.next_step,
                    file.path.display()
                )));
            }
        }
        if whole.is_none() || shard.first_rank == 0 {
            whole = Some((part, file.path.clone()));
        }
    }
    let Some((mut checkpoint, path)) = whole else {
        return Err(GymError::Checkpoint("no shard to read".into()));
    };
    let missing: Vec<usize> = (0..nodes.len()).filter(|&r| nodes[r].is_none()).collect();
    if !missing.is_empty() {
        return Ok(Err(format!(
            "the shards of step {} beside {} are missing ranks {} (a run spread over hosts \
             resumes from a folder that every process's files reach)",
            checkpoint.next_step,
            path.display(),
            ranges(&missing)
        )));
    }
    checkpoint.nodes = nodes.into_iter().map(|n| n.expect("every rank")).collect();
    checkpoint.shard = None;
    Ok(Ok((checkpoint, path)))
}

/// `[0, 1, 2, 5]` as `0-2, 5`.
fn ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(next_step: usize) -> Checkpoint {
        let mut strategy = StateDict::new();
        strategy.put_values("buffer", vec![1.5, -2.0]);
        Checkpoint {
            next_step,
            identity: Identity {
                strategy: "diloco".into(),
                strategy_config: r#"{"h":20,"lr":0.7}"#.into(),
                model: "Mlp".into(),
                parameters: vec![("fc.weight".into(), vec![2, 3])],
                trainer: r#"{"seed":1}"#.into(),
            },
            run_name: "run".into(),
            nodes: vec![NodeCheckpoint {
                model: vec![0.25; 6],
                model_tensors: vec![("fc.weight".into(), vec![2, 3])],
                param_ids: vec![7],
                strategy,
                loader: (1, 8, 99),
                rng: ([3; 32], 0, 12),
                comm: CommStats::default(),
                clock: None,
                ledger: NodeLedger::default(),
            }],
            train: Vec::new(),
            validation: Vec::new(),
            correlation: Vec::new(),
            shard: None,
        }
    }

    #[test]
    fn resume_files_round_trip_keep_the_newest_and_refuse_damage() {
        let dir = std::env::temp_dir().join(format!("gym-ckpt-unit-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        for step in [5, 10, 15] {
            sample(step).save(&dir, 2).unwrap();
        }
        let names: Vec<String> = list(&dir)
            .unwrap()
            .iter()
            .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [Checkpoint::file_name(10), Checkpoint::file_name(15)]
        );
        let (loaded, file) = Checkpoint::load(&dir).unwrap();
        assert_eq!(loaded, sample(15));
        // The same state is the same bytes (the metadata's keys sorted).
        assert_eq!(
            safetensors::encode(&sample(15)).unwrap(),
            safetensors::encode(&sample(15)).unwrap()
        );
        let bytes = std::fs::read(&file).unwrap();
        let truncated = Checkpoint::decode(&bytes[..bytes.len() - 1], &file).unwrap_err();
        assert!(truncated.to_string().contains("truncated"), "{truncated}");
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let altered = Checkpoint::decode(&flipped, &file).unwrap_err();
        assert!(altered.to_string().contains("checksum"), "{altered}");
        assert!(Checkpoint::decode(b"not a checkpoint", &file).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `sample(next_step)` with `k` nodes, node `r`'s model all `r`, cut into shards of
    /// `per` ranks.
    fn shards(next_step: usize, k: usize, per: usize) -> Vec<Checkpoint> {
        let whole = sample(next_step);
        (0..k / per)
            .map(|p| {
                let mut shard = whole.clone();
                shard.nodes = (p * per..(p + 1) * per)
                    .map(|r| NodeCheckpoint {
                        model: vec![r as f32; 6],
                        ..whole.nodes[0].clone()
                    })
                    .collect();
                shard.shard = Some(Shard {
                    first_rank: p * per,
                    world_size: k,
                });
                shard
            })
            .collect()
    }

    #[test]
    fn shards_of_a_step_load_as_the_whole_checkpoint_and_a_gap_is_named() {
        let dir = std::env::temp_dir().join(format!("gym-ckpt-shards-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        for step in [5, 10, 15] {
            for shard in shards(step, 4, 2) {
                shard.save(&dir, 2).unwrap();
            }
        }
        // Each process kept its own newest two: steps 10 and 15 of both shards.
        assert_eq!(list(&dir).unwrap().len(), 4);
        let (whole, file) = Checkpoint::load(&dir).unwrap();
        assert_eq!(whole.next_step, 15);
        assert_eq!(whole.shard, None);
        let models: Vec<f32> = whole.nodes.iter().map(|n| n.model[0]).collect();
        assert_eq!(models, [0.0, 1.0, 2.0, 3.0]);
        assert!(file.ends_with(Checkpoint::shard_file_name(15, 0, 1)));
        // Step 15 without the second process's file: the folder resumes from step 10, the
        // file of step 15 is refused naming the ranks missing.
        std::fs::remove_file(dir.join(Checkpoint::shard_file_name(15, 2, 3))).unwrap();
        assert_eq!(Checkpoint::load(&dir).unwrap().0.next_step, 10);
        let err = Checkpoint::load(&dir.join(Checkpoint::shard_file_name(15, 0, 1)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing ranks 2-3"), "{err}");
        // Shards of another spread at the same step overlap: refused, not mixed.
        for shard in shards(10, 4, 1) {
            shard.save(&dir, 2).unwrap();
        }
        let err = Checkpoint::load(&dir).unwrap_err().to_string();
        assert!(err.contains("held by two shards"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn resume_refuses_another_configuration_naming_the_difference() {
        let here = sample(5).identity;
        let mut other = here.clone();
        other.strategy = "noloco".into();
        assert!(
            here.check(&other)
                .unwrap_err()
                .to_string()
                .contains("`noloco`")
        );
        let mut other = here.clone();
        other.parameters[0].1 = vec![4, 3];
        let err = here.check(&other).unwrap_err().to_string();
        assert!(err.contains("fc.weight") && err.contains("[4, 3]"), "{err}");
        let mut other = here.clone();
        other.strategy_config = r#"{"h":30,"lr":0.7}"#.into();
        let err = here.check(&other).unwrap_err().to_string();
        assert!(err.contains("`h` = 30, this run has 20"), "{err}");
        assert!(!err.contains("lr"), "only the differing field: {err}");
        // A nested field is named by its path, and only it.
        let mut nested = here.clone();
        nested.trainer = r#"{"seed":1,"simulation":{"network":"wan","jitter":0.1}}"#.into();
        let mut other = nested.clone();
        other.trainer = r#"{"seed":1,"simulation":{"network":"lan","jitter":0.1}}"#.into();
        let err = other.check(&nested).unwrap_err().to_string();
        assert!(
            err.contains(r#"`simulation.network` = "wan", this run has "lan""#)
                && !err.contains("jitter"),
            "{err}"
        );
        assert!(here.check(&here.clone()).is_ok());
        // A setting added since, with no value, leaves the checkpoint usable.
        let mut newer = here.clone();
        newer.strategy_config = r#"{"h":20,"lr":0.7,"custom":null}"#.into();
        assert!(newer.check(&here).is_ok());
        newer.strategy_config = r#"{"h":20,"lr":0.7,"custom":"decay"}"#.into();
        assert!(newer.check(&here).is_err());
    }
}
