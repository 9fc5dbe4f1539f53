//! DeMo (Decoupled Momentum Optimization; Peng, Quesnelle & Kingma, arXiv 2411.19870):
//! each node keeps its gradients in a local buffer, sends only the largest DCT
//! coefficients of it, and every node steps with the sign of the decoded average.
//!
//! Per step, on every node and for every parameter (spec §7):
//! 1. decoupled weight decay `θ ← θ·(1 − η·λ)`;
//! 2. `δ ← β·δ + η·g` (the local, un-averaged gradient `g`, optionally clipped);
//! 3. the DCT of `δ`, chunk by chunk ([`ChunkGrid`]), and in each chunk the `k`
//!    coefficients largest in magnitude;
//! 4. error feedback: `δ ← δ − IDCT(what was sent)`, so what is not sent stays for later;
//! 5. an all-gather of every node's (index, value) pairs;
//! 6. each coefficient becomes the mean over the nodes that sent it (nodes that did not send
//!    it do not dilute it), the sum is decoded, and `θ ← θ − η·sign(G)`.
//!
//! The transforms and the top-k run on the host (rustfft); the parameter update runs on the
//! node's device.
//!
//! # Differences from the original
//! * The learning rate is set by the configuration (the original is stuck at SGD's default
//!   1e-3) and follows the run's schedule; optional gradient clipping (`max_norm`) runs
//!   before the step (the original ignores it).
//! * Tensors of three or more dimensions (conv kernels) are transformed as
//!   `out_channels × rest` matrices; the original cannot train them.
//! * Indices travel in the smallest unsigned integer that holds a position within a chunk
//!   ([`IndexWidth`]): one byte for chunks of up to 256 coefficients (`compression_chunk`
//!   16), two bytes up to 65 536 (the default 64 × 64 chunks), four beyond. The original
//!   sends int64. All parameters' pairs travel in one all-gather per step.

pub mod codec;
pub mod dct;

use crate::compress::missing;
use burn::config::Config;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::{Tensor, TensorData};
use codec::{IndexWidth, SparseCoefficients, read_index, top_k_per_chunk};
use dct::{ChunkGrid, Dct};
use gym_core::comm::CollectiveOp;
use gym_core::optim::{check_learning_rate, check_max_norm, clip_grad_norm};
use gym_core::planner::{PlanInfo, PlannedEvent, Traffic};
use gym_core::state::fields::{Bytes, Record, Values};
use gym_core::{
    GymError, LrScheduleConfig, NodeInfo, ParamLayout, Result, StateDict, StepContext, Strategy,
    StrategyConfig,
};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "demo";

/// Configuration of [`DeMo`], with the original's defaults.
#[derive(Config, Debug)]
pub struct DeMoConfig {
    /// Learning rate η: scales both the accumulation into the buffer and the sign step.
    #[config(default = 1e-3)]
    pub lr: f64,
    /// Learning-rate schedule around `lr`.
    #[config(default = "LrScheduleConfig::new()")]
    pub schedule: LrScheduleConfig,
    /// Clip the local gradient to this global L2 norm before the step.
    #[config(default = "None")]
    pub max_norm: Option<f64>,
    /// Decay β of the error-feedback buffer, in `[0, 1)`.
    #[config(default = 0.999)]
    pub compression_decay: f64,
    /// Coefficients sent per chunk (capped at the chunk's size).
    #[config(default = 32)]
    pub compression_topk: usize,
    /// Target chunk length per dimension (see [`dct::chunk_size`]).
    #[config(default = 64)]
    pub compression_chunk: usize,
    /// Decoupled weight decay λ.
    #[config(default = 0.0)]
    pub weight_decay: f64,
}

