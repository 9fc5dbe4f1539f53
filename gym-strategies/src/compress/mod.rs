//! Compression of what the nodes average: codecs (quantizers and sparsifiers, with error
//! feedback) and PowerSGD, usable by any averaging strategy (AllReduce's gradient, DiLoCo's
//! outer gradient, FedAvg's parameters) through one trait, [`Compressor`].
//!
//! Bytes are counted by the collective, as for every strategy: a codec's packed buffer is
//! what travels ([`Collective::all_gather_bytes_in`](gym_core::Collective::all_gather_bytes_in)),
//! so its byte count is [`Codec::encoded_len`] per node and peer; PowerSGD's factors travel
//! as f32 all-reduces.
//!
//! # Why an all-gather for codecs
//!
//! A lossy code with a per-node scale cannot be summed as codes: a sum all-reduce needs
//! every node to share the scale. So each node's code is gathered, decoded and summed in
//! rank order (route (a) of the reference), which adds no re-quantization error; a ring
//! all-reduce of re-encoded partial sums would send less at large K but adds an error per
//! hop.

mod bits;
pub mod codec;
mod formats;
mod planned;
pub mod powersgd;
mod quantizer;

pub use codec::{Codec, ErrorFeedback};
pub use quantizer::Quantizer;

pub use planned::PlannedMeans;
pub use powersgd::{PowerSgdCompressionConfig, PowerSgdCompressor};

use burn::tensor::{Tensor, TensorData};
use gym_core::rng::derive_seed;
use gym_core::state::fields::{Record, Values};
use gym_core::{Group, GymError, NodeInfo, Pending, ReduceOp, Result, StateDict, StepContext};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a strategy averages a vector over the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub enum CompressionConfig {
    /// Exact: one ring all-reduce of the f32 values.
    #[default]
    None,
    /// Through a codec: each node encodes its vector (plus its error-feedback residual when
    /// `error_feedback` holds the residual's decay), the packed codes are all-gathered, and
    /// every node decodes them and takes their mean in rank order.
    Codec {
        /// The wire format.
        codec: Codec,
        /// Error feedback's residual decay (1: classic), or none.
        error_feedback: Option<f32>,
        /// How the decoded codes are averaged.
        #[serde(default)]
        aggregation: Aggregation,
    },
    /// PowerSGD's rank-r factors (Vogels et al., 2019), with warm start and error feedback.
    PowerSgd(PowerSgdCompressionConfig),
}

impl CompressionConfig {
    /// A codec with classic error feedback (decay 1).
    pub fn with_error_feedback(codec: Codec) -> Self {
        CompressionConfig::Codec {
            codec,
            error_feedback: Some(1.0),
            aggregation: Aggregation::MeanOverNodes,
        }
    }

    /// A codec without error feedback.
    pub fn codec(codec: Codec) -> Self {
        CompressionConfig::Codec {
            codec,
            error_feedback: None,
            aggregation: Aggregation::MeanOverNodes,
        }
    }

    /// Refuses settings it cannot run with, naming them.
    pub fn validate(&self) -> Result<()> {
        match self {
            CompressionConfig::None => Ok(()),
            CompressionConfig::Codec {
                codec,
                error_feedback,
                ..
            } => {
                codec.validate()?;
                match error_feedback {
                    Some(d) if !(d.is_finite() && (0.0..=1.0).contains(d)) => {
                        Err(GymError::InvalidConfig(format!(
                            "compression: `error_feedback` decay must be in [0, 1], got {d}"
                        )))
                    }
                    _ => Ok(()),
                }
            }
            CompressionConfig::PowerSgd(p) => p.validate(),
        }
    }

