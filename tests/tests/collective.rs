//! The in-process collective against a sequential reference, its determinism, its cost
//! model and its behaviour when a rank fails.

use gym_core::{Collective, CollectiveError, Group, InProcessGroup, ReduceOp};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tests::{host, rank_values, vector};

/// Runs `f` on every rank of a new group and returns each rank's result.
fn on_ranks<T: Send>(k: usize, f: impl Fn(Collective) -> T + Sync) -> Vec<T> {
    InProcessGroup::new(k)
        .run(f)
        .unwrap()
        .into_iter()
        .map(|r| r.expect("rank panicked"))
        .collect()
}

/// Runs `f` on another thread and fails if it takes longer than `limit` (a deadlock).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).ok());
    rx.recv_timeout(limit)
        .expect("did not finish in time: deadlock?")
}

#[test]
fn all_reduce_equals_sequential_sum_and_mean_in_rank_order() {
    // 257 elements take the tensor path; 100,003 the host path, whose chunks are summed by
    // every rank's thread (and end mid-chunk).
    for n in [257, 100_003] {
        for k in [1, 3, 4] {
            let sums = on_ranks(k, |c| {
                host(
                    c.all_reduce(vector(rank_values(c.rank(), n)), ReduceOp::Sum)
                        .unwrap(),
                )
            });
            let means = on_ranks(k, |c| {
                host(
                    c.all_reduce(vector(rank_values(c.rank(), n)), ReduceOp::Mean)
                        .unwrap(),
                )
            });
            let mut reference = rank_values(0, n);
            for r in 1..k {
                for (a, b) in reference.iter_mut().zip(rank_values(r, n)) {
                    *a += b;
                }
            }
            let reference_mean: Vec<f32> = reference.iter().map(|x| x / k as f32).collect();
            for r in 0..k {
                assert_eq!(sums[r], reference, "sum of {n} on rank {r} of {k}");
                assert_eq!(means[r], reference_mean, "mean of {n} on rank {r} of {k}");
            }
        }
    }
}

/// The bf16 ring: every contribution rounded to bf16 (the `half` crate's conversion, an
/// independent reference), summed in f32 in rank order, the mean rounded again; counted at
/// 2 bytes per value, half the f32 all-reduce's bytes.
#[test]
fn a_bf16_all_reduce_rounds_in_and_out_and_sends_half_the_bytes() {
    let bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    for (n, k) in [(257, 3), (100_003, 4)] {
        let out = on_ranks(k, |c| {
            let world = c.world();
            let mean = c
                .all_reduce_bf16_start_in(&world, vector(rank_values(c.rank(), n)), ReduceOp::Mean)
                .unwrap()
                .wait()
                .unwrap();
            let bf16_stats = c.stats();
            c.all_reduce(vector(rank_values(c.rank(), n)), ReduceOp::Mean)
                .unwrap();
            (host(mean), bf16_stats, c.stats())
        });
        let mut sum: Vec<f32> = rank_values(0, n).into_iter().map(bf16).collect();
        for r in 1..k {
            for (a, b) in sum.iter_mut().zip(rank_values(r, n)) {
                *a += bf16(b);
            }
        }
        let reference: Vec<f32> = sum.iter().map(|x| bf16(x / k as f32)).collect();
        for (r, (mean, bf16_stats, both)) in out.iter().enumerate() {
            assert_eq!(mean, &reference, "{n} values, rank {r} of {k}");
            let ring = (2 * (k - 1) * 2 * n / k) as u64;
            assert_eq!(bf16_stats.bytes_sent, ring, "2 bytes per value");
            assert_eq!(
                both.bytes_sent - bf16_stats.bytes_sent,
                (2 * (k - 1) * 4 * n / k) as u64
            );
        }
        assert!(
            reference
                .iter()
                .zip(rank_values(0, n))
                .any(|(a, b)| *a != b)
        );
    }
}

#[test]
fn all_reduce_leaves_a_tensor_the_caller_kept_unchanged() {
    // The host path sums into a rank's own buffer: one the caller still holds must be
    // copied first, not overwritten.
    let n = 100_003;
    let kept = on_ranks(3, |c| {
        let mine = vector(rank_values(c.rank(), n));
        let keep = mine.clone();
        c.all_reduce(mine, ReduceOp::Sum).unwrap();
        host(keep)
    });
    for (r, k) in kept.into_iter().enumerate() {
        assert_eq!(k, rank_values(r, n), "rank {r}'s kept tensor");
    }
}