impl DeMoConfig {
    /// Checks every setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(GymError::InvalidConfig(format!("DeMo: {why}")));
        check_learning_rate("lr", self.lr)?;
        self.schedule.validate()?;
        check_max_norm(self.max_norm)?;
        if self.compression_topk == 0 {
            return bad("`compression_topk` must be at least 1".into());
        }
        if self.compression_chunk == 0 {
            return bad("`compression_chunk` must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.compression_decay) {
            return bad(format!(
                "`compression_decay` must be in [0, 1), got {}",
                self.compression_decay
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!(
                "`weight_decay` must be finite and non-negative, got {}",
                self.weight_decay
            ));
        }
        Ok(())
    }
}

/// DeMo's state for one parameter.
struct ParamState {
    /// First element in the flat buffer.
    offset: usize,
    grid: ChunkGrid,
    k: usize,
    width: IndexWidth,
    /// The error-feedback buffer δ ("decoupled momentum"), kept as its DCT coefficients
    /// (chunk-major, see [`ChunkGrid`]).
    delta: Vec<f32>,
    /// What this node sent at the last step.
    sent: SparseCoefficients,
}

impl ParamState {
    /// Bytes of this parameter's share of the payload.
    fn payload_bytes(&self) -> usize {
        wire_bytes(&self.grid, self.k, self.width)
    }
}

/// How a parameter of `shape` travels: its chunk grid, the coefficients sent per chunk
/// and the width of their indices. Training's state and a plan's payload both follow it.
fn wire(shape: &[usize], chunk: usize, topk: usize) -> (ChunkGrid, usize, IndexWidth) {
    let grid = ChunkGrid::new(shape, chunk);
    let k = topk.clamp(1, grid.chunk_len().max(1));
    (grid, k, IndexWidth::for_chunk_len(grid.chunk_len()))
}

/// Bytes of one parameter's share of the payload: `chunks · k` indices and as many f32
/// values.
fn wire_bytes(grid: &ChunkGrid, k: usize, width: IndexWidth) -> usize {
    grid.num_chunks() * k * (width.bytes() + 4)
}

/// Buffers reused from step to step (one parameter at a time).
#[derive(Default)]
struct Workspace {
    /// DCT coefficients of a gradient; then the coefficient sums being decoded.
    coefficients: Vec<f32>,
    /// How many nodes sent each coefficient.
    count: Vec<u32>,
    /// Top-k selection keys: `|c|`'s bits above the position within the chunk.
    keys: Vec<u64>,
}

/// A node running DeMo, built by [`DeMoConfig`].
pub struct DeMo {
    params: Vec<ParamState>,
    dct: Dct,
    /// Per-step workspaces, sized for the largest parameter, so a step allocates little.
    workspace: Workspace,
    schedule: ModuleLrScheduler,
    /// Steps taken: the schedule's position.
    steps: u64,
    decay: f32,
    weight_decay: f64,
    max_norm: Option<f64>,
    lr: f64,
}

impl StrategyConfig for DeMoConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        Ok(Box::new(DeMo::new(self, node)?))
    }

    /// Every step, one all-gather of every node's coefficients over the world:
    /// [`payload_bytes`](Self::payload_bytes) of the parameters' shapes, which it needs
    /// (refused with [`GymError::PlanNeedsShapes`] without).
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.validate()?;
        let shapes = info.shapes.ok_or(GymError::PlanNeedsShapes {
            strategy: "DeMo".into(),
            why: "it sends the top-k DCT coefficients of every chunk of each tensor",
        })?;
        let payload = self.payload_bytes(shapes);
        Ok(Box::new(
            move |_step: usize, events: &mut Vec<PlannedEvent>| {
                events.push(PlannedEvent::world(CollectiveOp::AllGatherBytes, payload));
                Ok(())
            },
        ))
    }

    /// The parameters and the buffer δ.
    fn state_values_per_param(&self) -> Option<f64> {
        Some(1.0)
    }
}

impl DeMoConfig {
    /// Bytes each node contributes to a step's all-gather for parameters shaped `shapes`:
    /// per tensor, `chunks · k` indices of its [`IndexWidth`] and as many f32 values, as a
    /// node built with them sends ([`DeMo::payload_bytes`]).
    pub fn payload_bytes(&self, shapes: &[Vec<usize>]) -> u64 {
        shapes
            .iter()
            .map(|shape| {
                let (grid, k, width) = wire(shape, self.compression_chunk, self.compression_topk);
                wire_bytes(&grid, k, width) as u64
            })
            .sum()
    }
}

