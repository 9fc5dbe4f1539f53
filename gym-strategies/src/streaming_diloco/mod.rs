//! Streaming DiLoCo (Douillard et al., 2025, arXiv 2501.18512): DiLoCo synchronising one
//! fragment of the parameters at a time, staggered, each exchange overlapped with τ inner
//! steps, outer gradients in 4 bits.

use crate::communicate::{
    CommunicationModule, CommunicationModuleConfig, Transfer, check_sync_interval,
    composed_strategy,
};
use crate::compress::{Codec, CompressionConfig, Compressor, Quantizer};
use crate::outer::OuterRecord;
use crate::outer::{OuterOptimizer, default_outer_optimizer};
use burn::config::Config;
use burn::tensor::Tensor;
use gym_core::planner::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, Traffic};
use gym_core::state::fields::{Record, Values};
use gym_core::{
    GymError, Incoming, InnerOptimizerConfig, NodeInfo, OptimizerConfig, Result, StateDict,
    StepContext, TransferTiming,
};
use std::ops::Range;

mod fragments;

pub use fragments::FragmentPattern;
use fragments::{gather, scatter};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "streaming-diloco";

/// Streaming DiLoCo: an inner optimizer (default AdamW) on every node; the parameters split
/// into F fragments, each synchronised DiLoCo-style once every H steps, staggered so that
/// one fragment synchronises every H/F steps, its exchange overlapped with τ inner steps.
///
/// Douillard et al., *Streaming DiLoCo with overlapping communication: Towards a
/// Distributed Free Lunch*, arXiv 2501.18512; the rule follows meta-pytorch/torchft
/// `local_sgd.py` (see [`StreamingDiLoCo`]).
///
/// The paper uses one fragment per 3 transformer blocks (8 for its 24-layer 1B model); here
/// fragments are runs of whole parameters ([`FragmentPattern`]), since the simulator sees a
/// model as a flat list of parameters, not of blocks.
///
/// # Bytes
///
/// A fragment of `N_p` elements costs one mean of `N_p` values: `⌊2(K−1)/K · 4N_p⌋` sent
/// per node exactly (no compression), or an all-gather of `(K−1)` codes with a codec. Per H
/// steps the total equals DiLoCo's (every element once); the peak per synchronisation event
/// drops to about N/F.
#[derive(Config, Debug)]
pub struct StreamingDiLoCoConfig {
    /// Each node's own optimizer (default AdamW), never reset by a synchronisation.
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// Inner steps between two synchronisations of the same fragment (H).
    #[config(default = 100)]
    pub sync_interval: usize,
    /// Number of fragments (F); H must be a multiple of F.
    #[config(default = 2)]
    pub fragments: usize,
    /// How parameters are assigned to fragments.
    #[config(default = "FragmentPattern::Sequential")]
    pub pattern: FragmentPattern,
    /// Inner steps the exchange of a fragment overlaps with (τ), below H/F: the mean is
    /// started τ steps before it is applied. 1 is the paper's final recipe; 0 blocks.
    #[config(default = 1)]
    pub overlap: usize,
    /// Mixing α at a synchronisation: the fragment becomes `(1−α)·φ_p + α·θ_p` (0 takes the
    /// global value; the paper ablates 0 and 0.5).
    #[config(default = 0.5)]
    pub mixing: f64,
    /// Outer optimizer (Burn's), one instance per fragment; default SGD with Nesterov
    /// momentum 0.9.
    #[config(default = "default_outer_optimizer()")]
    pub outer_optimizer: OptimizerConfig,
    /// The outer optimizer's learning rate.
    #[config(default = 0.7)]
    pub outer_lr: f64,
    /// How the outer gradients are averaged. Default: FP4 with one f32 scale per 32 values.
    /// The paper sends 4-bit floats (reported as E3M0, a format not confirmed from its
    /// text); this uses E2M1 with a per-block scale, with no error feedback (as the paper).
    #[config(default = "CompressionConfig::codec(Codec::Dense(Quantizer::Fp4 { block: 32 }))")]
    pub compression: CompressionConfig,
}

