//! A started call's place on the simulated clock: its transfer starts when its last member
//! is ready and keeps the node's link busy until it ends. Every member's readiness comes in
//! the members' headers, which across processes travel in the background with the call's
//! data, so that a node starting a call does not wait there for the others to arrive. The
//! place is then found when the node next needs it: at its next call, its wait, a
//! checkpoint, the end of its trace; the clock comes out the same as if it had been found at
//! once (the link's end is a maximum, and nothing reads it in between).

use super::{NodeState, lock};
use crate::comm::group::{CollectiveOp, Group};
use crate::comm::pending::{Incoming, TransferTiming};
use crate::comm::trace::CallInfo;
use crate::comm::transport::Header;
use std::sync::{Arc, OnceLock};

/// A timed call, placed on the clock once every member's header is in.
pub(super) struct ClockedCall {
    own_ready_s: f64,
    /// What places it; `None` for a call whose place is known ([`placed`](Self::placed)).
    unplaced: Option<Unplaced>,
    /// The call in the trace (numbered when it was made) and the step it was made in.
    traced: Option<(Arc<CallInfo>, usize)>,
    /// Its place; `None` inside for a call that failed (its wait gives the error).
    placed: OnceLock<Option<TransferTiming>>,
}

/// A made call's members' headers (perhaps still on their way) and its size.
struct Unplaced {
    headers: Incoming<Vec<Header>>,
    op: CollectiveOp,
    group: Group,
    /// One member's payload, bytes, as charged.
    payload: u64,
}

impl ClockedCall {
    /// A call of `op` among `group` made when this node was ready at `own_ready_s`, whose
    /// members' headers are `headers` (perhaps still on their way).
    pub fn new(
        headers: Incoming<Vec<Header>>,
        own_ready_s: f64,
        op: CollectiveOp,
        group: &Group,
        payload: u64,
        traced: Option<(Arc<CallInfo>, usize)>,
    ) -> Self {
        ClockedCall {
            own_ready_s,
            unplaced: Some(Unplaced {
                headers,
                op,
                group: group.clone(),
                payload,
            }),
            traced,
            placed: OnceLock::new(),
        }
    }

    /// A call whose place is known (a wait resumed from a checkpoint).
    pub fn placed(timing: TransferTiming) -> Self {
        ClockedCall {
            own_ready_s: timing.own_ready_s,
            unplaced: None,
            traced: None,
            placed: OnceLock::from(Some(timing)),
        }
    }

    /// Whether its headers are in (the thread transport's are, at once).
    pub fn headers_here(&self) -> bool {
        self.unplaced.as_ref().is_none_or(|u| u.headers.is_here())
    }

    /// The call in the trace, if tracing.
    pub fn info(&self) -> Option<&Arc<CallInfo>> {
        self.traced.as_ref().map(|(call, _)| call)
    }

    /// Its place on `node`'s clock, found (waiting for the headers) the first time: the
    /// node's link is busy until it ends, and the transfer is traced.
    pub fn place(&self, node: &NodeState) -> Option<TransferTiming> {
        *self.placed.get_or_init(|| {
            let call = self.unplaced.as_ref()?;
            let headers = call.headers.get().ok()?;
            let network = node.network.as_ref()?;
            let start_s = headers.iter().map(|h| h.ready_s).fold(0.0, f64::max);
            let end_s = start_s + network.collective_time(call.op, &call.group, call.payload);
            let mut clock = lock(&node.clock);
            clock.occupy_link(end_s);
            if let Some((info, step)) = &self.traced {
                clock.trace_transfer(*step, start_s, end_s, info);
            }
            Some(TransferTiming {
                own_ready_s: self.own_ready_s,
                start_s,
                end_s,
            })
        })
    }
}

impl NodeState {
    /// `call`'s place, once the calls made before it and it are placed (a wait needs it).
    pub(super) fn place_through(&self, call: &Arc<ClockedCall>) -> Option<TransferTiming> {
        self.place_started(Some(call));
        call.place(self)
    }

    /// Places the calls started and not placed yet, in the order they were made: all of
    /// them, or (`upto`) those made before that one and that one.
    pub(super) fn place_started(&self, upto: Option<&Arc<ClockedCall>>) {
        let calls: Vec<Arc<ClockedCall>> = {
            let mut placing = lock(&self.placing);
            let end = match upto {
                None => placing.len(),
                Some(call) => match placing.iter().position(|c| Arc::ptr_eq(c, call)) {
                    Some(at) => at + 1,
                    None => return,
                },
            };
            placing.drain(..end).collect()
        };
        for call in calls {
            call.place(self);
        }
    }
}
