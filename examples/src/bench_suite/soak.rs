//! `bench --soak`: many nodes of a tiny model for many steps under random faults, to show
//! that a long run holds its memory and that its traffic accounting balances.
//!
//! The run: [`SoakConfig::nodes`] nodes of a 16-32-4 MLP on a synthetic task, DiLoCo
//! synchronising every [`SoakConfig::sync_interval`] steps, and a random fault schedule
//! (`random:RATE/h,down=STEPS`, drawn from the seed): nodes leave at random and come back
//! [`SoakConfig::down_steps`] later, taking a present peer's model and strategy state.
//! Time is simulated on a datacenter network with every step modelled at one second, so
//! the rate is simply the expected leaves per node over the run.
//!
//! Two checks, either of which fails the run:
//!
//! * **Memory**: the resident set (`VmRSS`) is sampled as the nodes draw their data (at
//!   fixed counts of node-steps, so the samples fall at the same steps on any machine);
//!   its growth from the sample after warm-up ([`SoakConfig::warmup_fraction`] of the
//!   steps) to the loop's last sample, net of the per-step train records written in
//!   between ([`SoakReport::rss_net_growth_pct`]), must stay under
//!   [`RSS_GROWTH_LIMIT_PCT`]. The live heap ([`live_bytes`]) is sampled beside it, to tell
//!   memory the run holds from memory the allocator keeps.
//! * **Accounting**: summed over nodes, the bytes sent equal the bytes received
//!   ([`TrafficBalance`] states why this must hold exactly).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, DatasetError};
use burn::tensor::{Device, Int, Tensor, TensorData};
use gym_core::allocator::live_bytes;
use gym_core::faults::{Fault, FaultSchedule, RandomFaults};
use gym_core::{
    CommStats, ComputeModel, ImageBatch, NodeData, SharedDataset, SimulationConfig, Split,
    TrainModel, Trainer, TrainerConfig,
};
use gym_models::MlpConfig;
use gym_strategies::{DiLoCoCommunicatorConfig, DiLoCoConfig};

use super::MB;
use crate::runner::BoxError;

/// The largest growth of the resident set after warm-up that passes, in percent.
pub const RSS_GROWTH_LIMIT_PCT: f64 = 5.0;

/// Inputs and classes of the synthetic task (the model is `FEATURES`-32-`CLASSES`).
pub(super) const FEATURES: usize = 16;
pub(super) const CLASSES: usize = 4;
pub(super) const HIDDEN: usize = 32;
/// Examples in the training set every node reads (each in its own order).
const TRAIN_EXAMPLES: usize = 512;
/// Examples of the final evaluation.
const VAL_EXAMPLES: usize = 16;

/// What the soak runs.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// Simulated nodes.
    pub nodes: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// DiLoCo's H: the nodes all-reduce their models every this many steps.
    pub sync_interval: usize,
    /// Expected random leaves per node over the run (the Poisson rate, scaled to the run).
    pub faults_per_node: f64,
    /// Steps a node that left stays away before it rejoins.
    pub down_steps: usize,
    /// Examples per node per step.
    pub batch_size: usize,
    /// The share of the steps after which the memory counts as warmed up (0–1).
    pub warmup_fraction: f64,
    /// Resident-memory samples over the run, evenly spaced in node-steps.
    pub samples: usize,
    /// Seed of the model, the data orders and the faults.
    pub seed: u64,
    /// The command line, as the caption quotes it.
    pub command: String,
}

impl SoakConfig {
    /// The soak of issue 30: 1,024 nodes for 10,000 steps, H = 10, two leaves per node of
    /// 20 steps each on average, memory sampled 100 times, warmed up after 10% of the steps.
    pub fn new() -> Self {
        SoakConfig {
            nodes: 1024,
            steps: 10_000,
            sync_interval: 10,
            faults_per_node: 2.0,
            down_steps: 20,
            batch_size: 8,
            warmup_fraction: 0.1,
            samples: 100,
            seed: 42,
            command: String::new(),
        }
    }