impl StreamingDiLoCoConfig {
    /// Refuses settings it cannot run with (whatever the model), naming them.
    pub fn validate(&self) -> Result<()> {
        let invalid =
            |why: String| Err(GymError::InvalidConfig(format!("Streaming DiLoCo: {why}")));
        let (h, f) = (self.sync_interval, self.fragments);
        check_sync_interval("Streaming DiLoCo", h)?;
        if f == 0 {
            return invalid("`fragments` (F) must be at least 1".into());
        }
        // (torchft checks the same, but its message says it the other way round.)
        if !h.is_multiple_of(f) {
            return invalid(format!(
                "`sync_interval` (H = {h}) must be a multiple of `fragments` (F = {f})"
            ));
        }
        if self.overlap >= h / f {
            return invalid(format!(
                "`overlap` (τ = {}) must be less than H/F = {}",
                self.overlap,
                h / f
            ));
        }
        if !(0.0..=1.0).contains(&self.mixing) {
            return invalid(format!(
                "`mixing` (α) must lie in [0, 1], got {}",
                self.mixing
            ));
        }
        self.compression.validate()
    }
}

composed_strategy!(StreamingDiLoCoConfig, NAME, |c| [StreamingModuleConfig(
    c.clone()
)]);

/// The communication module of a [`StreamingDiLoCoConfig`].
struct StreamingModuleConfig(StreamingDiLoCoConfig);

impl CommunicationModuleConfig for StreamingModuleConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.0).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        Ok(Box::new(StreamingDiLoCo::new(&self.0, node)?))
    }

    /// Each fragment's mean, started τ steps before its sync step and waited for there
    /// (the schedule of [`StreamingDiLoCo`]). A fragment's size follows the layout's split
    /// when the model exists; by size alone the parameters are cut into F equal parts.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        let config = &self.0;
        config.validate()?;
        let f = config.fragments;
        let sizes: Vec<u64> = match info.layout {
            Some(layout) => {
                let entries = layout.entries();
                if f > entries.len() {
                    return Err(GymError::InvalidConfig(format!(
                        "Streaming DiLoCo: `fragments` (F = {f}) must not exceed the model's {} \
                         parameters",
                        entries.len()
                    )));
                }
                config
                    .pattern
                    .split(layout, f)
                    .iter()
                    .map(|params| params.iter().map(|&i| entries[i].numel as u64).sum())
                    .collect()
            }
            None => {
                let n = info.params;
                (0..f as u64)
                    .map(|p| n / f as u64 + u64::from(p < n % f as u64))
                    .collect()
            }
        };
        let means = sizes
            .iter()
            .map(|&n| config.compression.planned_mean(n))
            .collect::<Result<Vec<_>>>()?;
        let (stride, overlap, max_steps) =
            (config.sync_interval / f, config.overlap, info.max_steps);
        let syncing_at = move |step: usize| {
            let events = step + 1;
            events
                .is_multiple_of(stride)
                .then(|| (events / stride - 1) % f)
        };
        let mut in_flight: Option<usize> = None;
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                // A sync due now goes first, then the prepare τ steps ahead, then (τ = 0) its sync.
                let sync_if_due =
                    |in_flight: &mut Option<usize>, events: &mut Vec<PlannedEvent>| {
                        if *in_flight == Some(step) {
                            *in_flight = None;
                            events.push(PlannedEvent::Wait { id: step as u64 });
                        }
                    };
                sync_if_due(&mut in_flight, events);
                let sync_step = step + overlap;
                if sync_step < max_steps
                    && let Some(p) = syncing_at(sync_step)
                {
                    let (op, payload) = means[p];
                    events.push(PlannedEvent::Start {
                        id: sync_step as u64,
                        call: PlannedCall {
                            op,
                            groups: PlannedGroups::World,
                            payload,
                        },
                    });
                    in_flight = Some(sync_step);
                }
                sync_if_due(&mut in_flight, events);
                Ok(())
            },
        ))
    }
}

/// One fragment: its element ranges in the flat buffer, its outer optimizer (holding φ_p)
/// and its compressor.
struct Fragment {
    /// Disjoint, sorted, merged, non-empty ranges of the flat buffer.
    ranges: Vec<Range<usize>>,
    outer: OuterOptimizer,
    compressor: Box<dyn Compressor>,
}

/// A mean started at a prepare step, applied at its sync step.
///
/// The mean's value (which may still be on its way over a real link) is kept apart from the
/// simulated clock's charge for the transfer: a checkpoint between the prepare and the sync
/// saves the value once it has arrived (a `Pending` cannot be saved), and the charge stays
/// where it was, at the sync step.
struct InFlight {
    fragment: usize,
    sync_step: usize,
    /// Δ̄_p, as decoded once it has arrived (a decoding error surfaces at the sync step).
    mean: Incoming<Result<Tensor<1>>>,
    /// The transfer's charge to the clock, paid at the sync step.
    transfer: Transfer,
}