    /// The compressor of one node (`stream` tells apart several compressors of one node,
    /// e.g. one per fragment, so their random draws differ).
    pub fn init(&self, node: &NodeInfo<'_>, stream: u64) -> Result<Box<dyn Compressor>> {
        self.validate()?;
        let error_feedback = match *self {
            CompressionConfig::Codec { error_feedback, .. } => error_feedback,
            _ => None,
        };
        Ok(match (self.route(), *self) {
            (Route::Exact, _) => Box::new(Exact),
            (Route::Bf16Ring, _) => Box::new(Bf16Ring {
                feedback: error_feedback.map(ErrorFeedback::new),
            }),
            (
                _,
                CompressionConfig::Codec {
                    codec,
                    error_feedback,
                    aggregation,
                },
            ) => Box::new(CodecCompressor {
                codec,
                aggregation,
                feedback: error_feedback.map(ErrorFeedback::new),
                seed: derive_seed(node.seed, &[0xC0DE_C0DE, stream]),
                rank: node.rank as u64,
                calls: 0,
            }),
            (_, CompressionConfig::PowerSgd(p)) => Box::new(p.init(node, stream)?),
            (_, CompressionConfig::None) => unreachable!("the exact mean's route"),
        })
    }

    /// How a mean travels (what [`init`](Self::init) builds and
    /// [`planned_mean`](Self::planned_mean) charges): f32 and bf16 values sum exactly in
    /// their format, so they go round a ring all-reduce, which sends less than a gather of
    /// their codes; every other codec is gathered.
    fn route(&self) -> Route {
        match *self {
            CompressionConfig::None => Route::Exact,
            CompressionConfig::Codec {
                codec: Codec::Dense(Quantizer::F32),
                ..
            } => Route::Exact,
            CompressionConfig::Codec {
                codec: Codec::Dense(Quantizer::Bf16),
                ..
            } => Route::Bf16Ring,
            CompressionConfig::Codec { codec, .. } => Route::Gather(codec),
            CompressionConfig::PowerSgd(_) => Route::PowerSgd,
        }
    }
}

/// How a mean travels ([`CompressionConfig::route`]).
enum Route {
    /// An f32 ring all-reduce.
    Exact,
    /// A bf16 ring all-reduce.
    Bf16Ring,
    /// An all-gather of each member's code.
    Gather(Codec),
    /// PowerSGD's low-rank factors.
    PowerSgd,
}

/// The `bf16` codec's mean: a bf16 ring all-reduce
/// ([`Collective::all_reduce_bf16_start_in`](gym_core::Collective::all_reduce_bf16_start_in)),
/// after error feedback if asked for (the residual keeps what rounding to bf16 dropped).
struct Bf16Ring {
    feedback: Option<ErrorFeedback>,
}

impl Compressor for Bf16Ring {
    fn start_mean(
        &mut self,
        group: &Group,
        x: Tensor<1>,
        ctx: &StepContext<'_>,
    ) -> Result<PendingMean> {
        let x = match &mut self.feedback {
            None => x,
            Some(ef) => {
                let device = x.device();
                let values = to_host(x)?;
                let codec = Codec::Dense(Quantizer::Bf16);
                let code = ef.encode(&codec, &values, 0)?;
                let sent = codec.decode(&code, values.len(), 0)?;
                Tensor::from_data(TensorData::new(sent, [values.len()]), &device)
            }
        };
        Ok(ctx
            .collective
            .all_reduce_bf16_start_in(group, x, ReduceOp::Mean)?
            .map(Ok))
    }

    fn save_state(&self) -> Result<StateDict> {
        CodecRecord::of(0, &self.feedback).to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        CodecRecord::from_state(state)?.restore(state, &mut self.feedback)?;
        Ok(())
    }
}

