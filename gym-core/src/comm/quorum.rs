//! Which nodes a round waits for: Decoupled DiLoCo's quorum and grace window, and the
//! fastest m of n.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Who a round proceeds with, decided from the members' arrival times
/// ([`Collective::quorum_in`](super::Collective::quorum_in)). Ties in arrival go to the
/// lower rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum QuorumRule {
    /// Decoupled DiLoCo (arXiv 2604.21428): wait until `min` members have arrived, then keep
    /// collecting for `grace_s` simulated seconds; close early once every member is in.
    /// Members arriving later are left out of the round.
    Grace {
        /// The minimum quorum (more than the members present: all of them).
        min: usize,
        /// The grace window after the `min`-th arrival, in simulated seconds.
        grace_s: f64,
    },
    /// The first `count` arrivals, as SparseLoCo/Covenant aggregate the fastest
    /// submissions.
    Fastest {
        /// How many members the round takes.
        count: usize,
    },
}

impl QuorumRule {
    /// The members taking part, in rank order, and when the quorum closes, from every
    /// member's `(rank, arrival time)`.
    pub fn select(&self, arrivals: &[(usize, f64)]) -> (Vec<usize>, f64) {
        if arrivals.is_empty() {
            return (Vec::new(), 0.0);
        }
        let mut order: Vec<(usize, f64)> = arrivals.to_vec();
        order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let n = order.len();
        let (taken, close) = match *self {
            QuorumRule::Grace { min, grace_s } => {
                let m = min.clamp(1, n);
                let deadline = order[m - 1].1 + grace_s;
                let taken = order.iter().take_while(|a| a.1 <= deadline).count().max(m);
                let close = if taken == n { order[n - 1].1 } else { deadline };
                (taken, close)
            }
            QuorumRule::Fastest { count } => {
                let m = count.clamp(1, n);
                (m, order[m - 1].1)
            }
        };
        let mut members: Vec<usize> = order[..taken].iter().map(|a| a.0).collect();
        members.sort_unstable();
        (members, close)
    }

    /// Checks the rule: a quorum of at least one, a finite non-negative grace window.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            QuorumRule::Grace { min, grace_s } => {
                if min == 0 {
                    return Err("the minimum quorum must be at least 1".into());
                }
                if !(grace_s.is_finite() && grace_s >= 0.0) {
                    return Err(format!(
                        "the grace window must be finite and non-negative, got {grace_s}"
                    ));
                }
            }
            QuorumRule::Fastest { count: 0 } => {
                return Err("the fastest-m aggregation needs m of at least 1".into());
            }
            QuorumRule::Fastest { .. } => {}
        }
        Ok(())
    }
}

impl fmt::Display for QuorumRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuorumRule::Grace { min, grace_s } => write!(f, "quorum {min}, grace {grace_s} s"),
            QuorumRule::Fastest { count } => write!(f, "fastest {count}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elastic_quorum_waits_for_the_minimum_then_the_grace_window() {
        let arrivals = [(0, 1.0), (1, 1.2), (2, 5.0), (3, 1.1)];
        let rule = QuorumRule::Grace {
            min: 2,
            grace_s: 0.15,
        };
        // Second arrival at 1.1 s; the window closes at 1.25 s: rank 1 (1.2 s) is in, 2 out.
        assert_eq!(rule.select(&arrivals), (vec![0, 1, 3], 1.1 + 0.15));
        // A window that covers everyone closes at the last arrival.
        let wide = QuorumRule::Grace {
            min: 2,
            grace_s: 10.0,
        };
        assert_eq!(wide.select(&arrivals), (vec![0, 1, 2, 3], 5.0));
        // A minimum above the members present waits for all of them.
        let all = QuorumRule::Grace {
            min: 9,
            grace_s: 0.0,
        };
        assert_eq!(all.select(&arrivals), (vec![0, 1, 2, 3], 5.0));
    }

    #[test]
    fn elastic_fastest_m_takes_the_first_arrivals_ties_to_the_lower_rank() {
        let arrivals = [(0, 2.0), (1, 1.0), (2, 1.0), (3, 0.5)];
        assert_eq!(
            QuorumRule::Fastest { count: 2 }.select(&arrivals),
            (vec![1, 3], 1.0)
        );
        let ties = [(0, 0.0), (1, 0.0), (2, 0.0)];
        assert_eq!(
            QuorumRule::Fastest { count: 2 }.select(&ties),
            (vec![0, 1], 0.0)
        );
        assert!(QuorumRule::Fastest { count: 0 }.validate().is_err());
        assert!(
            QuorumRule::Grace {
                min: 1,
                grace_s: f64::NAN
            }
            .validate()
            .is_err()
        );
    }
}