/// One node's Streaming DiLoCo synchronisation, after each inner step (torchft's rule, with
/// the shared step counter in place of torchft's per-sync counter).
///
/// With `s = H/F`, fragment `p` synchronises after the inner steps `t` with
/// `t + 1 = (p+1)·s + jH` (j ≥ 0): a round of H steps syncs fragment 0 after s steps,
/// fragment 1 after 2s, …, fragment F−1 after H (with F = 1, DiLoCo's schedule). For each
/// such sync step, τ steps earlier (the prepare step):
///
/// ```text
/// prepare (step t − τ):  Δ_p ← φ_p − θ_p  (f32);  start Δ̄_p ← mean over all nodes of Δ_p
///   … τ inner steps keep training every parameter, fragment p included …
/// sync    (step t):      wait for Δ̄_p;  φ_p ← outer_p.step(Δ̄_p);  θ_p ← (1−α)·φ_p + α·θ_p
/// ```
///
/// where θ_p at the sync is the node's current value (which trained for τ more steps). With
/// τ = 0 both happen in the same step and the mean blocks. Each fragment has its own outer
/// optimizer (so a fragment's momentum only moves at its own syncs) and its own compressor;
/// at most one fragment is in flight (τ < s); the inner optimizer is never reset. A mean
/// whose sync step would fall after the last step of the run is not started.
///
/// [`master_params`](CommunicationModule::master_params) is the φ_p put back in layout
/// order; all nodes hold the same.
///
/// # Checkpoints
///
/// Saved: every fragment's outer optimizer (φ_p, its momentum) and compressor under
/// `fragment{p}/`, and a mean in flight (prepared, not yet synced) as its value Δ̄_p with its
/// fragment and sync step under `in_flight/`. The value is exactly what the sync would have
/// applied, so parameters resume bit for bit; with it go the transfer's simulated timing
/// ([`Pending::timing`](gym_core::Pending::timing)), whose wait the resumed run charges at the sync step through
/// [`Collective::resume_pending`](gym_core::Collective::resume_pending), so its clock
/// resumes exactly too.
pub struct StreamingDiLoCo {
    /// s = H/F, steps between two synchronisation events.
    stride: usize,
    overlap: usize,
    mixing: f64,
    fragments: Vec<Fragment>,
    in_flight: Option<InFlight>,
}

