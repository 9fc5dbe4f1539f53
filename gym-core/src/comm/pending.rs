//! A collective started without waiting for it: its result, which may still be on its way
//! ([`Incoming`]), and when its transfer ran on the simulated clock ([`TransferTiming`]).
//!
//! Two clocks meet here. On the simulated clock a started transfer occupies the node's link
//! and [`Pending::wait`] charges only what the node's compute did not hide. On the real one,
//! a transport whose data takes real time (MPI across hosts) keeps moving it in the
//! background while the node computes, and the result is [`Incoming`] until it lands; the
//! thread transport's results are there at once.

use super::real_clock::{RealKind, not_own_work};
use crate::error::CollectiveError;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, OnceLock};

/// The result of a collective started without waiting for it
/// ([`Collective::all_reduce_start`](crate::comm::Collective::all_reduce_start), [`Collective::all_gather_start`](crate::comm::Collective::all_gather_start)). Take it with
/// [`wait`](Self::wait), which charges the simulated clock the part of the transfer that
/// has not finished by then and waits, on the real clock, for the data.
#[must_use = "a started collective is only complete once waited for"]
pub struct Pending<T> {
    value: Incoming<T>,
    finish: Option<Box<dyn FnOnce() + Send>>,
    timing: Option<TimingOf>,
}