    /// The random entry of the fault schedule: with every step modelled at one simulated
    /// second, `faults_per_node` leaves over `steps` seconds is this rate per hour.
    pub fn fault_schedule(&self) -> FaultSchedule {
        FaultSchedule {
            faults: Vec::new(),
            random: Some(RandomFaults {
                rate_per_hour: self.faults_per_node * 3600.0 / self.steps.max(1) as f64,
                down_steps: Some(self.down_steps.max(1)),
            }),
        }
    }
}

impl Default for SoakConfig {
    fn default() -> Self {
        SoakConfig::new()
    }
}

/// Growth from `warm` to `end` bytes in percent of `warm` (0 when `warm` is 0, so that a
/// platform without a resident-set figure does not divide by zero).
pub fn rss_growth_pct(warm: u64, end: u64) -> f64 {
    if warm == 0 {
        return 0.0;
    }
    (end as f64 - warm as f64) / warm as f64 * 100.0
}

/// The run's traffic summed over nodes.
///
/// Why sent must equal received, exactly: every collective call is counted once by each
/// member of its group, all members with the same payload size (agreed through the
/// exchanged headers), and the cost model ([`mod@gym_core::comm::cost`]) conserves bytes within
/// one call: an all-reduce has each of the k members send and receive ⌊2(k−1)P/k⌋, a chain
/// broadcast has k−1 members send P and k−1 receive it, an all-gather has each send and
/// receive (k−1)P. A rejoining node's state transfer is such a broadcast (of bytes, P the
/// source's length) in the group of its source and the nodes coming back. Absent nodes make
/// no call, and the uncounted observer traffic (clock exchange on rejoin, evaluation) is
/// kept in another counter. So any difference means a call was counted by some members
/// and not others, or with different sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficBalance {
    /// Bytes sent, all nodes.
    pub sent: u64,
    /// Bytes received, all nodes.
    pub received: u64,
    /// All-reduce calls, counted once per member.
    pub all_reduce_calls: u64,
    /// Broadcast calls (the rejoins' state transfers), counted once per member.
    pub broadcast_calls: u64,
}

impl TrafficBalance {
    /// Adds up every node's counters.
    pub fn of(comm: &[CommStats]) -> Self {
        comm.iter()
            .fold(TrafficBalance::default(), |t, c| TrafficBalance {
                sent: t.sent + c.bytes_sent,
                received: t.received + c.bytes_received,
                all_reduce_calls: t.all_reduce_calls + c.all_reduce_calls,
                broadcast_calls: t.broadcast_calls + c.broadcast_calls,
            })
    }

    /// Whether every byte sent was received.
    pub fn balanced(&self) -> bool {
        self.sent == self.received
    }
}

/// One resident-memory sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RssSample {
    /// The step the nodes had reached (the first step whose node-steps cover those done).
    pub step: usize,
    /// `VmRSS` in bytes.
    pub rss_bytes: u64,
    /// The live heap ([`live_bytes`]; 0 where the binary does not count it).
    pub live_bytes: u64,
}

/// What the soak measured.
#[derive(Debug, Clone)]
pub struct SoakReport {
    /// Nodes run.
    pub nodes: usize,
    /// Steps run.
    pub steps: usize,
    /// Leaves drawn by the fault schedule.
    pub faults: usize,
    /// Returns of nodes that had left (each took a peer's state).
    pub rejoins: u64,
    /// Node-steps missed by nodes away.
    pub absent_node_steps: u64,
    /// Seconds of the whole run (fit), and of its training loop.
    pub wall_s: f64,
    /// Seconds of the training loop.
    pub loop_s: f64,
    /// Every sample, in order, the end sample last.
    pub samples: Vec<RssSample>,
    /// The first sample at or after the warm-up.
    pub warm: RssSample,
    /// The last sample: at the final evaluation, after every node's last step (and after
    /// most node threads have ended).
    pub end: RssSample,
    /// The largest sample from the warm-up on.
    pub max_after_warmup_bytes: u64,
    /// The process's peak resident memory (`VmHWM`), set-up included.
    pub peak_rss_bytes: u64,
    /// The last sample taken in the training loop, while every node thread runs: where the
    /// growth is measured to (once the loop is over, node threads end and free their
    /// stacks and thread-local buffers before the final evaluation's end sample).
    pub last_in_loop: RssSample,
    /// Bytes of one step's train record (`RunReport::train` keeps one per step: memory a
    /// run must hold to return its report, and which grows with the steps).
    pub record_bytes: u64,
    /// The traffic summed over nodes.
    pub traffic: TrafficBalance,
}

