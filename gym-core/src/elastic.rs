//! Nodes that come and go (a [`FaultTimeline`](crate::faults::FaultTimeline)): what a node
//! does when it leaves and rejoins, and the ledger of work lost that the run reports.

use crate::collective::{Group, NodeCollective};
use crate::error::{GymError, Result};
use crate::faults::{Fault, Rejoin};
use crate::model::TrainModel;
use crate::params::ParamLayout;
use crate::replica::ModelReplica;
use crate::state::StateDict;
use crate::strategy::{RejoinPolicy, Strategy};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// One node's account of the work the faults cost it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeLedger {
    /// Steps the node was away.
    pub absent_steps: u64,
    /// Steps the node computed whose work was dropped (it left before merging it, or it
    /// was late for a quorum).
    pub discarded_steps: u64,
    /// Simulated compute seconds of those steps.
    pub discarded_compute_s: f64,
    /// Times the node came back.
    pub rejoins: u64,
    /// Simulated seconds its returns took (receiving a peer's state).
    pub recovery_s: f64,
    /// Steps computed since the strategy last had all of them merged, and their compute.
    pending_steps: u64,
    pending_compute_s: f64,
}

impl NodeLedger {
    /// After a step the node computed in `compute_s` simulated seconds (0 if untimed), of
    /// which its strategy's step took `undone_s` back (a round closed without it).
    pub fn computed(&mut self, strategy: &mut dyn Strategy, compute_s: f64, undone_s: f64) {
        self.pending_steps += 1;
        self.pending_compute_s += compute_s - undone_s;
        if strategy.take_discarded() {
            self.discard();
        } else if strategy.committed() {
            self.pending_steps = 0;
            self.pending_compute_s = 0.0;
        }
    }

    /// The unmerged work is lost (the node leaves, or takes a peer's state over its own).
    pub fn discard(&mut self) {
        self.discarded_steps += self.pending_steps;
        self.discarded_compute_s += self.pending_compute_s;
        self.pending_steps = 0;
        self.pending_compute_s = 0.0;
    }

    /// Adds another node's account to this one.
    pub fn merge(&mut self, other: &NodeLedger) {
        self.absent_steps += other.absent_steps;
        self.discarded_steps += other.discarded_steps;
        self.discarded_compute_s += other.discarded_compute_s;
        self.rejoins += other.rejoins;
        self.recovery_s += other.recovery_s;
    }
}

/// What a peer sends a node that rejoins.
#[derive(Serialize, Deserialize)]
struct PeerState {
    /// Every float tensor of the peer's model, flat.
    model: Vec<f32>,
    /// The peer's strategy state.
    strategy: StateDict,
}

/// Takes part in `rejoin` as its source or as one of the nodes coming back: the nodes
/// coming back first catch up with the source's simulated clock (the time between counts as
/// away), then, if the strategy asks for it, receive the source's model and strategy state
/// through `comm` (counted and timed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rejoin<M: TrainModel, C: NodeCollective>(
    rank: usize,
    rejoin: &Rejoin,
    replica: &mut ModelReplica<M>,
    strategy: &mut dyn Strategy,
    ledger: &mut NodeLedger,
    comm: &C,
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
        let mut state = StateDict::new();
        strategy.save_state(&mut state)?;
        let peer = PeerState {
            model: ParamLayout::all_float(model)
                .flatten(model)
                .into_data()
                .try_into_vec::<f32>()
                .map_err(|e| GymError::Data(format!("model values: {e:?}")))?,
            strategy: state,
        };
        rmp_serde::to_vec(&peer)
            .map_err(|e| GymError::Data(format!("cannot encode a node's state: {e}")))?
    };
    let before = comm.simulated_time().map_or(0.0, |t| t.now_s);
    let received = comm.broadcast_bytes_in(&group, sent, source)?;
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

/// What the faults of a run cost: the timeline in effect and every node's ledger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticReport {
    /// The faults in effect, scheduled and drawn, as the run resolved them.
    pub faults: Vec<Fault>,
    /// Per node, by rank: its ledger.
    pub nodes: Vec<NodeLedger>,
}

impl ElasticReport {
    /// Every node's ledger added up.
    pub fn total(&self) -> NodeLedger {
        let mut total = NodeLedger::default();
        for node in &self.nodes {
            total.merge(node);
        }
        total
    }

    /// Node-steps that did not go into the model: steps nodes were away, plus steps they
    /// computed whose work was dropped.
    pub fn node_steps_lost(&self) -> u64 {
        let t = self.total();
        t.absent_steps + t.discarded_steps
    }
}