impl Strategy for DeMo {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        let grads = match self.max_norm {
            Some(max_norm) => clip_grad_norm(grads, max_norm),
            None => grads,
        };
        self.lr = self.schedule.step().base();
        self.steps += 1;
        let lr = self.lr as f32;
        let grads = host(grads)?;

        let payload = self.compress(&grads, lr);
        let gathered = ctx.collective.all_gather_bytes(payload)?;
        let direction = self.aggregate(&gathered)?;

        let params = ctx.replica.params();
        let direction = Tensor::from_data(
            TensorData::new(direction, [params.dims()[0]]),
            &params.device(),
        );
        let params = if self.weight_decay != 0.0 {
            params.mul_scalar(1.0 - self.lr * self.weight_decay)
        } else {
            params
        };
        ctx.replica.set_params(params - direction.mul_scalar(lr));
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn save_state(&self) -> Result<StateDict> {
        DeMoRecord {
            steps: self.steps,
            lr: self.lr,
            // δ as stored: its DCT coefficients, chunk-major.
            delta: self
                .params
                .iter()
                .map(|p| Values::from(p.delta.clone()))
                .collect(),
            // What was sent last (only `last_sent` reads it), so that it survives too.
            sent: self
                .params
                .iter()
                .map(|p| SentRecord {
                    values: Values::from(p.sent.values.clone()),
                    indices: Bytes(
                        p.sent
                            .indices
                            .iter()
                            .flat_map(|i| i.to_le_bytes())
                            .collect(),
                    ),
                })
                .collect(),
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = DeMoRecord::from_state(state)?;
        // The schedule is replayed to its position (stricter than Burn's scheduler record,
        // whose loading ignores a missing state).
        for _ in self.steps..record.steps {
            self.schedule.step();
        }
        self.steps = record.steps;
        self.lr = record.lr;
        let (mut delta, mut sent) = (record.delta.into_iter(), record.sent.into_iter());
        for (i, p) in self.params.iter_mut().enumerate() {
            let saved = delta
                .next()
                .ok_or_else(|| missing(state, &format!("delta{i}")))?;
            p.delta = saved.into_vec_of(p.delta.len())?;
            let last = sent
                .next()
                .ok_or_else(|| missing(state, &format!("sent{i}/values")))?;
            p.sent.values = last.values.into_vec();
            p.sent.indices = last
                .indices
                .0
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
        }
        Ok(())
    }
}

gym_core::record! {
    /// What a [`DeMo`] node carries from one step to the next.
    pub struct DeMoRecord {
        /// Steps taken (the schedule's position).
        pub steps: u64,
        /// The learning rate of the last step.
        pub lr: f64,
        /// Each parameter's δ, as its DCT coefficients.
        pub delta: Vec<Values>,
        /// Each parameter's coefficients sent last.
        pub sent: Vec<SentRecord>,
    }
}

gym_core::record! {
    /// The coefficients a DeMo node sent last for one parameter.
    pub struct SentRecord {
        /// Their values.
        pub values: Values,
        /// Their indices (u32, little-endian).
        pub indices: Bytes,
    }
}

impl DeMo {
    /// The DeMo state of the node `node` describes, as `config` sets it.
    pub fn new(config: &DeMoConfig, node: &NodeInfo<'_>) -> Result<Self> {
        let c = config;
        c.validate()?;
        Ok(DeMo {
            params: DeMo::param_states(node.layout, c.compression_chunk, c.compression_topk),
            dct: Dct::new(),
            workspace: Workspace::default(),
            schedule: c.schedule.init(c.lr, node.max_steps)?,
            steps: 0,
            decay: c.compression_decay as f32,
            weight_decay: c.weight_decay,
            max_norm: c.max_norm,
            lr: c.lr,
        })
    }