impl SoakReport {
    /// [`rss_growth_pct`] from the warm-up sample to the last in the loop (not to the end
    /// sample: by the final evaluation most node threads have ended, and their stacks and
    /// caches with them, which at 1,024 nodes takes tens of MiB off the resident set).
    pub fn rss_growth_pct(&self) -> f64 {
        rss_growth_pct(self.warm.rss_bytes, self.last_in_loop.rss_bytes)
    }

    /// Bytes of the train records written from the warm-up sample to `to` (the records of
    /// the steps after the warm-up sample's, up to `to`'s).
    pub fn records_bytes_between(&self, to: &RssSample) -> u64 {
        to.step.saturating_sub(self.warm.step) as u64 * self.record_bytes
    }

    /// [`rss_growth_pct`] from the warm-up sample to the last in the loop, net of the train
    /// records written in between: the measure the memory check applies.
    pub fn rss_net_growth_pct(&self) -> f64 {
        let last = &self.last_in_loop;
        let records = self.records_bytes_between(last);
        rss_growth_pct(self.warm.rss_bytes, last.rss_bytes.saturating_sub(records))
    }

    /// Growth of the live heap from the warm-up sample to the last in the loop, in bytes
    /// (negative if it shrank). The recorder sets room for every step's train record before
    /// the first step, so the live heap counts the records from the start and this growth
    /// holds none of them (the resident set takes their pages only as they are written).
    pub fn live_growth_bytes(&self) -> i64 {
        self.last_in_loop.live_bytes as i64 - self.warm.live_bytes as i64
    }

    /// Why the soak fails, if it does: resident memory grown, net of the train records,
    /// [`RSS_GROWTH_LIMIT_PCT`] or more, or traffic that does not balance.
    pub fn failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        let growth = self.rss_net_growth_pct();
        if growth >= RSS_GROWTH_LIMIT_PCT {
            why.push(format!(
                "resident memory grew {growth:.2}% after warm-up net of the train records \
                 (limit {RSS_GROWTH_LIMIT_PCT}%)"
            ));
        }
        if !self.traffic.balanced() {
            why.push(format!(
                "{} bytes sent but {} received",
                self.traffic.sent, self.traffic.received
            ));
        }
        why
    }
}

/// Counts the training examples the nodes draw and samples the resident memory every
/// `every` of them: the data is read at the start of every node's step, so the count says
/// how far the run has got without a hook in the trainer. (Nodes away draw nothing, so
/// the ticks fall short of the last step: the end sample comes from the validation set.)
struct RssProbe {
    drawn: AtomicU64,
    every: u64,
    /// Print a progress line every this many samples.
    report_every: usize,
    /// `(examples drawn, VmRSS bytes, heap bytes)`, preallocated so that sampling does not
    /// grow memory.
    samples: Mutex<Vec<(u64, u64, u64)>>,
    /// `(examples drawn, VmRSS bytes, heap bytes)` at the first read of the validation set: the final
    /// evaluation, after every node's last step (DiLoCo's last all-reduce holds them all
    /// there) and before the node threads end.
    end: Mutex<Option<(u64, u64, u64)>>,
    start: Instant,
    /// Examples per step of all nodes, for the progress line only.
    examples_per_step: u64,
}

impl RssProbe {
    /// The end sample, once.
    fn end(&self) {
        let mut end = self.end.lock().unwrap_or_else(|p| p.into_inner());
        if end.is_none() {
            let drawn = self.drawn.load(Ordering::Relaxed);
            *end = Some((drawn, resident_bytes().unwrap_or(0), heap_bytes()));
        }
    }

