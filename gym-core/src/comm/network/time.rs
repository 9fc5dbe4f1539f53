//! How long a collective takes on a network: the alpha-beta model of each topology (see
//! the [module documentation](super)).

use super::{Link, Network, Regions, Topology};
use crate::comm::group::{CollectiveOp, Group};
use std::collections::HashMap;

impl Network {
    /// Seconds that `op` takes on `group` with `payload` bytes in each rank's buffer.
    pub fn collective_time(&self, op: CollectiveOp, group: &Group, payload: u64) -> f64 {
        let members = group.members();
        let k = members.len();
        // A quorum's decision moves no payload; a byte broadcast is timed as a broadcast.
        let op = match op {
            CollectiveOp::Quorum => return 0.0,
            CollectiveOp::BroadcastBytes { root } => CollectiveOp::Broadcast { root },
            op => op,
        };
        if k <= 1 {
            return 0.0;
        }
        // Protocol headers take a share of every link's rate: the payload travels as if
        // it were that much larger.
        let n = payload as f64 / self.protocol.efficiency;
        self.protocol.call_overhead_s + self.transfer_time(op, members, n)
    }

    /// The transfers of `op` among `members`, `n` bytes in each member's buffer (as the
    /// links carry them).
    fn transfer_time(&self, op: CollectiveOp, members: &[usize], n: f64) -> f64 {
        match &self.topology {
            Topology::Relay => self.relay_time(op, members, n),
            Topology::Islands { size, wan } => {
                let islands = split_islands(members, |r| r / size);
                self.across_time(op, members, &islands, Wide::Uniform(*wan), n)
            }
            Topology::Regions(regions) => {
                let islands = split_islands(members, |r| regions.region(r));
                self.across_time(op, members, &islands, Wide::Matrix(regions), n)
            }
            Topology::Switch => self.flat_time(op, members, n),
        }
    }

