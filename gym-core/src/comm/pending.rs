//! A collective started without waiting for it, and when its transfer ran.

use crate::error::CollectiveError;
use serde::{Deserialize, Serialize};

/// The result of a collective started without waiting for it
/// ([`Collective::all_reduce_start`](crate::comm::Collective::all_reduce_start), [`Collective::all_gather_start`](crate::comm::Collective::all_gather_start)). Take it with
/// [`wait`](Self::wait), which charges the simulated clock the part of the transfer that
/// has not finished by then.
#[must_use = "a started collective is only complete once waited for"]
pub struct Pending<T> {
    value: T,
    finish: Option<Box<dyn FnOnce() + Send>>,
    timing: Option<TransferTiming>,
}

/// When a started collective's transfer ran on the simulated clock: what a checkpoint saves
/// of a [`Pending`] so that a resumed run charges its wait exactly
/// ([`Collective::resume_pending`](crate::comm::Collective::resume_pending)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TransferTiming {
    /// When this node was ready for it (arrived, its link free).
    pub own_ready_s: f64,
    /// When the transfer started (its last member ready).
    pub start_s: f64,
    /// When it ended.
    pub end_s: f64,
}

impl<T> Pending<T> {
    /// A result that is complete already (a collective that does not overlap).
    pub fn ready(value: T) -> Self {
        Pending {
            value,
            finish: None,
            timing: None,
        }
    }

    /// A result whose waiting runs `finish` (charging the clock of a transfer that ran as
    /// `timing` says) before handing it over.
    pub(crate) fn new(value: T, finish: Box<dyn FnOnce() + Send>, timing: TransferTiming) -> Self {
        Pending {
            value,
            finish: Some(finish),
            timing: Some(timing),
        }
    }

    /// When the transfer ran on the simulated clock, if it is timed: save it to resume the
    /// wait with [`Collective::resume_pending`](crate::comm::Collective::resume_pending).
    pub fn timing(&self) -> Option<TransferTiming> {
        self.timing
    }

    /// A pending result transformed by `f` once it is taken (e.g. decoded).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Pending<U> {
        Pending {
            value: f(self.value),
            finish: self.finish,
            timing: self.timing,
        }
    }

    /// The result, which the simulator has already exchanged, and what remains of the
    /// call: the clock's charge for the transfer, taken with [`wait`](Pending::wait) on the
    /// returned `Pending<()>` (for a node that keeps the value while its transfer runs,
    /// e.g. across the steps it overlaps).
    pub fn into_parts(self) -> (T, Pending<()>) {
        (
            self.value,
            Pending {
                value: (),
                finish: self.finish,
                timing: self.timing,
            },
        )
    }

    /// Lets the transfer finish without this node waiting for it: the node's clock is not
    /// charged, its link stays busy until the transfer ends. For a node that serves data it
    /// does not need back (a peer sending the current state to a late node).
    pub fn detach(self) {}

    /// Waits for the collective and returns its result.
    pub fn wait(self) -> Result<T, CollectiveError> {
        if let Some(finish) = self.finish {
            finish();
        }
        Ok(self.value)
    }
}