    fn tick(&self) {
        let n = self.drawn.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(self.every) {
            return;
        }
        let rss = resident_bytes().unwrap_or(0);
        let heap = heap_bytes();
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push((n, rss, heap));
        if samples.len().is_multiple_of(self.report_every) {
            eprintln!(
                "soak: about step {}, RSS {:.1} MiB, live heap {:.1} MiB, {:.0} s",
                n / self.examples_per_step,
                rss as f64 / MB as f64,
                heap as f64 / MB as f64,
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

/// One synthetic example.
#[derive(Debug, Clone)]
pub struct SoakExample {
    features: [f32; FEATURES],
    label: usize,
}

/// The synthetic task: inputs from a hash of the index, class = arg-max of a fixed linear
/// map, so that the model has something to learn.
fn synthetic(len: usize, seed: u64) -> Vec<SoakExample> {
    let value = |i: u64| {
        let x = gym_core::rng::derive_seed(seed, &[i]);
        (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    (0..len)
        .map(|i| {
            let features: [f32; FEATURES] =
                std::array::from_fn(|j| value((i * FEATURES + j) as u64));
            let score = |c: usize| -> f32 {
                features
                    .iter()
                    .enumerate()
                    .map(|(j, x)| x * (((c * 7 + j * 3) % 5) as f32 - 2.0))
                    .sum()
            };
            let label = (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0);
            SoakExample { features, label }
        })
        .collect()
}

/// A dataset over shared examples that tells the probe of every read: the training set
/// ticks it, the validation set (read only by the final evaluation) takes the end sample.
struct SoakDataset {
    items: Arc<Vec<SoakExample>>,
    probe: Arc<RssProbe>,
    validation: bool,
}

impl Dataset<SoakExample> for SoakDataset {
    fn get(&self, index: usize) -> Result<SoakExample, DatasetError> {
        if self.validation {
            self.probe.end();
        } else {
            self.probe.tick();
        }
        self.items.get(index).cloned().ok_or_else(|| {
            DatasetError::new(std::io::Error::other(format!("index {index} out of range")))
        })
    }

    fn len(&self) -> usize {
        self.items.len()
    }
}

/// Batches [`SoakExample`]s as `[batch, 1, 1, FEATURES]` images.
#[derive(Debug, Clone, Copy)]
struct SoakBatcher;

impl Batcher<SoakExample, ImageBatch> for SoakBatcher {
    fn batch(&self, items: Vec<SoakExample>, device: &Device) -> ImageBatch {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|e| e.features).collect();
        let y: Vec<i64> = items.iter().map(|e| e.label as i64).collect();
        ImageBatch {
            images: Tensor::from_data(TensorData::new(x, [n, 1, 1, FEATURES]), device),
            targets: Tensor::<1, Int>::from_data(TensorData::new(y, [n]), device),
        }
    }
}

/// This process's resident memory (`VmRSS`), or `None` where `/proc` has no such figure.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The live heap, or 0 where the binary does not count it.
fn heap_bytes() -> u64 {
    live_bytes().unwrap_or(0)
}

/// The step each count of node-steps done falls in: node-steps accumulate step by step,
/// `nodes` per step less those away (`absent[s]`). A count past the run is its last step.
fn step_of(node_steps: u64, nodes: usize, absent: &[u32]) -> usize {
    let mut done = 0u64;
    for (step, &away) in absent.iter().enumerate() {
        done += (nodes as u64).saturating_sub(away as u64);
        if done >= node_steps {
            return step;
        }
    }
    absent.len().saturating_sub(1)
}

/// Nodes away at each of `steps` steps, from the run's faults (leaves and crashes).
fn absent_per_step(faults: &[Fault], steps: usize) -> Vec<u32> {
    // Differences, then a running sum: a leave is +1 at its start and −1 at its end.
    let mut delta = vec![0i64; steps + 1];
    for fault in faults {
        let (at, end) = match *fault {
            Fault::Leave { at, steps: n, .. } => (at, at.saturating_add(n)),
            Fault::Crash { at, .. } => (at, usize::MAX),
            _ => continue,
        };
        delta[at.min(steps)] += 1;
        delta[end.min(steps)] -= 1;
    }
    let mut level = 0i64;
    delta[..steps]
        .iter()
        .map(|d| {
            level += d;
            level as u32
        })
        .collect()
}

/// Runs the soak and measures it.
pub fn run_soak(config: &SoakConfig) -> Result<SoakReport, BoxError> {
    if config.nodes == 0 || config.steps == 0 || config.samples == 0 {
        return Err("the soak needs at least one node, one step and one sample".into());
    }
    if !(0.0..1.0).contains(&config.warmup_fraction) {
        return Err(format!(
            "the warm-up share must be in [0, 1), not {}",
            config.warmup_fraction
        )
        .into());
    }
    let mlp = MlpConfig::new()
        .with_input(FEATURES)
        .with_hidden(HIDDEN)
        .with_classes(CLASSES);
    // One simulated second per step: the fault rate then reads in steps (fault_schedule).
    let flops_per_step =
        mlp.init(&Device::default()).flops_per_example() * config.batch_size as f64;
    let simulation = SimulationConfig::new(
        "datacenter"
            .parse::<gym_core::Network>()
            .map_err(|e| format!("the datacenter network: {e}"))?,
    )
    .with_compute(ComputeModel::Modelled {
        flops_per_s: flops_per_step,
    });
    let node_steps_per_sample =
        (config.nodes as u64 * config.steps as u64 / config.samples as u64).max(1);
    let probe = Arc::new(RssProbe {
        drawn: AtomicU64::new(0),
        every: node_steps_per_sample * config.batch_size as u64,
        report_every: config.samples.div_ceil(10),
        samples: Mutex::new(Vec::with_capacity(config.samples + 1)),
        end: Mutex::new(None),
        start: Instant::now(),
        examples_per_step: (config.nodes * config.batch_size) as u64,
    });
    let train: SharedDataset<SoakExample> = Arc::new(SoakDataset {
        items: Arc::new(synthetic(TRAIN_EXAMPLES, config.seed)),
        probe: probe.clone(),
        validation: false,
    });
    let val: SharedDataset<SoakExample> = Arc::new(SoakDataset {
        items: Arc::new(synthetic(VAL_EXAMPLES, config.seed + 1)),
        probe: probe.clone(),
        validation: true,
    });
    // Every node reads the same examples in its own order: with one dataset sharded over
    // K nodes, each node would shuffle all K shards every epoch (K × batch indices per
    // node-step), which at K = 1,024 would cost more than the model.
    let data = NodeData::per_node(move |_, _, split| match split {
        Split::Train => train.clone(),
        _ => val.clone(),
    });
    let strategy = DiLoCoConfig::new().with_communicator(
        DiLoCoCommunicatorConfig::new().with_sync_interval(config.sync_interval.max(1)),
    );
    let trainer = TrainerConfig::new(config.nodes)
        .with_max_steps(Some(config.steps))
        .with_batch_size(config.batch_size)
        .with_val_size(Some(0))
        .with_seed(config.seed)
        .with_simulation(Some(simulation))
        .with_faults(Some(config.fault_schedule()));
    let start = Instant::now();
    let out = Trainer::new(trainer).fit(|d| mlp.init(d), &strategy, &data, &SoakBatcher)?;
    let wall_s = start.elapsed().as_secs_f64();
    let report = out.report;

    let absent = absent_per_step(&report.elastic.faults, config.steps);
    let end = *probe.end.lock().unwrap_or_else(|p| p.into_inner());
    let end = end.ok_or("the final evaluation read no validation example")?;
    let samples: Vec<RssSample> = probe
        .samples
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        // The end sample last (it may repeat a count when the last tick fell on the end).
        .chain(std::iter::once(&end))
        .map(|&(drawn, rss, heap)| RssSample {
            step: step_of(drawn / config.batch_size as u64, config.nodes, &absent),
            rss_bytes: rss,
            live_bytes: heap,
        })
        .collect();
    let warm_step = (config.steps as f64 * config.warmup_fraction) as usize;
    let warm_index = samples
        .iter()
        .position(|s| s.step >= warm_step)
        .ok_or("no memory sample after the warm-up")?;
    let warm = samples[warm_index];
    let end = *samples.last().expect("the end sample");
    let max_after_warmup_bytes = samples[warm_index..]
        .iter()
        .map(|s| s.rss_bytes)
        .max()
        .unwrap_or(0);
    // The end sample is last; the one before it, the loop's last.
    let last_in_loop = samples[samples.len().saturating_sub(2).max(warm_index)];
    let total = report.elastic.total();
    Ok(SoakReport {
        nodes: config.nodes,
        steps: config.steps,
        faults: report
            .elastic
            .faults
            .iter()
            .filter(|f| matches!(f, Fault::Leave { .. } | Fault::Crash { .. }))
            .count(),
        rejoins: total.rejoins,
        absent_node_steps: total.absent_steps,
        wall_s,
        loop_s: report.loop_s,
        samples,
        warm,
        end,
        max_after_warmup_bytes,
        peak_rss_bytes: crate::summary::peak_rss_bytes().unwrap_or(0),
        last_in_loop,
        record_bytes: std::mem::size_of::<gym_core::TrainRecord>() as u64,
        traffic: TrafficBalance::of(&report.comm),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_relative_to_the_warm_sample() {
        assert_eq!(rss_growth_pct(200, 210), 5.0);
        assert_eq!(rss_growth_pct(200, 190), -5.0);
        assert_eq!(rss_growth_pct(0, 10), 0.0);
    }

    #[test]
    fn the_memory_check_is_net_of_the_records_written_after_warm_up() {
        let sample = |step, rss_bytes, live_bytes| RssSample {
            step,
            rss_bytes,
            live_bytes,
        };
        let mut report = SoakReport {
            nodes: 1,
            steps: 1001,
            faults: 0,
            rejoins: 0,
            absent_node_steps: 0,
            wall_s: 0.0,
            loop_s: 0.0,
            samples: Vec::new(),
            // 1,000 records of 100 bytes written after warm-up: 100,000 bytes.
            warm: sample(0, 1_000_000, 500),
            end: sample(1000, 900_000, 0),
            max_after_warmup_bytes: 0,
            peak_rss_bytes: 0,
            last_in_loop: sample(1000, 1_140_000, 800),
            record_bytes: 100,
            traffic: TrafficBalance::default(),
        };
        assert_eq!(report.records_bytes_between(&report.last_in_loop), 100_000);
        assert!((report.rss_growth_pct() - 14.0).abs() < 1e-9);
        assert!((report.rss_net_growth_pct() - 4.0).abs() < 1e-9);
        assert!(report.failures().is_empty());
        assert_eq!(report.live_growth_bytes(), 300);
        report.last_in_loop.rss_bytes = 1_150_000;
        assert_eq!(report.failures().len(), 1, "5% net of the records fails");
    }

    #[test]
    fn traffic_adds_up_over_nodes_and_balances_only_when_equal() {
        let node = |sent, received| CommStats {
            bytes_sent: sent,
            bytes_received: received,
            broadcast_calls: 1,
            ..Default::default()
        };
        // A chain broadcast of 100 bytes over three nodes: root sends, the last receives.
        let t = TrafficBalance::of(&[node(100, 0), node(100, 100), node(0, 100)]);
        assert_eq!((t.sent, t.received, t.broadcast_calls), (200, 200, 3));
        assert!(t.balanced());
        assert!(!TrafficBalance::of(&[node(100, 0), node(0, 99)]).balanced());
    }

    #[test]
    fn absent_nodes_slow_the_count_of_node_steps() {
        let faults = [
            Fault::Leave {
                rank: 1,
                at: 1,
                steps: 2,
            },
            Fault::Crash { rank: 2, at: 3 },
        ];
        let absent = absent_per_step(&faults, 5);
        assert_eq!(absent, vec![0, 1, 1, 1, 1]);
        // 4 nodes: node-steps done after each step are 4, 7, 10, 13, 16.
        assert_eq!(step_of(4, 4, &absent), 0);
        assert_eq!(step_of(5, 4, &absent), 1);
        assert_eq!(step_of(10, 4, &absent), 2);
        assert_eq!(step_of(11, 4, &absent), 3);
        assert_eq!(step_of(99, 4, &absent), 4);
    }
}