    fn param_states(layout: &ParamLayout, chunk: usize, topk: usize) -> Vec<ParamState> {
        layout
            .entries()
            .iter()
            .map(|entry| {
                let (grid, k, width) = wire(&entry.shape, chunk, topk);
                ParamState {
                    offset: entry.offset,
                    grid,
                    k,
                    width,
                    delta: vec![0.0; entry.numel],
                    sent: SparseCoefficients {
                        k,
                        indices: Vec::new(),
                        values: Vec::new(),
                    },
                }
            })
            .collect()
    }

    /// The error-feedback buffer δ of parameter `index` (layout order), row-major.
    pub fn delta(&self, index: usize) -> Vec<f32> {
        let p = &self.params[index];
        p.grid.decode(&mut Dct::new(), &p.delta)
    }

    /// What this node sent for parameter `index` at the last step.
    pub fn last_sent(&self, index: usize) -> &SparseCoefficients {
        &self.params[index].sent
    }

    /// Bytes this node contributes to each step's all-gather: for every parameter,
    /// `chunks · k` indices of its [`IndexWidth`] and as many `f32` values.
    pub fn payload_bytes(&self) -> usize {
        self.params.iter().map(ParamState::payload_bytes).sum()
    }

    /// Steps 2–4: accumulates `lr·grads` into δ, selects every chunk's top-k coefficients,
    /// removes them from δ, and serialises them (per parameter: indices, then values, little
    /// endian).
    ///
    /// δ is kept in the DCT domain: the transform is linear and orthogonal, so
    /// `DCT(β·δ + η·g) = β·DCT(δ) + η·DCT(g)`, and removing what was sent is zeroing those
    /// coefficients — exactly the original's `δ − IDCT(sent)`, up to rounding, for one
    /// transform per step instead of two.
    fn compress(&mut self, grads: &[f32], lr: f32) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.payload_bytes());
        let (lr, decay) = (f64::from(lr), self.decay);
        let ws = &mut self.workspace;
        for p in &mut self.params {
            let numel = p.delta.len();
            ws.coefficients.resize(numel, 0.0);
            let g = &mut ws.coefficients[..numel];
            p.grid
                .encode_into(&mut self.dct, &grads[p.offset..p.offset + numel], g);
            for (d, &g) in p.delta.iter_mut().zip(g.iter()) {
                // torch's `mul_(β).add_(grad, alpha=lr)` rounds `lr·g + β·δ` once (an FMA);
                // the f64 sum of the exact product rounds like it (and vectorises, where
                // `f32::mul_add` without the `fma` target feature is a libm call).
                *d = (lr * f64::from(g) + f64::from(*d * decay)) as f32;
            }
            top_k_per_chunk(&p.delta, p.grid.chunk_len(), &mut ws.keys, &mut p.sent);
            let chunk_len = p.grid.chunk_len();
            for (j, &i) in p.sent.indices.iter().enumerate() {
                p.delta[(j / p.k) * chunk_len + i as usize] = 0.0;
            }
            match p.width {
                IndexWidth::U8 => payload.extend(p.sent.indices.iter().map(|&i| i as u8)),
                IndexWidth::U16 => payload.extend(
                    p.sent
                        .indices
                        .iter()
                        .flat_map(|&i| (i as u16).to_le_bytes()),
                ),
                IndexWidth::U32 => {
                    payload.extend(p.sent.indices.iter().flat_map(|&i| i.to_le_bytes()))
                }
            }
            payload.extend(p.sent.values.iter().flat_map(|v| v.to_le_bytes()));
        }
        payload
    }

    /// Steps 5–6: from every node's payload (rank order), the mean of each coefficient over
    /// the nodes that sent it, decoded, as a flat sign vector in layout order.
    fn aggregate(&mut self, gathered: &[Vec<u8>]) -> Result<Vec<f32>> {
        let expected = self.payload_bytes();
        if let Some(bad) = gathered.iter().find(|b| b.len() != expected) {
            return Err(GymError::InvalidConfig(format!(
                "DeMo: a node sent {} bytes where {expected} were expected; \
                 every node must train the same model",
                bad.len()
            )));
        }
        let total: usize = self.params.iter().map(|p| p.delta.len()).sum();
        let mut direction = vec![0.0; total];
        let mut cursor = 0;
        let ws = &mut self.workspace;
        for p in &self.params {
            let (numel, chunk_len) = (p.delta.len(), p.grid.chunk_len());
            let n = p.grid.num_chunks() * p.k;
            let (index_bytes, value_bytes) = (n * p.width.bytes(), n * 4);
            ws.coefficients.clear();
            ws.coefficients.resize(numel, 0.0);
            ws.count.clear();
            ws.count.resize(numel, 0);
            let (sum, count) = (&mut ws.coefficients[..], &mut ws.count[..]);
            for payload in gathered {
                let indices = &payload[cursor..cursor + index_bytes];
                let values = &payload[cursor + index_bytes..cursor + index_bytes + value_bytes];
                for (j, value) in values.chunks_exact(4).enumerate() {
                    let index = read_index(indices, j, p.width) as usize;
                    if index >= chunk_len {
                        return Err(GymError::InvalidConfig(format!(
                            "DeMo: a node sent coefficient {index} of a chunk of {chunk_len}"
                        )));
                    }
                    let at = (j / p.k) * chunk_len + index;
                    sum[at] += f32::from_le_bytes(value.try_into().expect("4 bytes"));
                    count[at] += 1;
                }
            }
            for (s, &c) in sum.iter_mut().zip(count.iter()) {
                if c > 1 {
                    *s /= c as f32;
                }
            }
            let out = &mut direction[p.offset..p.offset + numel];
            p.grid.decode_into(&mut self.dct, sum, out);
            for g in out {
                *g = sign(*g);
            }
            cursor += index_bytes + value_bytes;
        }
        Ok(direction)
    }
}

