//! The all-reduce by a [`FoldSchedule`]: each chunk's running sum through its route's
//! stops, the result spread from the last process; the sends of each process in chunk
//! order.

use super::fold_schedule::FoldSchedule;
use super::p2p::{Peers, Tag};
use crate::comm::group::ReduceOp;
use crate::comm::transport::host_reduce::{divisor, fold_in_order};

/// Chunks a [`FoldSchedule`] cuts a tensor into, at least (down to [`FOLD_MIN_CHUNK`]).
const FOLD_CHUNKS: usize = 64;
/// Elements per chunk of a [`FoldSchedule`], at least (4 KiB of `f32`).
const FOLD_MIN_CHUNK: usize = 1024;

/// Elements per chunk of a fold schedule over `n` values: at most the transport's `chunk`,
/// small enough for [`FOLD_CHUNKS`] chunks. A chunk crosses up to five links one after
/// the other (stops, then spreading) and every link of the schedule is equally loaded, so
/// the pipeline's filling and draining, a few chunks' time, must be short beside the
/// whole: with 15 chunks of 60 KiB the MLP's all-reduce on 4 emulated hosts at 20 Mbit/s
/// took 0.75 s a step where its links' time is 0.54 s, with 200 of 4 KiB 0.60 s.
pub(super) fn chunk(n: usize, chunk: usize) -> usize {
    (n / FOLD_CHUNKS).clamp(FOLD_MIN_CHUNK.min(chunk), chunk)
}

/// Chunks ahead of the first unfinished one whose sends may go out.
const SEND_WINDOW: usize = 8;

/// A process's sends in chunk order: a send for chunk `c` goes out once every send for the
/// chunks before `c − SEND_WINDOW` has gone.
///
/// Why: a host's link is one queue (a NIC's, a switch port's, here a token bucket's) for
/// all its connections. Members shipped raw are ready at the start; sent at once, they
/// would queue ahead of the running sums and results that other processes wait for, and
/// the chunks behind them would stall the routes downstream. In chunk order the links
/// carry the chunks as the routes need them. No send waits on a later chunk, so nothing
/// deadlocks.
struct ChunkOrder<'a> {
    /// Sends still to be made, per chunk.
    owed: Vec<usize>,
    /// Sends ready but held, per chunk.
    held: Vec<Vec<(usize, Tag, &'a [f32])>>,
    /// The first chunk with sends owed.
    first: usize,
}

impl<'a> ChunkOrder<'a> {
    /// A process that makes `sends[c]` sends for chunk `c`.
    fn new(sends: Vec<usize>) -> Self {
        let held = vec![Vec::new(); sends.len()];
        let mut order = ChunkOrder {
            owed: sends,
            held,
            first: 0,
        };
        order.advance();
        order
    }