/// `none`, a codec spec (`bf16`, `int8`, `fp8`, `fp4`, `2bit`, `topk:64/4096+2bit`,
/// `randomk:0.01`; see [`Codec`]), optionally followed by `,ef` (error feedback, decay 1) or
/// `,ef=DECAY`, and by `,senders` ([`Aggregation::MeanOverSenders`]); or `powersgd:RANK`.
impl FromStr for CompressionConfig {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("none") {
            return Ok(CompressionConfig::None);
        }
        if let Some(rank) = s.strip_prefix("powersgd") {
            let rank = match rank.strip_prefix(':') {
                Some(r) => r
                    .parse::<usize>()
                    .map_err(|_| format!("`{s}`: PowerSGD's rank must be a whole number"))?,
                None if rank.is_empty() => PowerSgdCompressionConfig::new().rank,
                None => return Err(format!("`{s}`: expected powersgd or powersgd:RANK")),
            };
            return Ok(CompressionConfig::PowerSgd(
                PowerSgdCompressionConfig::new().with_rank(rank),
            ));
        }
        let mut words = s.split(',');
        let codec = words.next().unwrap_or_default().parse()?;
        let (mut error_feedback, mut aggregation) = (None, Aggregation::MeanOverNodes);
        for word in words.map(str::trim) {
            match word {
                "ef" => error_feedback = Some(1.0),
                "senders" => aggregation = Aggregation::MeanOverSenders,
                other => match other.strip_prefix("ef=") {
                    Some(d) => {
                        error_feedback = Some(
                            d.parse::<f32>()
                                .map_err(|_| format!("`{other}`: expected ef=DECAY"))?,
                        )
                    }
                    None => {
                        return Err(format!(
                            "`{other}`: after the codec, expected ef, ef=DECAY or senders"
                        ));
                    }
                },
            }
        }
        let config = CompressionConfig::Codec {
            codec,
            error_feedback,
            aggregation,
        };
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

impl fmt::Display for CompressionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompressionConfig::None => write!(f, "none"),
            CompressionConfig::Codec {
                codec,
                error_feedback,
                aggregation,
            } => {
                write!(f, "{codec}")?;
                match error_feedback {
                    Some(d) if *d == 1.0 => write!(f, ",ef")?,
                    Some(d) => write!(f, ",ef={d}")?,
                    None => {}
                }
                match aggregation {
                    Aggregation::MeanOverSenders => write!(f, ",senders"),
                    Aggregation::MeanOverNodes => Ok(()),
                }
            }
            CompressionConfig::PowerSgd(p) => write!(f, "powersgd:{}", p.rank),
        }
    }
}

/// How a codec's decoded contributions become the mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Aggregation {
    /// Sum over the nodes, divided by their number: a position a node did not send counts
    /// as 0 from it.
    #[default]
    MeanOverNodes,
    /// Per position, the mean over the nodes that sent it (0 where none did): SparseLoCo's
    /// and DeMo's reference code (`scatter_reduce` with `mean`), which keeps a value one
    /// node alone selected at full size.
    MeanOverSenders,
}

/// A mean whose transfer may still be on the link: [`Pending::wait`] it, then unwrap the
/// decoding's result.
pub type PendingMean = Pending<Result<Tensor<1>>>;

/// One node's side of a compressed mean over a group.
pub trait Compressor: Send {
    /// Starts averaging `x` over `group` (every member calls it with a vector of the same
    /// length); the transfer overlaps with whatever the node computes before waiting.
    fn start_mean(
        &mut self,
        group: &Group,
        x: Tensor<1>,
        ctx: &StepContext<'_>,
    ) -> Result<PendingMean>;

    /// Averages `x` over `group` and waits for the result.
    fn mean(&mut self, group: &Group, x: Tensor<1>, ctx: &StepContext<'_>) -> Result<Tensor<1>> {
        self.start_mean(group, x, ctx)?.wait()?
    }

    /// The compressor's state (residuals, counters, warm-start factors), for a checkpoint;
    /// a stateless compressor's is empty.
    fn save_state(&self) -> Result<StateDict>;

    /// Restores what [`save_state`](Self::save_state) wrote.
    fn load_state(&mut self, state: &StateDict) -> Result<()>;
}

/// The exact mean: one ring all-reduce.
struct Exact;

impl Compressor for Exact {
    fn start_mean(
        &mut self,
        group: &Group,
        x: Tensor<1>,
        ctx: &StepContext<'_>,
    ) -> Result<PendingMean> {
        Ok(ctx
            .collective
            .all_reduce_start_in(group, x, ReduceOp::Mean)?
            .map(Ok))
    }

    /// Waited for at once: the call is made so (a transport may then move the data on the
    /// calling thread rather than hand it to a background one).
    fn mean(&mut self, group: &Group, x: Tensor<1>, ctx: &StepContext<'_>) -> Result<Tensor<1>> {
        Ok(ctx.collective.all_reduce_in(group, x, ReduceOp::Mean)?)
    }

    fn save_state(&self) -> Result<StateDict> {
        Ok(StateDict::new())
    }