impl StreamingDiLoCo {
    /// The module of one node; refuses bad settings, and more fragments than parameters.
    pub fn new(config: &StreamingDiLoCoConfig, node: &NodeInfo<'_>) -> Result<Self> {
        config.validate()?;
        let n_params = node.layout.entries().len();
        if config.fragments > n_params {
            return Err(GymError::InvalidConfig(format!(
                "Streaming DiLoCo: `fragments` (F = {}) must not exceed the model's {n_params} \
                 parameters",
                config.fragments
            )));
        }
        let entries = node.layout.entries();
        let fragments = config
            .pattern
            .split(node.layout, config.fragments)
            .into_iter()
            .enumerate()
            .map(|(p, params)| {
                let mut ranges: Vec<Range<usize>> = Vec::new();
                for i in params {
                    let e = &entries[i];
                    let r = e.offset..e.offset + e.numel;
                    match ranges.last_mut() {
                        Some(last) if last.end == r.start => last.end = r.end,
                        _ => ranges.push(r),
                    }
                }
                ranges.retain(|r| !r.is_empty());
                if ranges.is_empty() {
                    return Err(GymError::InvalidConfig(format!(
                        "Streaming DiLoCo: fragment {p} holds no element; use fewer `fragments`"
                    )));
                }
                Ok(Fragment {
                    outer: OuterOptimizer::new(
                        "Streaming DiLoCo",
                        &config.outer_optimizer,
                        config.outer_lr,
                        gather(&ranges, &node.initial_params),
                    )?,
                    compressor: config.compression.init(node, p as u64)?,
                    ranges,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StreamingDiLoCo {
            stride: config.sync_interval / config.fragments,
            overlap: config.overlap,
            mixing: config.mixing,
            fragments,
            in_flight: None,
        })
    }

    /// The fragment that synchronises after the inner step `step`, if any.
    fn syncing_at(&self, step: usize) -> Option<usize> {
        let events = step + 1;
        events
            .is_multiple_of(self.stride)
            .then(|| (events / self.stride - 1) % self.fragments.len())
    }

    /// Starts the mean of fragment `p`'s outer gradient, to be applied at `sync_step`.
    fn prepare(&mut self, p: usize, sync_step: usize, ctx: &mut StepContext<'_>) -> Result<()> {
        let fragment = &mut self.fragments[p];
        let delta = fragment.outer.master() - gather(&fragment.ranges, &ctx.replica.params());
        let world = ctx.world();
        // The value arrives when it does; the clock's charge stays with the transfer.
        let (mean, transfer) = fragment
            .compressor
            .start_mean(&world, delta, ctx)?
            .into_parts();
        debug_assert!(self.in_flight.is_none(), "at most one fragment in flight");
        self.in_flight = Some(InFlight {
            fragment: p,
            sync_step,
            mean,
            transfer: Transfer::Started(transfer),
        });
        Ok(())
    }

    /// Applies the mean in flight if its sync step is `step`: outer step, then mixing into
    /// the replica.
    fn sync_if_due(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        let step = ctx.step;
        let Some(InFlight {
            fragment,
            mean,
            transfer,
            ..
        }) = self.in_flight.take_if(|f| f.sync_step == step)
        else {
            return Ok(());
        };
        transfer.wait(ctx)?;
        let mean = mean.into_inner()??;
        let fragment = &mut self.fragments[fragment];
        let phi = fragment.outer.step(mean);
        let theta = ctx.replica.params();
        let local = gather(&fragment.ranges, &theta);
        // (1−α)·φ + α·θ: exactly φ at α = 0 and exactly θ at α = 1.
        let mixed = phi.mul_scalar(1.0 - self.mixing) + local.mul_scalar(self.mixing);
        ctx.replica
            .set_params(scatter(&fragment.ranges, theta, mixed));
        Ok(())
    }
}

impl CommunicationModule for StreamingDiLoCo {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        // A sync due now goes first (τ > 0: it was prepared τ steps ago), then the prepare
        // of the sync τ steps ahead, then, with τ = 0, that same sync.
        self.sync_if_due(ctx)?;
        let sync_step = ctx.step + self.overlap;
        if sync_step < ctx.max_steps
            && let Some(p) = self.syncing_at(sync_step)
        {
            self.prepare(p, sync_step, ctx)?;
        }
        self.sync_if_due(ctx)
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        let mut pieces: Vec<(usize, Tensor<1>)> = Vec::new();
        for fragment in &self.fragments {
            let phi = fragment.outer.master();
            let mut taken = 0;
            for r in &fragment.ranges {
                pieces.push((r.start, phi.clone().narrow(0, taken, r.len())));
                taken += r.len();
            }
        }
        pieces.sort_by_key(|(start, _)| *start);
        Some(Tensor::cat(pieces.into_iter().map(|(_, t)| t).collect(), 0))
    }

    fn save_state(&self) -> Result<StateDict> {
        let fragment = self
            .fragments
            .iter()
            .map(|f| {
                Ok(FragmentRecord {
                    outer: f.outer.record()?,
                    compressor: f.compressor.save_state()?,
                })
            })
            .collect::<Result<_>>()?;
        let in_flight = match &self.in_flight {
            None => None,
            Some(f) => {
                let mean = f.mean.get()?.as_ref().map_err(|e| {
                    GymError::Checkpoint(format!(
                        "Streaming DiLoCo: the mean in flight failed: {e}"
                    ))
                })?;
                let timing = f.transfer.timing();
                Some(InFlightRecord {
                    fragment: f.fragment,
                    sync_step: f.sync_step,
                    mean: Values::of(mean)?,
                    own_ready_s: timing.map(|t| t.own_ready_s),
                    start_s: timing.map(|t| t.start_s),
                    end_s: timing.map(|t| t.end_s),
                })
            }
        };
        StreamingRecord {
            fragment,
            in_flight: in_flight.is_some(),
            in_flight_mean: in_flight,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = StreamingRecord::from_state(state)?;
        let mut saved = record.fragment.into_iter();
        for (p, fragment) in self.fragments.iter_mut().enumerate() {
            let saved = match saved.next() {
                Some(saved) => saved,
                // Fails, naming what is missing.
                None => FragmentRecord::from_state(&state.child(&format!("fragment{p}")))?,
            };
            fragment.outer.load_record(saved.outer)?;
            fragment.compressor.load_state(&saved.compressor)?;
        }
        self.in_flight = None;
        if !record.in_flight {
            return Ok(());
        }
        let f = match record.in_flight_mean {
            Some(f) => f,
            None => InFlightRecord::from_state(&state.child("in_flight"))?,
        };
        let Some(fragment) = self.fragments.get(f.fragment) else {
            return Err(GymError::Checkpoint(format!(
                "`in_flight/fragment` is {} where this run has {} fragments",
                f.fragment,
                self.fragments.len()
            )));
        };
        let phi = fragment.outer.master();
        let (n, device) = (phi.dims()[0], phi.device());
        self.in_flight = Some(InFlight {
            fragment: f.fragment,
            sync_step: f.sync_step,
            mean: Incoming::ready(Ok(f.mean.tensor(n, &device)?)),
            transfer: Transfer::Resumed(f.end_s.map(|end_s| TransferTiming {
                own_ready_s: f.own_ready_s.unwrap_or(end_s),
                start_s: f.start_s.unwrap_or(end_s),
                end_s,
            })),
        });
        Ok(())
    }
}

gym_core::record! {
    /// What a [`StreamingDiLoCo`] node carries from one step to the next.
    pub struct StreamingRecord {
        /// Each fragment's outer optimizer and codec.
        pub fragment: Vec<FragmentRecord>,
        /// Whether a fragment's mean is in flight.
        pub in_flight: bool,
        /// The mean in flight, stored under `in_flight/`.
        pub in_flight_mean as "in_flight": Option<InFlightRecord>,
    }
}

gym_core::record! {
    /// One fragment's outer optimizer and codec.
    pub struct FragmentRecord {
        /// The fragment's master and outer optimizer state.
        pub outer: OuterRecord,
        /// The fragment's codec state.
        pub compressor: StateDict,
    }
}

gym_core::record! {
    /// A fragment's mean still in flight: which, since when, and when its transfer ran.
    pub struct InFlightRecord {
        /// The fragment.
        pub fragment: usize,
        /// The step its synchronisation started at.
        pub sync_step: usize,
        /// The averaged outer gradient Δ̄.
        pub mean: Values,
        /// When this node was ready for the transfer.
        pub own_ready_s: Option<f64>,
        /// When the transfer started.
        pub start_s: Option<f64>,
        /// When it ended.
        pub end_s: Option<f64>,
    }
}
/// Streaming DiLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::value_name;
    use crate::registry::{
        CompressionArgs, Entry, OptimizerArgs, OuterArgs, OwnFlags, Shared, SyncArgs,
    };
    use clap::{Args, ValueEnum};
    use serde::Serialize;

    /// Streaming DiLoCo's fragment patterns, as the command line names them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
    pub enum FragmentPatternName {
        /// Contiguous runs of whole parameters, balanced in size.
        Sequential,
        /// Parameter i in fragment i mod F.
        Strided,
    }

    /// Streaming DiLoCo's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct StreamingDiLoCoArgs {
        /// Streaming DiLoCo: fragments, each synchronised once per H steps, staggered.
        #[arg(long, default_value_t = 2)]
        pub fragments: usize,
        /// Streaming DiLoCo: how the parameters are split into fragments.
        #[arg(long, value_enum, default_value = "sequential")]
        #[serde(serialize_with = "value_name")]
        pub fragment_pattern: FragmentPatternName,
        /// Streaming DiLoCo: inner steps a fragment's exchange overlaps (τ).
        #[arg(long, default_value_t = 1)]
        pub overlap: usize,
        /// Streaming DiLoCo: share α of the local values kept when a fragment is
        /// synchronised.
        #[arg(long, default_value_t = 0.5)]
        pub mixing: f64,
    }

    /// Streaming DiLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "Streaming DiLoCo: DiLoCo by fragments, staggered, overlapped by --overlap \
                steps, outer gradients in 4 bits (H 100, outer lr 0.7)",
        uses: &[Shared::Sync, Shared::Outer, Shared::Compression],
        flags: OwnFlags::of::<StreamingDiLoCoArgs>("Streaming DiLoCo"),
        build: |f| {
            let own: StreamingDiLoCoArgs = f.get()?;
            let (sync, outer) = (f.get::<SyncArgs>()?, f.get::<OuterArgs>()?);
            let defaults = StreamingDiLoCoConfig::new();
            Ok(Box::new(
                defaults
                    .clone()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_sync_interval(sync.or(defaults.sync_interval))
                    .with_fragments(own.fragments)
                    .with_pattern(match own.fragment_pattern {
                        FragmentPatternName::Sequential => FragmentPattern::Sequential,
                        FragmentPatternName::Strided => FragmentPattern::Strided,
                    })
                    .with_overlap(own.overlap)
                    .with_mixing(own.mixing)
                    .with_outer_optimizer(outer.optimizer_or(&defaults.outer_optimizer))
                    .with_outer_lr(outer.lr_or(defaults.outer_lr))
                    .with_compression(f.get::<CompressionArgs>()?.or(defaults.compression)),
            ))
        },
    };
}