/// When a started transfer runs on the simulated clock, found when asked (its members'
/// readiness may still be on its way); `None` for a call that failed.
type TimingOf = Arc<dyn Fn() -> Option<TransferTiming> + Send + Sync>;

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
            value: Incoming::ready(value),
            finish: None,
            timing: None,
        }
    }

    /// A result whose waiting runs `finish` (charging the clock of a transfer that ran as
    /// `timing` says, when asked) before handing it over.
    pub(crate) fn new(
        value: Incoming<T>,
        finish: Box<dyn FnOnce() + Send>,
        timing: impl Fn() -> Option<TransferTiming> + Send + Sync + 'static,
    ) -> Self {
        Pending {
            value,
            finish: Some(finish),
            timing: Some(Arc::new(timing)),
        }
    }

    /// A result that may still be on its way, whose transfer is not timed.
    pub(crate) fn new_untimed(value: Incoming<T>) -> Self {
        Pending {
            value,
            finish: None,
            timing: None,
        }
    }

    /// When the transfer ran on the simulated clock, if it is timed: save it to resume the
    /// wait with [`Collective::resume_pending`](crate::comm::Collective::resume_pending).
    /// Across processes it is known once every member's header has arrived, which this
    /// waits for.
    pub fn timing(&self) -> Option<TransferTiming> {
        self.timing.as_ref().and_then(|timing| timing())
    }

    /// A pending result transformed by `f` once it has arrived (e.g. decoded); `f` runs on
    /// the thread that takes the result.
    pub fn map<U>(self, f: impl FnOnce(T) -> U + Send + 'static) -> Pending<U>
    where
        T: Send + 'static,
    {
        Pending {
            value: self.value.map(f),
            finish: self.finish,
            timing: self.timing,
        }
    }

    /// The result, which may still be on its way, and what remains of the call: the clock's
    /// charge for the transfer, taken with [`wait`](Pending::wait) on the returned
    /// `Pending<()>`. For a node that holds the result across the steps its transfer
    /// overlaps (Streaming DiLoCo's fragments, eager updates), and takes it when due.
    pub fn into_parts(self) -> (Incoming<T>, Pending<()>) {
        (
            self.value,
            Pending {
                value: Incoming::ready(()),
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
        self.value.into_inner()
    }
}

/// A collective's result that may still be on its way: there at once for the thread
/// transport, moving in the background for a transport whose data takes real time. Taking
/// it ([`get`](Self::get), [`into_inner`](Self::into_inner)) waits until it has arrived;
/// nothing here touches the simulated clock (that is [`Pending::wait`]'s).
pub struct Incoming<T> {
    value: OnceLock<Result<T, CollectiveError>>,
    /// What delivers it, until it is taken.
    arrival: Mutex<Option<Arrival<T>>>,
}

/// What delivers an [`Incoming`] value: blocks until it has arrived.
type Arrival<T> = Box<dyn FnOnce() -> Result<T, CollectiveError> + Send>;

impl<T> Incoming<T> {
    /// A value that is here.
    pub fn ready(value: T) -> Self {
        Incoming {
            value: OnceLock::from(Ok(value)),
            arrival: Mutex::new(None),
        }
    }

    /// A value that `arrival` delivers (blocking until it has arrived).
    pub(crate) fn arriving(arrival: Arrival<T>) -> Self {
        Incoming {
            value: OnceLock::new(),
            arrival: Mutex::new(Some(arrival)),
        }
    }

    /// Whether it has arrived (or its transfer has failed): [`get`](Self::get) would not
    /// wait.
    pub fn is_here(&self) -> bool {
        self.value.get().is_some()
    }

    /// The value, once it has arrived (or the error that ended its transfer).
    pub fn get(&self) -> Result<&T, CollectiveError> {
        self.value
            .get_or_init(|| {
                let arrival = self
                    .arrival
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                match arrival {
                    Some(arrive) => not_own_work(RealKind::Communication, "wait", arrive),
                    // Taken by a `get` that panicked while waiting.
                    None => Err(CollectiveError::Transport {
                        rank: usize::MAX,
                        reason: "a transfer's result was lost while waiting for it".into(),
                    }),
                }
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The value, once it has arrived.
    pub fn into_inner(self) -> Result<T, CollectiveError> {
        self.get()?;
        self.value.into_inner().expect("the value arrived in `get`")
    }

    /// The value transformed by `f` once it has arrived.
    pub fn map<U>(self, f: impl FnOnce(T) -> U + Send + 'static) -> Incoming<U>
    where
        T: Send + 'static,
    {
        let arrival = self.arrival.into_inner().unwrap_or_else(|p| p.into_inner());
        match (self.value.into_inner(), arrival) {
            (Some(value), _) => Incoming {
                value: OnceLock::from(value.map(f)),
                arrival: Mutex::new(None),
            },
            (None, Some(arrive)) => Incoming::arriving(Box::new(move || arrive().map(f))),
            (None, None) => Incoming::arriving(Box::new(|| {
                Err(CollectiveError::Transport {
                    rank: usize::MAX,
                    reason: "a transfer's result was lost while waiting for it".into(),
                })
            })),
        }
    }
}

impl<T> std::fmt::Debug for Incoming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.value.get() {
            Some(Ok(_)) => "arrived",
            Some(Err(_)) => "failed",
            None => "on its way",
        };
        write!(f, "Incoming({state})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn an_arriving_value_is_fetched_once_and_mapped_lazily() {
        let fetched = Arc::new(AtomicUsize::new(0));
        let counter = fetched.clone();
        let incoming = Incoming::arriving(Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(20)
        }));
        let mapped = incoming.map(|v| v + 1);
        assert_eq!(
            fetched.load(Ordering::SeqCst),
            0,
            "nothing is fetched before asked"
        );
        assert_eq!(*mapped.get().unwrap(), 21);
        assert_eq!(*mapped.get().unwrap(), 21);
        assert_eq!(mapped.into_inner().unwrap(), 21);
        assert_eq!(fetched.load(Ordering::SeqCst), 1, "fetched once");
    }

    #[test]
    fn a_failed_transfer_is_the_error_of_every_take() {
        let incoming: Incoming<u8> = Incoming::arriving(Box::new(|| {
            Err(CollectiveError::Transport {
                rank: 3,
                reason: "link down".into(),
            })
        }));
        assert!(incoming.get().is_err());
        let err = incoming.into_inner().unwrap_err();
        assert!(err.to_string().contains("link down"), "{err}");
    }

    #[test]
    fn waiting_charges_the_clock_then_hands_the_value_over() {
        let charged = Arc::new(AtomicUsize::new(0));
        let c = charged.clone();
        let timing = TransferTiming {
            own_ready_s: 0.0,
            start_s: 1.0,
            end_s: 2.0,
        };
        let pending = Pending::new(
            Incoming::arriving(Box::new(|| Ok(vec![1u8, 2]))),
            Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }),
            move || Some(timing),
        );
        let (value, transfer) = pending.map(|v| v.len()).into_parts();
        assert_eq!(transfer.timing(), Some(timing));
        assert_eq!(charged.load(Ordering::SeqCst), 0);
        transfer.wait().unwrap();
        assert_eq!(charged.load(Ordering::SeqCst), 1);
        assert_eq!(value.into_inner().unwrap(), 2);
    }
}