    /// A send for chunk `c`, ready.
    fn hold(&mut self, c: usize, send: (usize, Tag, &'a [f32])) {
        self.held[c].push(send);
    }

    /// The held sends that may go now, in chunk order.
    fn release(&mut self) -> Vec<(usize, Tag, &'a [f32])> {
        let mut out = Vec::new();
        let mut c = self.first;
        while c < self.owed.len() && c <= self.first + SEND_WINDOW {
            let sends = std::mem::take(&mut self.held[c]);
            self.owed[c] -= sends.len();
            out.extend(sends);
            let before = self.first;
            self.advance();
            // The window moved on: look again from its new start.
            c = if self.first > before {
                self.first
            } else {
                c + 1
            };
        }
        out
    }

    /// Moves `first` past the chunks with nothing owed.
    fn advance(&mut self) {
        while self.first < self.owed.len() && self.owed[self.first] == 0 {
            self.first += 1;
        }
    }

    /// Whether every send has gone.
    fn is_done(&self) -> bool {
        self.first == self.owed.len()
    }
}

/// What a receive of [`all_reduce`] brings.
#[derive(Clone, Copy)]
enum Arrival {
    /// Input `slot` of chunk `chunk`'s fold here: the running sum, or a shipped member.
    Input { chunk: usize, slot: usize },
    /// Chunk `chunk` of the result, to pass on to every other process if this one spreads it.
    Result { chunk: usize, spread: bool },
}

/// The all-reduce by a [`FoldSchedule`], each element still `((x₀ + x₁) + x₂) + …` in
/// member order: every chunk's running sum travels through its route's stops, each adding
/// its own members and those shipped to it, chunk by chunk as they arrive; the last
/// process divides (for a mean) and sends each chunk of the result to its spreader, which
/// sends it to every other process.
pub(super) fn all_reduce(
    peers: &Peers<'_>,
    mine: &[f32],
    op: ReduceOp,
    scratch: &mut Vec<f32>,
    schedule: &FoldSchedule,
) -> Vec<f32> {
    let (members, n, chunk) = (&schedule.members, schedule.len, schedule.chunk);
    let me = peers.me();
    let count = members.len();
    let last = count - 1;
    let local = members[me];
    let group_size: usize = members.iter().sum();
    let mut plan = peers.plan_in_chunks::<f32>(chunk);
    let pieces = schedule.pieces();
    let range = |c: usize| schedule.range(c);
    let route = |c: usize| schedule.route(c);
    // The inputs of each chunk this process folds: the running sum from the previous
    // stop (none at process 0), then the members shipped here, in member order.
    let inputs: Vec<usize> = (0..pieces)
        .map(|c| {
            let route = route(c);
            if !route.is_stop(me) {
                return 0;
            }
            let shipped: usize = route
                .folded_at(me)
                .filter(|&q| q != me)
                .map(|q| members[q])
                .sum();
            usize::from(me > 0) + shipped
        })
        .collect();
    scratch.resize((0..pieces).map(|c| inputs[c] * range(c).len()).sum(), 0.0);
    let mut rest = scratch.as_mut_slice();
    let input_regions: Vec<Vec<&mut [f32]>> = (0..pieces)
        .map(|c| {
            (0..inputs[c])
                .map(|_| {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(range(c).len());
                    rest = tail;
                    head
                })
                .collect()
        })
        .collect();
    let mut running = vec![0f32; if me < last { n } else { 0 }];
    let mut out = vec![0f32; n];
    // Where each chunk is folded (the running sum it sends on, or at the last process the
    // result), and where the result arrives.
    type Chunks<'b> = Vec<Option<&'b mut [f32]>>;
    let (mut folds, mut results): (Chunks, Chunks) = if me == last {
        (out.chunks_mut(chunk).map(Some).collect(), Vec::new())
    } else {
        (
            running.chunks_mut(chunk).map(Some).collect(),
            out.chunks_mut(chunk).map(Some).collect(),
        )
    };
    // Where a chunk this process folds goes: the running sum to the next stop; at the last
    // process the result to its spreader, or to every other process if it spreads it.
    let fold_to = |c: usize| -> Vec<usize> {
        match (me == last, schedule.spreader_of_chunk[c]) {
            (false, _) => vec![
                route(c)
                    .next_stop(me)
                    .expect("a stop after every but the last"),
            ],
            (true, spreader) if spreader == last => (0..last).collect(),
            (true, spreader) => vec![spreader],
        }
    };
    // The processes a spreader passes a chunk of the result on to.
    let spread_to: Vec<usize> = (0..last).filter(|&q| q != me).collect();
    // The sends this process makes for each chunk: its fold's, or its members shipped;
    // and the result passed on where this process spreads it.
    let sends: Vec<usize> = (0..pieces)
        .map(|c| {
            let own = if route(c).is_stop(me) {
                fold_to(c).len()
            } else {
                local
            };
            let spreads = me != last && schedule.spreader_of_chunk[c] == me;
            own + if spreads { spread_to.len() } else { 0 }
        })
        .collect();
    let mut order = ChunkOrder::new(sends);
    let mut arrivals = Vec::new();
    for (c, regions) in input_regions.into_iter().enumerate() {
        let (route, tag) = (route(c), schedule.route_of_chunk[c]);
        if route.is_stop(me) {
            let from = route.previous_stop(me).into_iter().chain(
                route
                    .folded_at(me)
                    .filter(|&q| q != me)
                    .flat_map(|q| std::iter::repeat_n(q, members[q])),
            );
            for (slot, (from, region)) in from.zip(regions).enumerate() {
                plan.receive(from, Tag::Running(tag), region);
                arrivals.push(Arrival::Input { chunk: c, slot });
            }
        } else {
            // Ship this process's members to their stop.
            for m in 0..local {
                let values = &mine[m * n..(m + 1) * n];
                order.hold(c, (route.stop_of[me], Tag::Running(tag), &values[range(c)]));
            }
        }
        if me != last {
            let spreader = schedule.spreader_of_chunk[c];
            let from = if spreader == me || spreader == last {
                last
            } else {
                spreader
            };
            let region = results[c]
                .take()
                .expect("each chunk of the result arrives once");
            plan.receive(from, Tag::Result(tag), region);
            arrivals.push(Arrival::Result {
                chunk: c,
                spread: spreader == me,
            });
        }
    }
    // Adds the chunk's values in member order into its fold and says where it goes next.
    let mut fold = |c: usize, received: &[&[f32]]| -> (&[f32], Vec<usize>) {
        let route = route(c);
        let target = folds[c].take().expect("each chunk is folded once");
        let own = (0..local).map(|m| &mine[m * n..(m + 1) * n][range(c)]);
        let mut shipped = received.iter().copied();
        let mut values: Vec<&[f32]> = Vec::with_capacity(received.len() + local);
        if me > 0 {
            values.push(shipped.next().expect("the running sum"));
        }
        for q in route.folded_at(me) {
            if q == me {
                values.extend(own.clone());
            } else {
                values.extend(shipped.by_ref().take(members[q]));
            }
        }
        target.copy_from_slice(values[0]);
        let mean = if me == last {
            divisor(op, group_size)
        } else {
            None
        };
        fold_in_order(target, &values[1..], mean);
        (target, fold_to(c))
    };
    // Process 0's folds that wait for nothing start at once.
    for c in (0..pieces).filter(|&c| route(c).is_stop(me) && inputs[c] == 0) {
        let (folded, to) = fold(c, &[]);
        for peer in to {
            order.hold(c, (peer, Tag::Running(schedule.route_of_chunk[c]), folded));
        }
    }
    for (peer, tag, data) in order.release() {
        plan.send(peer, tag, data);
    }
    // Inputs from different processes arrive in any order: each keeps its slot.
    let mut received: Vec<Vec<&[f32]>> = (0..pieces).map(|c| vec![&[][..]; inputs[c]]).collect();
    let mut arrived = vec![0usize; pieces];
    peers.run(plan, |i, data, then| match arrivals[i] {
        Arrival::Input { chunk: c, slot } => {
            received[c][slot] = data;
            arrived[c] += 1;
            if arrived[c] == inputs[c] {
                let (folded, to) = fold(c, &received[c]);
                let tag = schedule.route_of_chunk[c];
                let tag = if me == last {
                    Tag::Result(tag)
                } else {
                    Tag::Running(tag)
                };
                for peer in to {
                    order.hold(c, (peer, tag, folded));
                }
                then.extend(order.release());
            }
        }
        Arrival::Result { chunk: c, spread } => {
            if spread {
                let tag = Tag::Result(schedule.route_of_chunk[c]);
                for &q in &spread_to {
                    order.hold(c, (q, tag, data));
                }
                then.extend(order.release());
            }
        }
    });
    debug_assert!(order.is_done(), "every send of the schedule was made");
    out
}

#[cfg(test)]
mod tests {
    use super::{ChunkOrder, SEND_WINDOW, Tag, chunk};