    /// The algorithm [`collective_time`](Self::collective_time) times `op` on `group` with:
    /// `ring` (all-reduce, all-gather), `chain` (broadcast), `dissemination` (barrier) on one
    /// switch or inside one island or region; `hierarchical` across islands or regions;
    /// `relay` through a relay; `decision` for a quorum; `local` for a group of one.
    pub fn algorithm(&self, op: CollectiveOp, group: &Group) -> &'static str {
        let members = group.members();
        if op == CollectiveOp::Quorum {
            return "decision";
        }
        if members.len() <= 1 {
            return "local";
        }
        let one_island = match &self.topology {
            Topology::Relay => return "relay",
            Topology::Switch => true,
            Topology::Islands { size, .. } => {
                members[0] / size == members[members.len() - 1] / size
            }
            Topology::Regions(regions) => {
                let first = regions.region(members[0]);
                members.iter().all(|&m| regions.region(m) == first)
            }
        };
        if !one_island {
            return "hierarchical";
        }
        match op {
            CollectiveOp::AllReduce(_) | CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => {
                "ring"
            }
            CollectiveOp::Broadcast { .. } | CollectiveOp::BroadcastBytes { .. } => "chain",
            CollectiveOp::Barrier => "dissemination",
            CollectiveOp::Quorum => "decision",
        }
    }

    /// Collectives among `members` grouped in `islands`: on one switch when they are all in
    /// one island, hierarchical otherwise.
    fn across_time(
        &self,
        op: CollectiveOp,
        members: &[usize],
        islands: &[Island],
        wide: Wide,
        n: f64,
    ) -> f64 {
        if islands.len() == 1 {
            self.flat_time(op, members, n)
        } else {
            self.hierarchical_time(op, members, islands, wide, n)
        }
    }

    /// A message of `bytes` from `from` to `to` over their own links.
    fn hop(&self, from: usize, to: usize, bytes: f64) -> f64 {
        let (a, b) = (self.link(from), self.link(to));
        a.latency_s.max(b.latency_s) + bytes / a.up_bytes_per_s.min(b.down_bytes_per_s)
    }

    /// One ring step: every member sends `bytes` to the next; the slowest hop sets the pace.
    fn ring_step(&self, members: &[usize], bytes: f64) -> f64 {
        let k = members.len();
        (0..k)
            .map(|i| self.hop(members[i], members[(i + 1) % k], bytes))
            .fold(0.0, f64::max)
    }

    /// Collectives among `members`, all on one switch.
    fn flat_time(&self, op: CollectiveOp, members: &[usize], n: f64) -> f64 {
        let k = members.len() as f64;
        match op {
            CollectiveOp::AllReduce(_) => 2.0 * (k - 1.0) * self.ring_step(members, n / k),
            CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => {
                (k - 1.0) * self.ring_step(members, n)
            }
            CollectiveOp::Broadcast { root } => {
                let hops = chain(members, root);
                self.pipelined(n, |seg| {
                    hops.iter().map(|&(a, b)| self.hop(a, b, seg)).collect()
                })
            }
            CollectiveOp::BroadcastBytes { .. } | CollectiveOp::Quorum => {
                unreachable!("normalised in collective_time")
            }
            CollectiveOp::Barrier => {
                let alpha = members
                    .iter()
                    .map(|&m| self.link(m).latency_s)
                    .fold(0.0, f64::max);
                log2_ceil(members.len()) * alpha
            }
        }
    }

    /// Collectives among members spread over several islands (see the module
    /// documentation's table).
    fn hierarchical_time(
        &self,
        op: CollectiveOp,
        members: &[usize],
        islands: &[Island],
        wide: Wide,
        n: f64,
    ) -> f64 {
        let i = islands.len() as f64;
        let k = members.len() as f64;
        let m = islands.iter().map(|is| is.members.len()).min().unwrap_or(1) as f64;
        // The slowest island's local phase.
        let local = |f: &dyn Fn(&[usize]) -> f64| {
            islands.iter().map(|is| f(&is.members)).fold(0.0, f64::max)
        };
        // One step of the ring across the islands, `bytes` on every hop: the slowest hop.
        let wide_step = |bytes: f64| {
            (0..islands.len())
                .map(|a| {
                    let b = (a + 1) % islands.len();
                    wide.hop(islands[a].key, islands[b].key, bytes)
                })
                .fold(0.0, f64::max)
        };
        match op {
            CollectiveOp::AllReduce(_) => {
                let scatter = local(&|is: &[usize]| {
                    let mi = is.len() as f64;
                    (mi - 1.0) * self.ring_step(is, n / mi)
                });
                let across = 2.0 * (i - 1.0) * wide_step(n / (m * i));
                2.0 * scatter + across
            }
            CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => {
                let gather = local(&|is: &[usize]| (is.len() as f64 - 1.0) * self.ring_step(is, n));
                let across = (i - 1.0) * wide_step(n * (k - m) / ((i - 1.0) * m));
                let spread = local(&|is: &[usize]| {
                    let mi = is.len() as f64;
                    (mi - 1.0) * self.ring_step(is, n * (k - mi) / mi)
                });
                gather + across + spread
            }
            CollectiveOp::Broadcast { root } => {
                let island_of: HashMap<usize, usize> = islands
                    .iter()
                    .flat_map(|is| is.members.iter().map(|&r| (r, is.key)))
                    .collect();
                // Each hop with the islands of its ends.
                let hops: Vec<(usize, usize, usize, usize)> = chain(members, root)
                    .into_iter()
                    .map(|(a, b)| (a, b, island_of[&a], island_of[&b]))
                    .collect();
                self.pipelined(n, |seg| {
                    hops.iter()
                        .map(|&(a, b, ia, ib)| {
                            if ia == ib {
                                self.hop(a, b, seg)
                            } else if let Wide::Uniform(wan) = wide {
                                let (la, lb) = (self.link(a), self.link(b));
                                let alpha = la.latency_s.max(lb.latency_s).max(wan.latency_s);
                                let beta = la
                                    .up_bytes_per_s
                                    .min(lb.down_bytes_per_s)
                                    .min(wan.bandwidth());
                                alpha + seg / beta
                            } else {
                                wide.hop(ia, ib, seg)
                            }
                        })
                        .collect()
                })
            }
            CollectiveOp::BroadcastBytes { .. } | CollectiveOp::Quorum => {
                unreachable!("normalised in collective_time")
            }
            CollectiveOp::Barrier => {
                let keys: Vec<usize> = islands.iter().map(|is| is.key).collect();
                let alpha = members
                    .iter()
                    .map(|&r| self.link(r).latency_s)
                    .fold(wide.largest_latency(&keys), f64::max);
                log2_ceil(members.len()) * alpha
            }
        }
    }

    /// Collectives through a relay: uploads, then downloads.
    fn relay_time(&self, op: CollectiveOp, members: &[usize], n: f64) -> f64 {
        let k = members.len() as f64;
        let slowest = |f: &dyn Fn(Link) -> f64, who: &mut dyn Iterator<Item = &usize>| {
            who.map(|&r| f(self.link(r))).fold(0.0, f64::max)
        };
        let up = |bytes: f64| move |l: Link| l.latency_s + bytes / l.up_bytes_per_s;
        let down = |bytes: f64| move |l: Link| l.latency_s + bytes / l.down_bytes_per_s;
        match op {
            CollectiveOp::AllReduce(_) => {
                slowest(&up(n), &mut members.iter()) + slowest(&down(n), &mut members.iter())
            }
            CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => {
                slowest(&up(n), &mut members.iter())
                    + slowest(&down((k - 1.0) * n), &mut members.iter())
            }
            CollectiveOp::Broadcast { root } => {
                up(n)(self.link(root))
                    + slowest(&down(n), &mut members.iter().filter(|&&r| r != root))
            }
            CollectiveOp::Barrier => 2.0 * slowest(&|l: Link| l.latency_s, &mut members.iter()),
            CollectiveOp::BroadcastBytes { .. } | CollectiveOp::Quorum => {
                unreachable!("normalised in collective_time")
            }
        }
    }

    /// A pipelined chain of `n` bytes cut into `s` segments, whose hops take `hops(n/s)`
    /// each: the first segment crosses every hop, the others follow at the slowest hop's
    /// pace. With `broadcast_segments` unset, the fastest `s`.
    fn pipelined(&self, n: f64, hops: impl Fn(f64) -> Vec<f64>) -> f64 {
        let time = |s: usize| {
            let h = hops(n / s as f64);
            h.iter().sum::<f64>() + (s as f64 - 1.0) * h.iter().fold(0.0, |a: f64, &b| a.max(b))
        };
        match self.broadcast_segments {
            Some(s) => time(s),
            None => candidate_segments(n)
                .map(time)
                .fold(f64::INFINITY, f64::min),
        }
    }
}

