//! The transport of one process: every rank is a thread, and a call is a meeting point.

use super::host_reduce::{self, HostReduction};
use super::rendezvous::Rendezvous;
use super::{Contribution, Delivery, Exchanged, Header, Transport, check_agreement};
use crate::comm::group::{CollectiveOp, Group, ReduceOp};
use crate::error::CollectiveError;
use burn::tensor::{Device, Tensor, TensorData};
use std::ops::Range;

/// Every rank of the run is a thread of this process.
///
/// A call is a rendezvous: the last member to arrive computes the result, adding the
/// contributions in rank order, so it is bit-identical whatever the thread timing. An
/// all-reduce of large host tensors is shared out over the members' own threads
/// (`host_reduce`). Ranks must run concurrently (one thread each): a call blocks its
/// thread until the whole group has arrived.
pub struct ThreadTransport {
    world_size: usize,
    meetings: Rendezvous<Input, Result<Met, CollectiveError>>,
}

/// What one thread hands in: a contribution, or a host tensor's buffer for a shared-out
/// all-reduce.
enum Input {
    Given(Contribution),
    Host(TensorData, Device),
}

/// A finished call: every member's header and the shared result.
struct Met {
    headers: Vec<Header>,
    outcome: Outcome,
}

enum Outcome {
    None,
    One(Box<Tensor<1>>),
    /// An all-reduce every member helps to finish ([`HostReduction::join`]).
    Reducing(Box<HostReduction>),
    All(Vec<Tensor<1>>),
    Bytes(Vec<u8>),
    AllBytes(Vec<Vec<u8>>),
}

impl ThreadTransport {
    /// The transport of a run of `world_size` ranks, all in this process.
    pub fn new(world_size: usize) -> Self {
        ThreadTransport {
            world_size,
            meetings: Rendezvous::new(world_size),
        }
    }
}

impl Transport for ThreadTransport {
    fn world_size(&self) -> usize {
        self.world_size
    }

    fn local_ranks(&self) -> Range<usize> {
        0..self.world_size
    }

    fn exchange(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
    ) -> Result<Exchanged, CollectiveError> {
        let input = match contribution {
            Contribution::Tensor(t)
                if matches!(header.op, CollectiveOp::AllReduce(_)) && host_reduce::takes(&t) =>
            {
                let t = *t;
                let device = t.device();
                Input::Host(t.into_data(), device)
            }
            other => Input::Given(other),
        };
        let met = self
            .meetings
            .meet(rank, group.members(), header, input, |headers, inputs| {
                check_agreement(group, &headers)?;
                let outcome = combine(header.op, group, inputs);
                Ok(Met { headers, outcome })
            })?;
        let met = match &*met {
            Ok(met) => met,
            Err(e) => return Err(e.clone()),
        };
        let delivery = match &met.outcome {
            Outcome::None => Delivery::None,
            Outcome::One(t) => Delivery::Tensor(t.clone()),
            Outcome::Reducing(job) => Delivery::Tensor(Box::new(job.join())),
            Outcome::All(ts) => Delivery::Tensors(ts.clone()),
            Outcome::Bytes(b) => Delivery::Bytes(b.clone()),
            Outcome::AllBytes(all) => Delivery::AllBytes(all.clone()),
        };
        Ok(Exchanged {
            headers: met.headers.clone(),
            delivery,
        })
    }

    fn abort(&self, rank: usize, reason: String) {
        self.meetings.abort(rank, reason);
    }

    fn abort_info(&self) -> Option<(usize, String)> {
        self.meetings.abort_info()
    }

    fn leave(&self, rank: usize) {
        self.meetings.leave(rank);
    }
}

/// The result of a call from every member's input, in member (rank) order.
fn combine(op: CollectiveOp, group: &Group, inputs: Vec<Input>) -> Outcome {
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