    #[test]
    fn sends_go_in_chunk_order_within_the_window() {
        let data = [0f32; 4];
        let send = |peer: usize| (peer, Tag::Data, &data[..]);
        let chunks = SEND_WINDOW + 3;
        // One send per chunk; the last chunk's is ready first, then the others from the end.
        let mut order = ChunkOrder::new(vec![1; chunks]);
        order.hold(chunks - 1, send(chunks - 1));
        assert!(order.release().is_empty(), "beyond the window: held");
        order.hold(1, send(1));
        let went: Vec<usize> = order.release().iter().map(|s| s.0).collect();
        assert_eq!(went, [1], "inside the window: goes");
        // Chunk 0 goes, and the window moves past chunk 1 (done) to reach the last chunk.
        for c in (2..chunks - 1).rev() {
            order.hold(c, send(c));
        }
        order.hold(0, send(0));
        let went: Vec<usize> = order.release().iter().map(|s| s.0).collect();
        assert_eq!(went, (0..chunks).filter(|&c| c != 1).collect::<Vec<_>>());
        assert!(order.is_done());
        // A chunk with nothing to send does not hold the others back.
        let mut order = ChunkOrder::new(vec![0; SEND_WINDOW + 2].into_iter().chain([1]).collect());
        order.hold(SEND_WINDOW + 2, send(7));
        assert_eq!(order.release().len(), 1);
        assert!(order.is_done());
    }

    #[test]
    fn chunks_are_small_enough_to_pipeline() {
        // The MLP (203,530 values) in 60 KiB messages: 64 chunks of 3,180 values.
        assert_eq!(chunk(203_530, 15_360), 3_180);
        // Small tensors: no chunk under 4 KiB; large ones: no chunk over the transport's.
        assert_eq!(chunk(10_000, 15_360), 1_024);
        assert_eq!(chunk(100, 15_360), 1_024);
        assert_eq!(chunk(100_000_000, 15_360), 15_360);
        assert_eq!(chunk(100, 500), 500);
    }
}
