//! The collectives across processes, built from [`Peers`]' point-to-point transfers, with
//! the thread transport's arithmetic.
//!
//! `members[p]` is how many members of the call process `p` of the group holds (its
//! position in the communicator); a process's values are its members', one after the other.
//!
//! * **Headers**: every process sends its members' headers to every other.
//! * **All-reduce**: a reduce-scatter sent directly (process `q` receives slice `q` of every
//!   member's tensor and adds the members' slices in member order, as the threads add whole
//!   tensors), then the summed slices sent directly to every process. Each process sends and
//!   receives `2(P−1)/P` of a tensor: the ring's bytes, in one hop each. With several
//!   members per process that becomes `(m+1)(P−1)/P` (every member's slice travels: adding a
//!   process's members first would change the order of additions), and a
//!   [`FoldSchedule`] is lighter (see [`all_reduce`]).
//! * **All-gather**: every process sends its members' buffers to every other.
//! * **Broadcast**: a pipelined chain through the processes in group order from the root's,
//!   each chunk forwarded as soon as it arrives: the simulated network's algorithm.

use super::fold_schedule::FoldSchedule;
use super::folded;
use super::p2p::{Peers, Tag};
use crate::comm::group::{CollectiveOp, ReduceOp};
use crate::comm::transport::Header;
use crate::comm::transport::host_reduce::{divisor, fold_in_order};
use mpi::datatype::Equivalence;

/// `u64`s per encoded header.
const HEADER_WORDS: usize = 5;

/// Every member's header, in member order: each process sends its members'.
pub(super) fn headers(peers: &Peers<'_>, mine: &[Header], members: &[usize]) -> Vec<Header> {
    let encoded: Vec<u64> = mine
        .iter()
        .flat_map(|h| {
            let (code, root) = op_code(h.op);
            [code, root as u64, h.len, h.ready_s.to_bits(), 0]
        })
        .collect();
    let all = all_gather(peers, &encoded, HEADER_WORDS, members, Tag::Headers);
    all.chunks(HEADER_WORDS)
        .map(|h| Header {
            op: op_from_code(h[0], h[1] as usize),
            len: h[2],
            ready_s: f64::from_bits(h[3]),
        })
        .collect()
}

/// Every process's `mine` (`per_member` values for each of its members), concatenated in
/// process order.
pub(super) fn all_gather<T: Equivalence + Default + Clone>(
    peers: &Peers<'_>,
    mine: &[T],
    per_member: usize,
    members: &[usize],
    tag: Tag,
) -> Vec<T> {
    let me = peers.me();
    let counts: Vec<usize> = members.iter().map(|&m| m * per_member).collect();
    let mut all = vec![T::default(); counts.iter().sum()];
    let parts = split_mut(&mut all, &counts);
    let mut receives = Vec::with_capacity(parts.len());
    for (p, part) in parts.into_iter().enumerate() {
        if p == me {
            part.clone_from_slice(mine);
        } else {
            receives.push((p, part));
        }
    }
    let sends: Vec<(usize, &[T])> = (0..peers.count())
        .filter(|&p| p != me)
        .map(|p| (p, mine))
        .collect();
    peers.exchange(tag, &sends, receives);
    all
}