/// Segment counts worth trying for a pipelined chain: every count up to 256, then powers of
/// √2 up to one segment per byte (at most 2²⁴).
fn candidate_segments(n: f64) -> impl Iterator<Item = usize> {
    let max = (n.max(1.0) as usize).min(1 << 24);
    let small = 1..=max.min(256);
    let large = (17..=48)
        .map(|e| (2f64.powf(e as f64 / 2.0)) as usize)
        .filter(move |&s| s > 256 && s <= max);
    small.chain(large)
}

/// The hops of a chain from `root` through `members` in rank order, wrapping around.
fn chain(members: &[usize], root: usize) -> Vec<(usize, usize)> {
    let k = members.len();
    let start = members.iter().position(|&m| m == root).unwrap_or(0);
    (0..k - 1)
        .map(|h| (members[(start + h) % k], members[(start + h + 1) % k]))
        .collect()
}

/// The members of a group that share an island (or a region).
struct Island {
    /// The island's number (or the region's index).
    key: usize,
    /// Its members, in the group's order.
    members: Vec<usize>,
}

/// `members` grouped by `key_of` (the island or region of a rank), the groups in the order
/// of their first member.
fn split_islands(members: &[usize], key_of: impl Fn(usize) -> usize) -> Vec<Island> {
    let mut islands: Vec<Island> = Vec::new();
    let mut index: HashMap<usize, usize> = HashMap::new();
    for &m in members {
        let key = key_of(m);
        // Ranks of one island are mostly consecutive: most ranks join the last island.
        if let Some(last) = islands.last_mut()
            && last.key == key
        {
            last.members.push(m);
            continue;
        }
        let i = *index.entry(key).or_insert_with(|| {
            islands.push(Island {
                key,
                members: Vec::new(),
            });
            islands.len() - 1
        });
        islands[i].members.push(m);
    }
    islands
}