    fn load_state(&mut self, _state: &StateDict) -> Result<()> {
        Ok(())
    }
}

/// A codec's mean: encode (with error feedback), all-gather the codes, decode, average.
struct CodecCompressor {
    codec: Codec,
    aggregation: Aggregation,
    feedback: Option<ErrorFeedback>,
    seed: u64,
    /// The node's rank: its stochastic rounding (QSGD) draws from a stream of its own.
    rank: u64,
    calls: u64,
}

impl Compressor for CodecCompressor {
    fn start_mean(
        &mut self,
        group: &Group,
        x: Tensor<1>,
        ctx: &StepContext<'_>,
    ) -> Result<PendingMean> {
        let device = x.device();
        let values = to_host(x)?;
        let n = values.len();
        // The same seed on every node for the same call: random-k draws the same positions.
        let seed = derive_seed(self.seed, &[self.calls]);
        // Each node's own stream for stochastic rounding, so that rounding errors average out.
        let rounding = derive_seed(seed, &[self.rank]);
        self.calls += 1;
        let code = match &mut self.feedback {
            Some(ef) => ef.encode_with(&self.codec, &values, seed, rounding)?,
            None => self.codec.encode_with(&values, seed, rounding),
        };
        let (codec, aggregation) = (self.codec, self.aggregation);
        let pending = ctx.collective.all_gather_bytes_start_in(group, code)?;
        Ok(pending.map(move |codes| {
            let mut sum = vec![0.0f32; n];
            // Rank order, as the exact all-reduce adds.
            match aggregation {
                Aggregation::MeanOverNodes => {
                    for code in &codes {
                        for (s, v) in sum.iter_mut().zip(codec.decode(code, n, seed)?) {
                            *s += v;
                        }
                    }
                    let k = codes.len() as f32;
                    sum.iter_mut().for_each(|s| *s /= k);
                }
                Aggregation::MeanOverSenders => {
                    let mut senders = vec![0u32; n];
                    for code in &codes {
                        let (positions, values) = codec.decode_support(code, n, seed)?;
                        for (p, v) in positions.into_iter().zip(values) {
                            sum[p] += v;
                            senders[p] += 1;
                        }
                    }
                    for (s, &c) in sum.iter_mut().zip(&senders) {
                        if c > 0 {
                            *s /= c as f32;
                        }
                    }
                }
            }
            Ok(Tensor::from_data(TensorData::new(sum, [n]), &device))
        }))
    }

    fn save_state(&self) -> Result<StateDict> {
        CodecRecord::of(self.calls, &self.feedback).to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        self.calls = CodecRecord::from_state(state)?.restore(state, &mut self.feedback)?;
        Ok(())
    }
}

gym_core::record! {
    /// What a codec's mean carries between calls.
    struct CodecRecord {
        /// Calls so far (random-k's draws follow them).
        calls: u64,
        /// The error-feedback residual, with error feedback.
        residual: Option<Values>,
    }
}

impl CodecRecord {
    /// The record of a codec that made `calls` calls with `feedback`.
    fn of(calls: u64, feedback: &Option<ErrorFeedback>) -> Self {
        CodecRecord {
            calls,
            residual: feedback
                .as_ref()
                .map(|ef| Values::from(ef.residual.clone())),
        }
    }

    /// Puts the residual back into `feedback` (read from `state`, for the error naming a
    /// missing one) and returns the calls.
    fn restore(self, state: &StateDict, feedback: &mut Option<ErrorFeedback>) -> Result<u64> {
        if let Some(ef) = feedback {
            ef.residual = match self.residual {
                Some(residual) => residual.into_vec(),
                None => return Err(missing(state, "residual")),
            };
        }
        Ok(self.calls)
    }
}

/// The error of a saved state that lacks `key`, as a missing field's.
pub(crate) fn missing(state: &StateDict, key: &str) -> GymError {
    GymError::Checkpoint(format!(
        "no `{}` in the saved state: it comes from another strategy or configuration",
        state.path(key)
    ))
}

/// A flat tensor's values on the host.
pub(crate) fn to_host(x: Tensor<1>) -> Result<Vec<f32>> {
    x.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| GymError::Data(format!("tensor values: {e:?}")))
}