/// The all-reduce of the members' tensors of `n` values (`mine`: this process's members',
/// one after the other), each element added in member order and then, for a mean, divided
/// by the member count: the thread transport's arithmetic. `scratch` holds the other
/// processes' slices (the chain's incoming running sum).
///
/// Pipelined: process `q` owns slice `q`; as soon as chunk `c` of its slice has arrived
/// from every other member it is summed and sent to every process, while later chunks are
/// still arriving, so the link never idles between the two halves.
///
/// Where processes hold several members each, a [`FoldSchedule`] moves fewer bytes over the
/// busiest link (for 2 members on each of 4 processes, 5/3 of a tensor against 2.25): each
/// chunk's running sum travels through some of the processes in group order, each adding
/// its members and those shipped to it, and the result spreads from the last process (see
/// [`folded::all_reduce`]). The two give the same bits; [`lighter_fold_schedule`] picks.
pub(super) fn all_reduce(
    peers: &Peers<'_>,
    mine: &[f32],
    n: usize,
    members: &[usize],
    op: ReduceOp,
    scratch: &mut Vec<f32>,
) -> Vec<f32> {
    let chunk = folded::chunk(n, peers.plan::<f32>().chunk());
    if let Some(schedule) = lighter_fold_schedule(members, n, chunk) {
        return folded::all_reduce(peers, mine, op, scratch, &schedule);
    }
    let me = peers.me();
    let parts = slices(n, members.len());
    let (start, own) = parts[me];
    let local = members[me];
    let group_size: usize = members.iter().sum();
    let remote = group_size - local;
    debug_assert!(remote > 0, "a call across processes has members elsewhere");
    // The first member (in member order) of each process.
    let first: Vec<usize> = members
        .iter()
        .scan(0, |at, &m| {
            let here = *at;
            *at += m;
            Some(here)
        })
        .collect();
    scratch.resize(remote * own, 0.0);
    let mut sums = vec![0f32; own];
    let mut out = vec![0f32; n];
    {
        let mut plan = peers.plan::<f32>();
        let chunk = plan.chunk();
        let pieces = own.div_ceil(chunk);
        // Receive index → (slot among the remote members, chunk); the sums follow.
        let mut of_receive = Vec::new();
        let mut slots = scratch.chunks_mut(own.max(1));
        for (p, &m) in members.iter().enumerate().filter(|&(p, _)| p != me) {
            for _ in 0..m {
                let slot = of_receive.len() / pieces.max(1);
                let region = slots.next().filter(|_| own > 0).unwrap_or_default();
                plan.receive(p, Tag::Data, region);
                of_receive.extend((0..pieces).map(|c| Some((slot, c))));
            }
        }
        let lengths: Vec<usize> = parts.iter().map(|&(_, len)| len).collect();
        for (q, part) in split_mut(&mut out, &lengths).into_iter().enumerate() {
            if q != me {
                plan.receive(q, Tag::Sums, part);
            }
        }
        // Slice q of each of this process's members, member by member (chunked as the
        // receiver's slots are), for process q.
        for (q, &(at, len)) in parts.iter().enumerate().filter(|&(q, _)| q != me) {
            for m in 0..local {
                plan.send(q, Tag::Data, &mine[m * n + at..m * n + at + len]);
            }
        }
        let mut arrived = vec![0usize; pieces];
        let mut received: Vec<Vec<Option<&[f32]>>> = vec![vec![None; remote]; pieces];
        let mut sum_chunks: Vec<Option<&mut [f32]>> = sums.chunks_mut(chunk).map(Some).collect();
        peers.run(plan, |i, data, then| {
            let Some(&Some((slot, c))) = of_receive.get(i) else {
                return;
            };
            received[c][slot] = Some(data);
            arrived[c] += 1;
            if arrived[c] < remote {
                return;
            }
            let sum = sum_chunks[c].take().expect("each chunk is summed once");
            let (lo, hi) = (c * chunk, (c * chunk + sum.len()).min(own));
            let value_of = |g: usize| -> &[f32] {
                if (first[me]..first[me] + local).contains(&g) {
                    let m = g - first[me];
                    &mine[m * n + start + lo..m * n + start + hi]
                } else {
                    let slot = if g < first[me] { g } else { g - local };
                    received[c][slot].expect("every remote chunk has arrived")
                }
            };
            sum.copy_from_slice(value_of(0));
            let rest: Vec<&[f32]> = (1..group_size).map(value_of).collect();
            fold_in_order(sum, &rest, divisor(op, group_size));
            let sum: &[f32] = sum;
            for q in (0..members.len()).filter(|&q| q != me) {
                then.push((q, Tag::Sums, sum));
            }
        });
    }
    out[start..start + own].copy_from_slice(&sums);
    out
}

/// The [`FoldSchedule`] of `n` values in chunks of `chunk`, where it moves fewer bytes over
/// the busiest link than the reduce-scatter.
fn lighter_fold_schedule(members: &[usize], n: usize, chunk: usize) -> Option<FoldSchedule> {
    let schedule = FoldSchedule::new(members, n, chunk);
    (schedule.busiest_link() < scatter_busiest_link(members) - 1e-9).then_some(schedule)
}

/// The tensors that cross the busiest link (a process's uplink or downlink) in a
/// reduce-scatter all-reduce of one tensor by processes holding `members` each.
///
/// Process `p` of `P` with `m` of `k` members sends `m` slices of `1/P` to each other
/// process and its sum to each, `(m+1)(P−1)/P`; it receives `(k−m)/P + (P−1)/P`.
fn scatter_busiest_link(members: &[usize]) -> f64 {
    let p_f = members.len() as f64;
    let k: usize = members.iter().sum();
    members
        .iter()
        .map(|&m| {
            let up = (m + 1) as f64 * (p_f - 1.0) / p_f;
            let down = (k - m) as f64 / p_f + (p_f - 1.0) / p_f;
            up.max(down)
        })
        .fold(0.0, f64::max)
}

