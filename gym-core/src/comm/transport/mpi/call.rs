//! One call across processes, in its two phases: the members' headers (which every member
//! needs before the call returns), then the data (which may move in the background).

use super::super::combine::{Input, Outcome};
use super::super::{Contribution, Header, check_agreement};
use super::collectives;
use super::p2p::{Peers, Tag};
use crate::comm::group::{CollectiveOp, Group};
use crate::error::CollectiveError;
use burn::tensor::{DType, Device, Tensor, TensorData};

/// What this process knows of a call once the headers are in.
pub(super) struct Call {
    /// Every member's header, in member order (checked to agree).
    pub headers: Vec<Header>,
    /// How many members each process of the group holds, by position.
    pub members: Vec<usize>,
    /// The position of the broadcast root's process, for a broadcast.
    pub root: Option<usize>,
}

/// Exchanges the headers of this process's members (`mine`) with the group's other
/// processes and checks that they agree.
pub(super) fn headers(
    peers: &Peers<'_>,
    group: &Group,
    mine: &[Header],
    members: Vec<usize>,
    process_of: impl Fn(usize) -> usize,
) -> Result<Call, CollectiveError> {
    let headers = collectives::headers(peers, mine, &members);
    check_agreement(group, &headers)?;
    let root = match headers[0].op {
        CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } => Some(
            peers
                .processes
                .iter()
                .position(|&p| p == process_of(root))
                .expect("the root is a member"),
        ),
        _ => None,
    };
    Ok(Call {
        headers,
        members,
        root,
    })
}

/// Moves the call's data: `local` are this process's members, `inputs` their contributions.
pub(super) fn data(
    peers: &Peers<'_>,
    call: &Call,
    group: &Group,
    local: &[usize],
    inputs: Vec<Input>,
    scratch: &mut Vec<f32>,
) -> Result<Outcome, CollectiveError> {
    let me = local[0];
    let op = call.headers[0].op;
    let n = call.headers[0].len as usize;
    let members = &call.members;
    let device = inputs.iter().find_map(|input| match input {
        Input::Given(Contribution::Tensor(t)) => Some(t.device()),
        Input::Host(_, device) => Some(device.clone()),
        _ => None,
    });
    let outcome = match op {
        // The header exchange is itself a barrier.
        CollectiveOp::Barrier | CollectiveOp::Quorum => Outcome::None,
        CollectiveOp::AllReduce(reduce) => {
            let mine = host_values(me, inputs)?;
            let sum = collectives::all_reduce(peers, &mine, n, members, reduce, scratch);
            Outcome::One(Box::new(tensor_on(sum, &device.expect("tensors in"))))
        }
        CollectiveOp::Broadcast { root } => {
            let mut values = match root_input(local, root, inputs) {
                Some(t) => host_values(me, vec![t])?,
                None => vec![0f32; n],
            };
            collectives::broadcast(peers, call.root.expect("a root"), &mut values);
            Outcome::One(Box::new(tensor_on(values, &device.expect("tensors in"))))
        }
        CollectiveOp::AllGather => {
            let mine = host_values(me, inputs)?;
            let all = collectives::all_gather(peers, &mine, n, members, Tag::Data);
            let device = device.expect("tensors in");
            let tensors = (0..group.size())
                .map(|i| tensor_on(all[i * n..(i + 1) * n].to_vec(), &device))
                .collect();
            Outcome::All(tensors)
        }
        CollectiveOp::AllGatherBytes => {
            let mine: Vec<u8> = inputs.into_iter().flat_map(bytes_of).collect();
            let all = collectives::all_gather(peers, &mine, n, members, Tag::Data);
            Outcome::AllBytes(split(&all, n, group.size()))
        }
        CollectiveOp::BroadcastBytes { root } => {
            let pos = group.members().iter().position(|&m| m == root);
            let len = pos.map_or(0, |p| call.headers[p].len as usize);
            let mut buffer = match root_input(local, root, inputs) {
                Some(Input::Given(Contribution::Bytes(b))) => b,
                _ => vec![0u8; len],
            };
            collectives::broadcast(peers, call.root.expect("a root"), &mut buffer);
            Outcome::Bytes(buffer)
        }
    };
    Ok(outcome)
}

/// The root's contribution, if the root runs in this process.
fn root_input(local: &[usize], root: usize, inputs: Vec<Input>) -> Option<Input> {
    let pos = local.iter().position(|&m| m == root)?;
    inputs.into_iter().nth(pos)
}

/// The local members' tensors' values, one after the other, if they are `f32` (what this
/// transport carries).
fn host_values(rank: usize, inputs: Vec<Input>) -> Result<Vec<f32>, CollectiveError> {
    let mut all = Vec::new();
    for input in inputs {
        let data = match input {
            Input::Host(data, _) => data,
            Input::Given(Contribution::Tensor(tensor)) => (*tensor).into_data(),
            Input::Given(_) => unreachable!("the header check keeps the kinds apart"),
        };
        if data.dtype() != DType::F32 {
            return Err(super::transport(
                rank,
                format!(
                    "the MPI transport carries f32 tensors, not {:?}",
                    data.dtype()
                ),
            ));
        }
        let values = data
            .try_into_vec::<f32>()
            .map_err(|e| super::transport(rank, format!("reading a tensor: {e:?}")))?;
        if all.is_empty() {
            all = values;
        } else {
            all.extend_from_slice(&values);
        }
    }
    Ok(all)
}

fn bytes_of(input: Input) -> Vec<u8> {
    match input {
        Input::Given(Contribution::Bytes(b)) => b,
        _ => unreachable!("the header check keeps the kinds apart"),
    }
}

fn tensor_on(values: Vec<f32>, device: &Device) -> Tensor<1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// `count` buffers of `n` bytes each, from one buffer.
fn split(all: &[u8], n: usize, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|p| all[p * n..(p + 1) * n].to_vec())
        .collect()
}