/// The links between islands.
#[derive(Clone, Copy)]
enum Wide<'a> {
    /// One wide-area link, the same for every pair of islands (each node's share of it).
    Uniform(Link),
    /// A latency and a bandwidth per ordered pair of regions.
    Matrix(&'a Regions),
}

impl Wide<'_> {
    /// A message of `bytes` from island (region) `a` to island `b`.
    fn hop(&self, a: usize, b: usize, bytes: f64) -> f64 {
        match self {
            Wide::Uniform(wan) => wan.latency_s + bytes / wan.bandwidth(),
            Wide::Matrix(regions) => {
                regions.latency_s[a][b] + bytes / regions.bandwidth_bytes_per_s[a][b]
            }
        }
    }

    /// The largest latency between two different islands of `keys`.
    fn largest_latency(&self, keys: &[usize]) -> f64 {
        match self {
            Wide::Uniform(wan) => wan.latency_s,
            Wide::Matrix(regions) => keys
                .iter()
                .flat_map(|&a| keys.iter().map(move |&b| (a, b)))
                .filter(|(a, b)| a != b)
                .map(|(a, b)| regions.latency_s[a][b])
                .fold(0.0, f64::max),
        }
    }
}

fn log2_ceil(k: usize) -> f64 {
    (usize::BITS - (k.max(1) - 1).leading_zeros()) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::group::ReduceOp;
    use crate::comm::network::Protocol;

    const ALL_REDUCE: CollectiveOp = CollectiveOp::AllReduce(ReduceOp::Mean);

    /// A protocol's efficiency η and call overhead c: every call of two or more members
    /// costs c plus its transfers at η of the links' rates (the ring all-reduce:
    /// `c + 2(k−1)α + 2(k−1)/k · n/(ηβ)`); a call of one member and a quorum cost nothing;
    /// the default protocol leaves every time as it was, bit for bit.
    #[test]
    fn protocol_costs_a_call_overhead_and_a_share_of_the_rate() {
        let link = Link::symmetric(20e6, 1e-3);
        let plain = Network::switch(link);
        let (eta, c) = (0.95, 3e-4);
        let net = plain.clone().with_protocol(Protocol {
            efficiency: eta,
            call_overhead_s: c,
        });
        let (g, n) = (Group::world(4), 814_000u64);
        let beta = 20e6 / 8.0;
        let ring = 2.0 * 3.0 * 1e-3 + 2.0 * 3.0 / 4.0 * n as f64 / (eta * beta);
        let reduce = CollectiveOp::AllReduce(ReduceOp::Mean);
        assert_close!(net.collective_time(reduce, &g, n), c + ring);
        let gather = CollectiveOp::AllGather;
        let flat = 3.0 * (1e-3 + n as f64 / (eta * beta));
        assert_close!(net.collective_time(gather, &g, n), c + flat);
        assert_eq!(net.collective_time(reduce, &Group::world(1), n), 0.0);
        assert_eq!(net.collective_time(CollectiveOp::Quorum, &g, n), 0.0);
        let default = plain.clone().with_protocol(Protocol::default());
        for op in [reduce, gather, CollectiveOp::Broadcast { root: 0 }] {
            assert_eq!(
                default.collective_time(op, &g, n).to_bits(),
                plain.collective_time(op, &g, n).to_bits()
            );
        }
        for bad in [0.0, 1.5, f64::NAN] {
            let p = Protocol {
                efficiency: bad,
                call_overhead_s: 0.0,
            };
            assert!(plain.clone().with_protocol(p).validate(4).is_err(), "{bad}");
        }
    }

    #[test]
    fn network_switch_collectives_match_the_closed_forms() {
        let (alpha, beta) = (1e-3, 1.25e8);
        let net = Network::switch(Link::symmetric(beta * 8.0, alpha));
        for k in [2usize, 3, 4, 7, 16] {
            let g = Group::world(k);
            let kf = k as f64;
            for n in [1u64, 1000, 4 << 20, 999_983] {
                let nf = n as f64;
                assert_close!(
                    net.collective_time(ALL_REDUCE, &g, n),
                    2.0 * (kf - 1.0) * alpha + 2.0 * (kf - 1.0) / kf * nf / beta
                );
                assert_close!(
                    net.collective_time(CollectiveOp::AllGather, &g, n),
                    (kf - 1.0) * alpha + (kf - 1.0) * nf / beta
                );
                assert_close!(
                    net.collective_time(CollectiveOp::AllGatherBytes, &g, n),
                    (kf - 1.0) * alpha + (kf - 1.0) * nf / beta
                );
                for s in [1usize, 2, 8] {
                    let fixed = Network {
                        broadcast_segments: Some(s),
                        ..net.clone()
                    };
                    let sf = s as f64;
                    assert_close!(
                        fixed.collective_time(CollectiveOp::Broadcast { root: k / 2 }, &g, n),
                        (kf - 2.0 + sf) * (alpha + nf / (sf * beta))
                    );
                }
                // The best segment count beats every fixed one.
                let best = net.collective_time(CollectiveOp::Broadcast { root: 0 }, &g, n);
                let s_star = (((kf - 2.0) * nf / (alpha * beta)).sqrt().round() as usize).max(1);
                for s in [1, s_star, s_star + 1, s_star.saturating_sub(1).max(1)] {
                    let t = (kf - 2.0 + s as f64) * (alpha + nf / (s as f64 * beta));
                    assert!(best <= t * (1.0 + 1e-12), "k {k} n {n} s {s}: {best} > {t}");
                }
            }
            assert_close!(
                net.collective_time(CollectiveOp::Barrier, &g, 0),
                (kf.log2().ceil()) * alpha
            );
        }
        // One rank, or a group of one: free.
        assert_eq!(
            net.collective_time(ALL_REDUCE, &Group::world(1), 1 << 20),
            0.0
        );
    }

    #[test]
    fn network_asymmetric_links_take_the_slowest_hop_of_each_step() {
        // Node 2 uploads slowly; node 3 downloads slowly and has the largest latency.
        let mut links = vec![Link::symmetric(1e9, 1e-3); 4];
        links[2].up_bytes_per_s = 1e6;
        links[3].down_bytes_per_s = 2e6;
        links[3].latency_s = 5e-3;
        let net = Network {
            links: links.clone(),
            ..Network::switch(links[0])
        };
        let g = Group::world(4);
        let n = 1e6;
        // Ring 0→1→2→3→0: hop (from, to) costs max(α) + bytes/min(u_from, d_to).
        let hop = |a: usize, b: usize, bytes: f64| {
            links[a].latency_s.max(links[b].latency_s)
                + bytes / links[a].up_bytes_per_s.min(links[b].down_bytes_per_s)
        };
        let step = |bytes: f64| {
            [(0, 1), (1, 2), (2, 3), (3, 0)]
                .iter()
                .map(|&(a, b)| hop(a, b, bytes))
                .fold(0.0, f64::max)
        };
        assert_close!(
            net.collective_time(ALL_REDUCE, &g, n as u64),
            6.0 * step(n / 4.0)
        );
        assert_close!(
            net.collective_time(CollectiveOp::AllGather, &g, n as u64),
            3.0 * step(n)
        );
        // The hop 2→3 is both slow ways: 5 ms + n/1e6.
        assert_close!(step(n), 5e-3 + n / 1e6);
        // A sub-group only crosses its own members' links.
        let pair = Group::new([0, 1]);
        assert_close!(
            net.collective_time(ALL_REDUCE, &pair, n as u64),
            2.0 * hop(0, 1, n / 2.0)
        );
        // A broadcast chain from 1: 1→2→3→0; one segment.
        let one = Network {
            broadcast_segments: Some(1),
            ..net.clone()
        };
        assert_close!(
            one.collective_time(CollectiveOp::Broadcast { root: 1 }, &g, n as u64),
            hop(1, 2, n) + hop(2, 3, n) + hop(3, 0, n)
        );
    }

    #[test]
    fn network_islands_all_reduce_is_hierarchical() {
        let (alpha_l, beta_l) = (5e-6, 12.5e9);
        let wan = Link::symmetric(1e9, 0.02);
        let (alpha_w, beta_w) = (0.02, 1.25e8);
        let net = Network::switch(Link::symmetric(beta_l * 8.0, alpha_l))
            .with_topology(Topology::Islands { size: 4, wan });
        let n = 64e6;
        for (k, islands) in [(8usize, 2.0f64), (12, 3.0), (16, 4.0)] {
            let g = Group::world(k);
            let m = 4.0;
            let local = (m - 1.0) * alpha_l + (m - 1.0) / m * n / beta_l;
            let across = 2.0 * (islands - 1.0) * alpha_w
                + 2.0 * (islands - 1.0) / islands * (n / m) / beta_w;
            assert_close!(
                net.collective_time(ALL_REDUCE, &g, n as u64),
                2.0 * local + across
            );
            let gather = (m - 1.0) * (alpha_l + n / beta_l)
                + (islands - 1.0) * (alpha_w + n / beta_w)
                + (m - 1.0) * (alpha_l + (islands - 1.0) * n / beta_l);
            assert_close!(
                net.collective_time(CollectiveOp::AllGather, &g, n as u64),
                gather
            );
            assert_close!(
                net.collective_time(CollectiveOp::Barrier, &g, 0),
                (k as f64).log2().ceil() * alpha_w
            );
        }
        // Within one island: the switch formula on the local links.
        let inside = Group::new([4, 5, 6, 7]);
        assert_close!(
            net.collective_time(ALL_REDUCE, &inside, n as u64),
            6.0 * alpha_l + 1.5 * n / beta_l
        );
        // A broadcast chain over two islands of two crosses the WAN once (0,1 | 2,3).
        let chain_net = Network {
            broadcast_segments: Some(1),
            ..net
                .clone()
                .with_topology(Topology::Islands { size: 2, wan })
        };
        let g = Group::world(4);
        assert_close!(
            chain_net.collective_time(CollectiveOp::Broadcast { root: 0 }, &g, n as u64),
            2.0 * (alpha_l + n / beta_l) + (alpha_w + n / beta_w)
        );
    }

    #[test]
    fn network_relay_uploads_then_downloads() {
        let mut links = vec![Link::symmetric(100e6, 0.05); 3];
        links[1] = "10mbit/100mbit:80ms".parse().unwrap();
        let net = Network {
            links: links.clone(),
            ..Network::switch(links[0])
        }
        .with_topology(Topology::Relay);
        let g = Group::world(3);
        let n = 2e6;
        let up = |l: &Link, b: f64| l.latency_s + b / l.up_bytes_per_s;
        let down = |l: &Link, b: f64| l.latency_s + b / l.down_bytes_per_s;
        let max = |f: &dyn Fn(&Link) -> f64| links.iter().map(f).fold(0.0, f64::max);
        assert_close!(
            net.collective_time(ALL_REDUCE, &g, n as u64),
            max(&|l| up(l, n)) + max(&|l| down(l, n))
        );
        assert_close!(
            net.collective_time(CollectiveOp::AllGather, &g, n as u64),
            max(&|l| up(l, n)) + max(&|l| down(l, 2.0 * n))
        );
        assert_close!(
            net.collective_time(CollectiveOp::Broadcast { root: 1 }, &g, n as u64),
            up(&links[1], n) + down(&links[0], n).max(down(&links[2], n))
        );
        assert_close!(
            net.collective_time(CollectiveOp::Barrier, &g, 0),
            2.0 * 0.08
        );
    }

    /// The DiLoCo bandwidth calculator (arthurdouillard.com/diloco): one all-reduce of
    /// N = 2 GB (1B bf16 parameters) among R = 8 replicas at W = 1 Gbit/s takes
    /// T = 2N/W·(1−1/R) = 28 s: the ring formula without latency.
    #[test]
    fn network_anchor_the_diloco_bandwidth_calculator() {
        let net = Network::switch(Link::symmetric(1e9, 0.0));
        let t = net.collective_time(ALL_REDUCE, &Group::world(8), 2_000_000_000);
        assert_close!(t, 28.0);
    }
}
