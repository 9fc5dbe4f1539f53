//! Collectives on regions against closed forms worked out by hand.

use super::*;
use crate::comm::group::{CollectiveOp, Group, ReduceOp};

const ALL_REDUCE: CollectiveOp = CollectiveOp::AllReduce(ReduceOp::Mean);

/// Regions named `r0`, `r1`, … with these matrices (seconds, bytes per second) and ranks.
fn regions(latency_s: Vec<Vec<f64>>, bandwidth: Vec<Vec<f64>>, region_of: Vec<usize>) -> Regions {
    Regions {
        names: (0..latency_s.len()).map(|i| format!("r{i}")).collect(),
        latency_s,
        bandwidth_bytes_per_s: bandwidth,
        region_of,
    }
}

/// Two regions, local (α_l, β_l) on the diagonal and (α_w, β_w) between them.
fn two_regions(region_of: Vec<usize>) -> (Network, [f64; 4]) {
    let (alpha_l, beta_l, alpha_w, beta_w) = (5e-6, 12.5e9, 0.02, 1.25e8);
    let net = Network::regions(regions(
        vec![vec![alpha_l, alpha_w], vec![alpha_w, alpha_l]],
        vec![vec![beta_l, beta_w], vec![beta_w, beta_l]],
        region_of,
    ));
    (net, [alpha_l, beta_l, alpha_w, beta_w])
}

/// 2 regions × 2 nodes: the hierarchical all-reduce and all-gather of equal islands, and
/// the same seconds as the islands topology on the same links.
#[test]
fn network_regions_two_by_two_match_the_islands_formula() {
    let (net, [alpha_l, beta_l, alpha_w, beta_w]) = two_regions(vec![0, 0, 1, 1]);
    assert!(net.validate(4).is_ok());
    let g = Group::world(4);
    let (m, i) = (2.0, 2.0);
    for n in [1e3, 64e6, 999_983.0] {
        let all_reduce = 2.0 * ((m - 1.0) * alpha_l + (m - 1.0) / m * n / beta_l)
            + 2.0 * (i - 1.0) * alpha_w
            + 2.0 * (i - 1.0) / i * (n / m) / beta_w;
        assert_close!(net.collective_time(ALL_REDUCE, &g, n as u64), all_reduce);
        let all_gather = (m - 1.0) * (alpha_l + n / beta_l)
            + (i - 1.0) * (alpha_w + n / beta_w)
            + (m - 1.0) * (alpha_l + (i - 1.0) * n / beta_l);
        assert_close!(
            net.collective_time(CollectiveOp::AllGather, &g, n as u64),
            all_gather
        );
        let islands = Network::switch(Link::symmetric(beta_l * 8.0, alpha_l)).with_topology(
            Topology::Islands {
                size: 2,
                wan: Link::symmetric(beta_w * 8.0, alpha_w),
            },
        );
        for op in [ALL_REDUCE, CollectiveOp::AllGather, CollectiveOp::Barrier] {
            assert_close!(
                net.collective_time(op, &g, n as u64),
                islands.collective_time(op, &g, n as u64)
            );
        }
    }
    // Inside one region: the switch formula on the diagonal link.
    let n = 64e6;
    assert_close!(
        net.collective_time(ALL_REDUCE, &Group::new([2, 3]), n as u64),
        2.0 * alpha_l + n / beta_l
    );
    // A barrier across the regions waits for the wide latency: ⌈log₂ 4⌉ = 2 of them.
    assert_close!(
        net.collective_time(CollectiveOp::Barrier, &g, 0),
        2.0 * alpha_w
    );
    assert_close!(
        net.collective_time(CollectiveOp::Barrier, &Group::new([0, 1]), 0),
        alpha_l
    );
}

