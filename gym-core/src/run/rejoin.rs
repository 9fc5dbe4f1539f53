//! A node that comes back after a fault (a leave, or the far side of a healed cut):
//! it catches up with the simulated clock and, if its strategy asks, takes a present
//! peer's state.

use crate::comm::faults::Rejoin;
use crate::comm::{Collective, Group};
use crate::error::{GymError, Result};
use crate::metrics::ledger::NodeLedger;
use crate::model::TrainModel;
use crate::state::params::ParamLayout;
use crate::state::record::StateDict;
use crate::strategy::replica::ModelReplica;
use crate::strategy::{RejoinPolicy, Strategy};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// What a peer sends a node that rejoins.
#[derive(Deserialize)]
struct PeerState {
    /// Every float tensor of the peer's model, flat.
    model: Vec<f32>,
    /// The peer's strategy state.
    strategy: StateDict,
}

/// [`PeerState`] as it is written, borrowing what it sends (the same encoding).
#[derive(Serialize)]
struct PeerStateRef<'a> {
    model: &'a [f32],
    strategy: &'a StateDict,
}

/// The bytes a rejoin's source sends: its model's float values (every float tensor, flat)
/// and its strategy's state, encoded.
fn encode_peer_state(model: &[f32], strategy: &StateDict) -> Result<Vec<u8>> {
    rmp_serde::to_vec(&PeerStateRef { model, strategy })
        .map_err(|e| GymError::Data(format!("cannot encode a node's state: {e}")))
}

/// The byte size of the state a node sends one that rejoins under
/// [`RejoinPolicy::FromPeer`]: `model` (every float tensor of its model, flat, as a
/// [`NodeCheckpoint`](crate::checkpoint::NodeCheckpoint)'s `model`) and `strategy` (what
/// its [`Strategy::save_state`] wrote), encoded exactly as training encodes them. The
/// payload a [`plan`](crate::planner::plan) charges for a rejoin
/// ([`RejoinBytes`](crate::planner::RejoinBytes)).
///
/// The size is not a function of the parameter count alone: optimizers create their
/// moments at their first step, and the encoding writes small counters in fewer bytes.
pub fn peer_state_bytes(model: &[f32], strategy: &StateDict) -> Result<u64> {
    Ok(encode_peer_state(model, strategy)?.len() as u64)
}

/// Takes part in `rejoin` as its source or as one of the nodes coming back: the nodes
/// coming back first catch up with the source's simulated clock (the time between counts as
/// away), then, if the strategy asks for it, receive the source's model and strategy state
/// through `comm` (counted and timed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rejoin<M: TrainModel>(
    rank: usize,
    rejoin: &Rejoin,
    replica: &mut ModelReplica<M>,
    strategy: &mut dyn Strategy,
    ledger: &mut NodeLedger,
    comm: &Collective,
    device: &Device,
) -> Result<()> {
    let Some(source) = rejoin.source else {
        // Everyone in this part of the cluster comes back at once: nobody to copy from.
        if rejoin.ranks.contains(&rank) {
            ledger.rejoins += 1;
        }
        return Ok(());
    };
    let group = Group::new(rejoin.ranks.iter().copied().chain([source]));
    let returning = rank != source;
    // The time the source has reached, through the uncounted observer (a real node would
    // read a wall clock).
    let now = comm.simulated_time().map_or(0.0, |t| t.now_s);
    let clocks = comm
        .observer()
        .all_gather_bytes_in(&group, now.to_le_bytes().to_vec())?;
    let source_pos = group.members().iter().position(|&m| m == source);
    let source_now = source_pos
        .and_then(|p| clocks[p].as_slice().try_into().ok())
        .map_or(0.0, f64::from_le_bytes);
    if returning {
        comm.away_until(source_now);
        ledger.rejoins += 1;
    }
    if strategy.rejoin_policy() == RejoinPolicy::Stale {
        return Ok(());
    }
    let sent = if returning {
        Vec::new()
    } else {
        let model = replica.model();
        let state = strategy.save_state()?;
        let values = ParamLayout::all_float(model)
            .flatten(model)
            .into_data()
            .try_into_vec::<f32>()
            .map_err(|e| GymError::Data(format!("model values: {e:?}")))?;
        encode_peer_state(&values, &state)?
    };
    let before = comm.simulated_time().map_or(0.0, |t| t.now_s);
    let received = comm
        .with_purpose("rejoin")
        .broadcast_bytes_in(&group, sent, source)?;
    if !returning {
        return Ok(());
    }
    let peer: PeerState = rmp_serde::from_slice(&received)
        .map_err(|e| GymError::Data(format!("a peer's state does not decode: {e}")))?;
    // Work the node did on the far side of a cut is replaced by the peer's.
    ledger.discard();
    let all_float = ParamLayout::all_float(replica.model());
    if peer.model.len() != all_float.num_elements() {
        return Err(GymError::Data(format!(
            "a peer's model holds {} values where this node's has {}",
            peer.model.len(),
            all_float.num_elements()
        )));
    }
    let len = peer.model.len();
    let values = Tensor::from_data(TensorData::new(peer.model, [len]), &device.clone().inner());
    replica.map_model(|model| all_float.load(model, values));
    strategy.load_state(&peer.strategy)?;
    strategy.rejoined(replica)?;
    ledger.recovery_s += comm.simulated_time().map_or(0.0, |t| t.now_s) - before;
    Ok(())
}
