//! What the members of one process make of a call once they have all handed in: the
//! combined result ([`combine`]), shared by every member and delivered to each
//! ([`Met::deliver`]). The thread transport combines whole calls this way; the MPI
//! transport, the calls whose members all run in its process.

use super::host_reduce::{self, HostReduction};
use super::rendezvous::lock;
use super::{Contribution, Delivery, Exchanged, Header, check_agreement};
use crate::comm::group::{CollectiveOp, Group, ReduceOp};
use crate::error::CollectiveError;
use burn::tensor::{Device, Tensor, TensorData};
use std::sync::{Arc, Condvar, Mutex};

/// What one thread hands in: a contribution, or a host tensor's buffer for a shared-out
/// all-reduce.
pub(super) enum Input {
    Given(Contribution),
    Host(TensorData, Device),
}

/// A finished call: every member's header and the shared result.
pub(super) struct Met {
    /// Every member's header; empty for a call whose headers land later with its data
    /// ([`Outcome::Later`], [`Landing::headers`]).
    pub headers: Vec<Header>,
    pub outcome: Outcome,
}

/// The result of a call, shared by the members of one process.
pub(super) enum Outcome {
    None,
    One(Box<Tensor<1>>),
    /// An all-reduce every member helps to finish ([`HostReduction::join`]).
    Reducing(Box<HostReduction>),
    All(Vec<Tensor<1>>),
    Bytes(Vec<u8>),
    AllBytes(Vec<Vec<u8>>),
    /// A call whose headers and data are still moving in the background
    /// (`Transport::start`): they land later.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Later(Arc<Landing>),
}

/// Where a call moving in the background lands its members' headers, then its outcome.
#[derive(Default)]
pub(super) struct Landing {
    landed: Mutex<Landed>,
    arrived: Condvar,
}

#[derive(Default)]
struct Landed {
    headers: Option<Result<Vec<Header>, CollectiveError>>,
    outcome: Option<Result<Outcome, CollectiveError>>,
}

