//! A compressed mean as sizes, for a plan ([`gym_core::planner`]): the calls each mean of
//! the whole model makes, call after call, as the compressors of
//! [`CompressionConfig::init`] make them in training.

use super::{CompressionConfig, Route};
use gym_core::comm::CollectiveOp;
use gym_core::planner::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups};
use gym_core::{GymError, ReduceOp, Result};

/// The calls of successive means of the whole model (a gradient, a pseudo-gradient, the
/// parameters) through one compressor: built by [`CompressionConfig::planned_means`],
/// stepped once per mean by [`push`](Self::push).
#[derive(Debug, Clone)]
pub struct PlannedMeans {
    /// The one call of an exact or codec mean, and PowerSGD's exact mean before it starts
    /// compressing.
    one: (CollectiveOp, u64),
    /// PowerSGD's calls once it compresses, and the mean it starts compressing at.
    powersgd: Option<(Vec<(CollectiveOp, u64)>, u64)>,
    /// Means made so far (PowerSGD's `start_step` counts them, as its compressor does).
    made: u64,
}

impl PlannedMeans {
    /// Appends the next mean over `groups` to `events`: one call, or PowerSGD's calls, each
    /// waited for at once (its compressor blocks in every call), in order.
    pub fn push(&mut self, groups: &PlannedGroups, events: &mut Vec<PlannedEvent>) {
        let call = |(op, payload): (CollectiveOp, u64)| {
            PlannedEvent::Call(PlannedCall {
                op,
                groups: groups.clone(),
                payload,
            })
        };
        let made = self.made;
        self.made += 1;
        match &self.powersgd {
            Some((calls, start)) if made >= *start => events.extend(calls.iter().map(|&c| call(c))),
            _ => events.push(call(self.one)),
        }
    }
}

impl CompressionConfig {
    /// The means of the whole model (`info.params` f32 values) this compression makes, as
    /// sizes, for a plan: the exact mean is one all-reduce of `4n` bytes; bf16's a ring
    /// all-reduce of `2n`; a codec's all-gathers each member's code
    /// ([`Codec::encoded_len`](super::Codec::encoded_len)); PowerSGD's makes up to three
    /// all-reduces sized by each weight matrix's factors
    /// ([`PowerSgdCompressionConfig::planned_calls`](super::PowerSgdCompressionConfig::planned_calls)),
    /// so it needs the parameters' shapes ([`PlanInfo::shapes`]) and is refused
    /// ([`GymError::PlanNeedsShapes`]) without.
    pub fn planned_means(&self, info: &PlanInfo<'_>) -> Result<PlannedMeans> {
        self.validate()?;
        let n = info.params;
        if let CompressionConfig::PowerSgd(p) = self {
            let shapes = info.shapes.ok_or(GymError::PlanNeedsShapes {
                strategy: "PowerSGD compression".into(),
                why: "its rank-r factors follow each weight matrix's shape",
            })?;
            return Ok(PlannedMeans {
                one: (CollectiveOp::AllReduce(ReduceOp::Mean), 4 * n),
                powersgd: Some((p.planned_calls(shapes), p.start_step as u64)),
                made: 0,
            });
        }
        Ok(PlannedMeans {
            one: self.planned_mean(n)?,
            powersgd: None,
            made: 0,
        })
    }

    /// The one call a mean of `n` f32 values over a group makes, as sizes, for a plan of a
    /// mean that is not of the whole model (a fragment) or that must be one call (a
    /// quorum's): see [`planned_means`](Self::planned_means). PowerSGD, which compresses
    /// whole parameters in up to three dependent calls, is refused.
    pub fn planned_mean(&self, n: u64) -> Result<(CollectiveOp, u64)> {
        self.validate()?;
        let all_reduce = CollectiveOp::AllReduce(ReduceOp::Mean);
        match self.route() {
            Route::Exact => Ok((all_reduce, 4 * n)),
            Route::Bf16Ring => Ok((all_reduce, 2 * n)),
            Route::Gather(codec) => Ok((
                CollectiveOp::AllGatherBytes,
                codec.encoded_len(n as usize) as u64,
            )),
            Route::PowerSgd => Err(GymError::InvalidConfig(
                "PowerSGD compression cannot be planned as one call: it compresses whole \
                 parameters (a mean of the whole model, with the parameters' shapes)"
                    .into(),
            )),
        }
    }
}