/// The flat gradient on the host.
fn host(grads: Tensor<1>) -> Result<Vec<f32>> {
    grads
        .into_data()
        .try_into_vec_as::<f32>()
        .map_err(|e| GymError::InvalidConfig(format!("DeMo: cannot read the gradient: {e:?}")))
}

/// `sign(x)` with `sign(0) = 0` (torch's `sign_`), keeping NaN.
fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_of_zero_is_zero() {
        assert_eq!([sign(2.0), sign(-0.5), sign(0.0)], [1.0, -1.0, 0.0]);
    }
}
/// DeMo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, OwnFlags};
    use clap::Args;
    use serde::Serialize;

    /// DeMo's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct DeMoArgs {
        /// DeMo: decay of the error-feedback buffer, in [0, 1).
        #[arg(long, default_value_t = 0.999)]
        pub compression_decay: f64,
        /// DeMo: DCT coefficients sent per chunk.
        #[arg(long, default_value_t = 32)]
        pub compression_topk: usize,
        /// DeMo: target chunk length per dimension.
        #[arg(long, default_value_t = 64)]
        pub compression_chunk: usize,
    }

    /// DeMo in the registry. It has no inner optimizer: `--optimizer` is not read.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "DeMo: top-k DCT coefficients of a local gradient buffer, sign step (lr: --lr)",
        uses: &[],
        flags: OwnFlags::of::<DeMoArgs>("DeMo"),
        build: |f| {
            let (opt, own) = (f.get::<OptimizerArgs>()?, f.get::<DeMoArgs>()?);
            Ok(Box::new(
                DeMoConfig::new()
                    .with_lr(opt.lr)
                    .with_schedule(opt.schedule())
                    .with_max_norm(opt.max_norm)
                    .with_compression_decay(own.compression_decay)
                    .with_compression_topk(own.compression_topk)
                    .with_compression_chunk(own.compression_chunk)
                    .with_weight_decay(opt.weight_decay.map_or(0.0, f64::from)),
            ))
        },
    };
}