/// Broadcasts `buffer` from the process at position `root` along the chain of positions
/// `root, root + 1, …` (wrapping): every process ends with the root's values.
pub(super) fn broadcast<T: Equivalence>(peers: &Peers<'_>, root: usize, buffer: &mut [T]) {
    let count = peers.count();
    let hop = (peers.me() + count - root) % count;
    let previous = (hop > 0).then(|| (peers.me() + count - 1) % count);
    let next = (hop + 1 < count).then(|| (peers.me() + 1) % count);
    peers.relay(previous, next, buffer);
}

/// `buffer` cut into consecutive parts of `lengths`.
fn split_mut<'a, T>(mut buffer: &'a mut [T], lengths: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (head, tail) = buffer.split_at_mut(len);
        parts.push(head);
        buffer = tail;
    }
    parts
}

/// Element ranges of the slices a reduce-scatter hands out: `k` contiguous parts of `n`,
/// the first `n % k` one longer.
pub(super) fn slices(n: usize, k: usize) -> Vec<(usize, usize)> {
    let (base, extra) = (n / k, n % k);
    let mut start = 0;
    (0..k)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = (start, len);
            start += len;
            range
        })
        .collect()
}

fn op_code(op: CollectiveOp) -> (u64, usize) {
    match op {
        CollectiveOp::AllReduce(ReduceOp::Sum) => (1, 0),
        CollectiveOp::AllReduce(ReduceOp::Mean) => (2, 0),
        CollectiveOp::Broadcast { root } => (3, root),
        CollectiveOp::AllGather => (4, 0),
        CollectiveOp::AllGatherBytes => (5, 0),
        CollectiveOp::Barrier => (6, 0),
        CollectiveOp::BroadcastBytes { root } => (7, root),
        CollectiveOp::Quorum => (8, 0),
    }
}

fn op_from_code(code: u64, root: usize) -> CollectiveOp {
    match code {
        1 => CollectiveOp::AllReduce(ReduceOp::Sum),
        2 => CollectiveOp::AllReduce(ReduceOp::Mean),
        3 => CollectiveOp::Broadcast { root },
        4 => CollectiveOp::AllGather,
        5 => CollectiveOp::AllGatherBytes,
        7 => CollectiveOp::BroadcastBytes { root },
        8 => CollectiveOp::Quorum,
        _ => CollectiveOp::Barrier,
    }
}

#[cfg(test)]
mod tests {
    use super::{lighter_fold_schedule, scatter_busiest_link, slices, split_mut};

    #[test]
    fn the_fold_schedule_is_taken_only_where_it_moves_less() {
        // One member per process: the reduce-scatter's ring bytes, never a fold schedule.
        for p in 2..9 {
            let busiest = scatter_busiest_link(&vec![1; p]);
            assert!((busiest - 2.0 * (p - 1) as f64 / p as f64).abs() < 1e-12);
            assert!(lighter_fold_schedule(&vec![1; p], 1_000_000, 1000).is_none());
        }
        // Two members on each of 4 processes: 2.25 tensors against 5/3 (over 30 chunks).
        assert!((scatter_busiest_link(&[2, 2, 2, 2]) - 2.25).abs() < 1e-12);
        let members = [2, 2, 2, 2];
        let schedule = lighter_fold_schedule(&members, 30_000, 1000).expect("lighter");
        let fold = schedule.busiest_link();
        assert!((fold - 5.0 / 3.0).abs() < 0.05, "{fold}");
        // The MPI tests' tensor of 100,003 values on one host (1 MiB messages): 64 chunks,
        // routes in which a process ships its members, and more than one spreader.
        let chunk = super::folded::chunk(100_003, 1 << 18);
        let schedule = lighter_fold_schedule(&members, 100_003, chunk).expect("lighter");
        assert_eq!(schedule.route_of_chunk.len(), 65);
        let used = |c: usize| &schedule.routes[schedule.route_of_chunk[c]];
        assert!((0..65).any(|c| (0..4).any(|p| !used(c).is_stop(p))));
        assert!(schedule.spreader_of_chunk.iter().any(|&s| s != 3));
        // Two processes: the running sum one way, the result the other.
        let schedule = lighter_fold_schedule(&[4, 4], 10, 3).expect("lighter");
        assert!((schedule.busiest_link() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn slices_cover_the_tensor_in_order() {
        for (n, k) in [(10, 3), (2, 4), (0, 2), (1_000_003, 16)] {
            let parts = slices(n, k);
            assert_eq!(parts.len(), k);
            let mut next = 0;
            for (start, len) in parts {
                assert_eq!(start, next);
                next += len;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn split_mut_cuts_consecutive_parts() {
        let mut values: Vec<u32> = (0..10).collect();
        let parts = split_mut(&mut values, &[3, 0, 2, 5]);
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert_eq!(lens, [3, 0, 2, 5]);
        assert_eq!(parts[2], &[3, 4]);
        assert_eq!(parts[3][0], 5);
    }
}