/// Three regions of one node each in a ring r0 → r1 → r2 → r0: every step of the ring
/// across takes its slowest hop, here r2 → r0 (the direction matters: r0 → r2 is fast).
#[test]
fn network_regions_ring_takes_the_slowest_pair() {
    let fast = 1.25e9;
    let latency = vec![
        vec![1e-4, 0.010, 0.030],
        vec![0.010, 1e-4, 0.020],
        vec![0.080, 0.020, 1e-4],
    ];
    let bandwidth = vec![
        vec![fast, 1.25e8, 1.25e8],
        vec![1.25e8, fast, 6.25e7],
        vec![1.25e7, 6.25e7, fast],
    ];
    let net = Network::regions(regions(latency.clone(), bandwidth.clone(), vec![0, 1, 2]));
    let g = Group::world(3);
    let n = 3e6;
    let hop = |a: usize, b: usize, bytes: f64| latency[a][b] + bytes / bandwidth[a][b];
    let step = |bytes: f64| hop(0, 1, bytes).max(hop(1, 2, bytes)).max(hop(2, 0, bytes));
    // One node per region: no local phase; 2(I−1) steps of n/(m·I) = n/3.
    assert_close!(step(n / 3.0), hop(2, 0, n / 3.0));
    assert_close!(
        net.collective_time(ALL_REDUCE, &g, n as u64),
        4.0 * (0.080 + (n / 3.0) / 1.25e7)
    );
    // All-gather: I−1 steps of n·(k−m)/((I−1)·m) = n.
    assert_close!(
        net.collective_time(CollectiveOp::AllGather, &g, n as u64),
        2.0 * step(n)
    );
    // Two nodes per region: the local phases on the diagonal, then the same ring of shards
    // n/(2·3).
    let net = Network::regions(regions(
        latency.clone(),
        bandwidth.clone(),
        vec![0, 0, 1, 1, 2, 2],
    ));
    let local = 1e-4 + (n / 2.0) / fast;
    assert_close!(
        net.collective_time(ALL_REDUCE, &Group::world(6), n as u64),
        2.0 * local + 4.0 * (0.080 + (n / 6.0) / 1.25e7)
    );
    // A sub-group in two of the regions rings r0 → r1 → r0.
    assert_close!(
        net.collective_time(ALL_REDUCE, &Group::new([0, 2]), n as u64),
        2.0 * hop(0, 1, n / 2.0).max(hop(1, 0, n / 2.0))
    );
    // A broadcast chain from rank 1 (r1 → r2 → r0), one segment.
    let one = Network {
        broadcast_segments: Some(1),
        ..Network::regions(regions(latency.clone(), bandwidth.clone(), vec![0, 1, 2]))
    };
    assert_close!(
        one.collective_time(CollectiveOp::Broadcast { root: 1 }, &g, n as u64),
        hop(1, 2, n) + hop(2, 0, n)
    );
    // The barrier waits for the largest latency between any two of the regions.
    assert_close!(
        one.collective_time(CollectiveOp::Barrier, &g, 0),
        2.0 * 0.080
    );
}

/// Regions of unequal size: the smallest region's shards cross the wide links, and its
/// node receives the other regions' buffers.
#[test]
fn network_regions_of_unequal_size() {
    let (net, [alpha_l, beta_l, alpha_w, beta_w]) = two_regions(vec![0, 0, 0, 1]);
    let g = Group::world(4);
    let n = 6e6;
    // Reduce-scatter over 3 (region 0), an all-reduce of the lone node's whole buffer
    // (m = 1, I = 2: 2 steps of n/2), all-gather over 3.
    let local = 2.0 * (alpha_l + (n / 3.0) / beta_l);
    assert_close!(
        net.collective_time(ALL_REDUCE, &g, n as u64),
        2.0 * local + 2.0 * (alpha_w + (n / 2.0) / beta_w)
    );
    // All-gather: gather 3 buffers inside region 0, the lone node receives those 3
    // (k − m = 3 buffers in I − 1 = 1 step), region 0 spreads the one it got.
    let gather = 2.0 * (alpha_l + n / beta_l);
    let across = alpha_w + 3.0 * n / beta_w;
    let spread = 2.0 * (alpha_l + (n / 3.0) / beta_l);
    assert_close!(
        net.collective_time(CollectiveOp::AllGather, &g, n as u64),
        gather + across + spread
    );
    // The islands topology with a short last island gives the same seconds.
    let islands =
        Network::switch(Link::symmetric(beta_l * 8.0, alpha_l)).with_topology(Topology::Islands {
            size: 3,
            wan: Link::symmetric(beta_w * 8.0, alpha_w),
        });
    for op in [ALL_REDUCE, CollectiveOp::AllGather] {
        assert_close!(
            islands.collective_time(op, &g, n as u64),
            net.collective_time(op, &g, n as u64)
        );
    }
    // Regions need not be contiguous in rank order: ranks 0 and 2 in r0, 1 and 3 in r1.
    let (mixed, _) = two_regions(vec![0, 1, 0, 1]);
    let (blocks, _) = two_regions(vec![0, 0, 1, 1]);
    assert_close!(
        mixed.collective_time(ALL_REDUCE, &g, n as u64),
        blocks.collective_time(ALL_REDUCE, &g, n as u64)
    );
}

#[test]
fn network_regions_are_validated() {
    let ok = || regions(vec![vec![0.0; 2]; 2], vec![vec![1.0; 2]; 2], vec![0, 1]);
    assert!(ok().validate(2).is_ok());
    assert!(ok().validate(3).unwrap_err().contains("3 nodes"));
    let mut r = ok();
    r.bandwidth_bytes_per_s[0][1] = 0.0;
    assert!(r.validate(2).unwrap_err().contains("r0 → r1"));
    let mut r = ok();
    r.latency_s[1][0] = -1.0;
    assert!(r.validate(2).unwrap_err().contains("r1 → r0"));
    let mut r = ok();
    r.latency_s[1].pop();
    assert!(r.validate(2).unwrap_err().contains("2 rows of 2"));
    let mut r = ok();
    r.region_of[1] = 2;
    assert!(r.validate(2).unwrap_err().contains("rank 1"));
    let net = Network::regions(ok());
    assert_eq!(net.links.len(), 2);
    assert_eq!(net.link(1), ok().link(1, 1));
    assert!(net.validate(2).is_ok());
}