#[test]
fn broadcast_gives_every_rank_the_roots_tensor() {
    for root in 0..4 {
        let got = on_ranks(4, |c| {
            host(
                c.broadcast(vector(rank_values(c.rank(), 33)), root)
                    .unwrap(),
            )
        });
        for g in got {
            assert_eq!(g, rank_values(root, 33));
        }
    }
}

#[test]
fn all_gather_returns_every_ranks_tensor_in_rank_order() {
    let got = on_ranks(5, |c| {
        c.all_gather(vector(rank_values(c.rank(), 10)))
            .unwrap()
            .into_iter()
            .map(host)
            .collect::<Vec<_>>()
    });
    for per_rank in got {
        assert_eq!(
            per_rank,
            (0..5).map(|r| rank_values(r, 10)).collect::<Vec<_>>()
        );
    }
}

#[test]
fn all_gather_bytes_returns_every_ranks_buffer_in_rank_order_and_counts_its_length() {
    let group = InProcessGroup::new(3);
    let got = group
        .run(|c| {
            let mine: Vec<u8> = (0..7).map(|i| (10 * c.rank() + i) as u8).collect();
            c.all_gather_bytes(mine).unwrap()
        })
        .unwrap();
    let expected: Vec<Vec<u8>> = (0..3)
        .map(|r| (0..7).map(|i| (10 * r + i) as u8).collect())
        .collect();
    for per_rank in got {
        assert_eq!(per_rank.unwrap(), expected);
    }
    // Ring all-gather of a 7-byte buffer among 3 ranks: 2·7 bytes each way.
    for r in 0..3 {
        let s = group.stats(r);
        assert_eq!(
            (s.bytes_sent, s.bytes_received, s.all_gather_calls),
            (14, 14, 1)
        );
    }
}

#[test]
fn a_byte_gather_meeting_a_tensor_gather_is_a_mismatch() {
    let results = within(Duration::from_secs(30), || {
        InProcessGroup::new(2)
            .run(|c| {
                if c.rank() == 0 {
                    c.all_gather_bytes(vec![0; 8]).map(|_| ())
                } else {
                    c.all_gather(vector(vec![0.0; 2])).map(|_| ())
                }
            })
            .unwrap()
    });
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Ok(Err(CollectiveError::Mismatch { .. })))),
        "{results:?}"
    );
    assert!(
        results.iter().all(|r| matches!(r, Ok(Err(_)))),
        "{results:?}"
    );
}

#[test]
fn sub_groups_reduce_independently_and_concurrently() {
    // Islands {0, 2} and {1, 3} reduce at the same time; then {1, 2, 3} gathers.
    let got = on_ranks(4, |c| {
        let island = Group::new(if c.rank() % 2 == 0 { [0, 2] } else { [1, 3] });
        let mean = host(
            c.all_reduce_in(&island, vector(rank_values(c.rank(), 20)), ReduceOp::Mean)
                .unwrap(),
        );
        let trio = Group::new([1, 2, 3]);
        let gathered = trio.contains(c.rank()).then(|| {
            c.all_gather_in(&trio, vector(rank_values(c.rank(), 4)))
                .unwrap()
                .len()
        });
        let from = host(
            c.broadcast_in(
                &island,
                vector(rank_values(c.rank(), 5)),
                island.members()[1],
            )
            .unwrap(),
        );
        (mean, gathered, from)
    });
    for (r, (mean, gathered, from)) in got.into_iter().enumerate() {
        let (a, b) = if r % 2 == 0 { (0, 2) } else { (1, 3) };
        let expected: Vec<f32> = rank_values(a, 20)
            .iter()
            .zip(rank_values(b, 20))
            .map(|(x, y)| (x + y) / 2.0)
            .collect();
        assert_eq!(mean, expected, "island mean on rank {r}");
        assert_eq!(gathered, (r != 0).then_some(3));
        assert_eq!(from, rank_values(b, 5));
    }
}

#[test]
fn results_are_bit_identical_over_20_runs() {
    let run = || {
        on_ranks(8, |c| {
            host(
                c.all_reduce(vector(rank_values(c.rank(), 4096)), ReduceOp::Mean)
                    .unwrap(),
            )
        })
    };
    let first: Vec<u32> = run()[0].iter().map(|x| x.to_bits()).collect();
    for _ in 0..20 {
        for per_rank in run() {
            assert_eq!(
                per_rank.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                first
            );
        }
    }
}