impl Landing {
    /// Every member's header has arrived.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn land_headers(&self, headers: Result<Vec<Header>, CollectiveError>) {
        lock(&self.landed).headers = Some(headers);
        self.arrived.notify_all();
    }

    /// The call's outcome has arrived (and so have the headers: a call that failed before
    /// they arrived gives its error for both).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn land(&self, outcome: Result<Outcome, CollectiveError>) {
        let mut landed = lock(&self.landed);
        if landed.headers.is_none() {
            let failed = outcome.as_ref().err().cloned();
            landed.headers = Some(Err(failed.unwrap_or_else(|| CollectiveError::Transport {
                rank: usize::MAX,
                reason: "a call's outcome landed before its headers".into(),
            })));
        }
        landed.outcome = Some(outcome);
        drop(landed);
        self.arrived.notify_all();
    }

    /// Waits for every member's header.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn headers(&self) -> Result<Vec<Header>, CollectiveError> {
        let mut landed = lock(&self.landed);
        loop {
            if let Some(headers) = &landed.headers {
                return headers.clone();
            }
            landed = self.arrived.wait(landed).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits for the outcome, then hands this member its part.
    fn deliver(&self) -> Result<Delivery, CollectiveError> {
        let mut landed = lock(&self.landed);
        loop {
            match &landed.outcome {
                Some(Ok(outcome)) => return delivery_of(outcome),
                Some(Err(e)) => return Err(e.clone()),
                None => landed = self.arrived.wait(landed).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

impl Input {
    /// What `contribution` to a call of `op` becomes: a host tensor's buffer, for an
    /// all-reduce the members share out ([`host_reduce`]), or the contribution itself.
    pub fn of(op: CollectiveOp, contribution: Contribution) -> Self {
        match contribution {
            Contribution::Tensor(t)
                if matches!(op, CollectiveOp::AllReduce(_)) && host_reduce::takes(&t) =>
            {
                let t = *t;
                let device = t.device();
                Input::Host(t.into_data(), device)
            }
            other => Input::Given(other),
        }
    }
}

/// Checks that the members agree, then combines their inputs ([`combine`]).
pub(super) fn meet(
    group: &Group,
    headers: Vec<Header>,
    inputs: Vec<Input>,
) -> Result<Met, CollectiveError> {
    check_agreement(group, &headers)?;
    let outcome = combine(headers[0].op, group, inputs);
    Ok(Met { headers, outcome })
}

impl Met {
    /// What one member gets of the call: every header, and its copy of the result (its
    /// share of an all-reduce done first).
    pub fn deliver(met: &Result<Met, CollectiveError>) -> Result<Exchanged, CollectiveError> {
        let met = met.as_ref().map_err(Clone::clone)?;
        Ok(Exchanged {
            headers: met.headers.clone(),
            delivery: delivery_of(&met.outcome)?,
        })
    }
}

/// One member's copy of `outcome` (its share of an all-reduce done first; a call moving in
/// the background waited for).
fn delivery_of(outcome: &Outcome) -> Result<Delivery, CollectiveError> {
    Ok(match outcome {
        Outcome::None => Delivery::None,
        Outcome::One(t) => Delivery::Tensor(t.clone()),
        Outcome::Reducing(job) => Delivery::Tensor(Box::new(job.join())),
        Outcome::All(ts) => Delivery::Tensors(ts.clone()),
        Outcome::Bytes(b) => Delivery::Bytes(b.clone()),
        Outcome::AllBytes(all) => Delivery::AllBytes(all.clone()),
        Outcome::Later(landing) => landing.deliver()?,
    })
}

/// The result of a call from every member's input, in member (rank) order.
pub(super) fn combine(op: CollectiveOp, group: &Group, inputs: Vec<Input>) -> Outcome {
    let root_pos = |root: usize| {
        group
            .members()
            .iter()
            .position(|&m| m == root)
            .expect("the root is a member")
    };
    match op {
        CollectiveOp::Barrier | CollectiveOp::Quorum => Outcome::None,
        CollectiveOp::AllReduce(reduce) => {
            if inputs.iter().all(|i| matches!(i, Input::Host(..))) {
                return host_reduction(inputs, reduce);
            }
            let mut tensors = inputs.into_iter().map(into_tensor);
            let first = tensors.next().expect("a non-empty group");
            let device = first.device();
            let sum = tensors.fold(first, |acc, t| acc + t.to_device(&device));
            Outcome::One(Box::new(match reduce {
                ReduceOp::Sum => sum,
                ReduceOp::Mean => sum.div_scalar(group.size() as f64),
            }))
        }
        CollectiveOp::Broadcast { root } => {
            let root_input = inputs.into_iter().nth(root_pos(root));
            Outcome::One(Box::new(into_tensor(root_input.expect("the root's input"))))
        }
        CollectiveOp::AllGather => Outcome::All(inputs.into_iter().map(into_tensor).collect()),
        CollectiveOp::AllGatherBytes => {
            Outcome::AllBytes(inputs.into_iter().map(into_bytes).collect())
        }
        CollectiveOp::BroadcastBytes { root } => {
            let root_input = inputs.into_iter().nth(root_pos(root));
            Outcome::Bytes(into_bytes(root_input.expect("the root's input")))
        }
    }
}

fn into_tensor(input: Input) -> Tensor<1> {
    match input {
        Input::Given(Contribution::Tensor(t)) => *t,
        // A host buffer among tensors (members on different devices): back to a tensor.
        Input::Host(data, device) => Tensor::from_data(data, &device),
        _ => unreachable!("the header check keeps the kinds of contribution apart"),
    }
}

fn into_bytes(input: Input) -> Vec<u8> {
    match input {
        Input::Given(Contribution::Bytes(b)) => b,
        _ => unreachable!("the header check keeps the kinds of contribution apart"),
    }
}

/// The all-reduce of every member's host buffer, finished by the members themselves, each
/// in [`HostReduction::join`], on the first member's device.
fn host_reduction(inputs: Vec<Input>, op: ReduceOp) -> Outcome {
    let mut device = None;
    let buffers = inputs
        .into_iter()
        .map(|input| match input {
            Input::Host(data, d) => {
                device.get_or_insert(d);
                data
            }
            Input::Given(_) => unreachable!("every input is a host buffer"),
        })
        .collect();
    let device = device.expect("a non-empty group");
    Outcome::Reducing(Box::new(HostReduction::new(buffers, op, device)))
}