#[test]
fn thirty_two_nodes_on_two_cores_do_not_deadlock() {
    let sums = within(Duration::from_secs(60), || {
        on_ranks(32, |c| {
            let mut t = vector(vec![c.rank() as f32; 64]);
            for _ in 0..10 {
                t = c.all_reduce(t, ReduceOp::Mean).unwrap();
                c.barrier().unwrap();
            }
            host(t)[0]
        })
    });
    // The mean of 0..32 is 15.5, and stays so.
    assert!(sums.iter().all(|&s| s == 15.5), "{sums:?}");
}

#[test]
fn byte_counters_follow_the_cost_model() {
    // 1000 f32 = 4000 bytes per rank, 4 ranks.
    let group = InProcessGroup::new(4);
    group
        .run(|c| {
            let t = vector(vec![1.0; 1000]);
            c.all_reduce(t.clone(), ReduceOp::Sum).unwrap(); // ring: 2·3/4·4000 = 6000 each way
            c.broadcast(t.clone(), 1).unwrap(); // chain 1→2→3→0
            c.all_gather(t.clone()).unwrap(); // 3·4000 each way
            c.barrier().unwrap(); // free
            let island = Group::new(if c.rank() < 2 { [0, 1] } else { [2, 3] });
            c.all_reduce_in(&island, t, ReduceOp::Mean).unwrap(); // 2·1/2·4000 = 4000
        })
        .unwrap();
    let sent: Vec<u64> = (0..4).map(|r| group.stats(r).bytes_sent).collect();
    let received: Vec<u64> = (0..4).map(|r| group.stats(r).bytes_received).collect();
    let common = 6000 + 12_000 + 4000;
    assert_eq!(
        sent,
        vec![common, common + 4000, common + 4000, common + 4000]
    );
    assert_eq!(
        received,
        vec![common + 4000, common, common + 4000, common + 4000]
    );
    let s = group.stats(0);
    assert_eq!(
        (
            s.all_reduce_calls,
            s.broadcast_calls,
            s.all_gather_calls,
            s.barrier_calls
        ),
        (2, 1, 1, 1)
    );
    // Observer traffic is counted apart.
    let g = InProcessGroup::new(2);
    g.run(|c| {
        c.observer()
            .all_reduce(vector(vec![0.0; 10]), ReduceOp::Sum)
            .unwrap()
    })
    .unwrap();
    assert_eq!(g.stats(0).bytes_sent, 0);
    assert_eq!(g.observer_stats(0).bytes_sent, 40);
}

#[test]
fn fault_a_panicking_rank_aborts_the_waiting_ranks() {
    let start = Instant::now();
    let results = within(Duration::from_secs(30), || {
        InProcessGroup::new(4)
            .run(|c| {
                if c.rank() == 2 {
                    panic!("boom on rank 2");
                }
                c.all_reduce(vector(vec![1.0; 8]), ReduceOp::Sum)
                    .map(|_| ())
            })
            .unwrap()
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(
        results[2]
            .as_ref()
            .is_err_and(|m| m.contains("boom on rank 2"))
    );
    for r in [0, 1, 3] {
        match &results[r] {
            Ok(Err(CollectiveError::Aborted { rank: 2, reason })) => {
                assert!(reason.contains("boom"))
            }
            other => panic!("rank {r}: expected an abort naming rank 2, got {other:?}"),
        }
    }
}

#[test]
fn fault_a_rank_that_leaves_early_does_not_block_the_others() {
    let results = within(Duration::from_secs(30), || {
        InProcessGroup::new(3)
            .run(|c| {
                if c.rank() == 1 {
                    // Finishes without calling the barrier, as a node whose loop ended.
                    c.transport().leave(c.rank());
                    return Ok(());
                }
                c.barrier()
            })
            .unwrap()
    });
    for r in [0, 2] {
        assert!(
            matches!(
                results[r],
                Ok(Err(CollectiveError::MemberLeft { rank: 1, .. }))
            ),
            "rank {r}: {:?}",
            results[r]
        );
    }
}

#[test]
fn fault_mismatched_calls_and_bad_groups_are_errors() {
    let results = InProcessGroup::new(2)
        .run(|c| {
            c.all_reduce(vector(vec![0.0; 4 + c.rank()]), ReduceOp::Sum)
                .map(|_| ())
        })
        .unwrap();
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Ok(Err(CollectiveError::Mismatch { .. }))))
    );
    assert!(results.iter().all(|r| matches!(r, Ok(Err(_)))));

    let results = InProcessGroup::new(3)
        .run(|c| c.barrier_in(&Group::new([0, 1])))
        .unwrap();
    assert!(matches!(
        results[2],
        Ok(Err(CollectiveError::InvalidGroup { rank: 2, .. }))
    ));
}
