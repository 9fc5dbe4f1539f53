//! Two runs compared bit for bit: what a same-seed rerun, a resumed run or a checkpointing
//! run must share with the run left alone.

use crate::flat_params;
use burn::module::Module;
use gym_core::{FitOutput, TrainRecord};

/// The columns of a training record that do not depend on the machine's speed (its wall
/// times left out), as bits.
pub type DeterministicRow = (
    usize,
    u64,
    u64,
    u64,
    u64,
    u64,
    Option<u64>,
    Option<u64>,
    Option<u64>,
);

/// `r`'s [`DeterministicRow`].
pub fn deterministic(r: &TrainRecord) -> DeterministicRow {
    (
        r.step,
        r.examples_seen,
        r.train_loss.to_bits(),
        r.lr.to_bits(),
        r.bytes_sent,
        r.bytes_received,
        r.sim_time_s.map(f64::to_bits),
        r.sim_comm_s.map(f64::to_bits),
        r.sim_idle_s.map(f64::to_bits),
    )
}

/// Asserts that two runs ended in the same state, bit for bit: the final model and master,
/// the fault timeline and its ledgers, the traffic and the simulated clocks. `what` names
/// the comparison in a failure.
pub fn assert_same_end<M: Module>(what: &str, a: &FitOutput<M>, b: &FitOutput<M>) {
    assert_eq!(
        flat_params(&a.model),
        flat_params(&b.model),
        "{what}: model"
    );
    assert_eq!(
        a.master.as_ref().map(flat_params),
        b.master.as_ref().map(flat_params),
        "{what}: master"
    );
    assert_eq!(a.report.elastic, b.report.elastic, "{what}: faults");
    assert_eq!(a.report.comm, b.report.comm, "{what}: traffic");
    assert_eq!(
        a.report.simulated, b.report.simulated,
        "{what}: simulated clocks"
    );
}

/// [`assert_same_end`], and the same records on the way: every training record's
/// [`deterministic`] columns, the validation and correlation records and the data's
/// fingerprint.
pub fn assert_same_run<M: Module>(what: &str, a: &FitOutput<M>, b: &FitOutput<M>) {
    assert_same_end(what, a, b);
    let rows = |o: &FitOutput<M>| o.report.train.iter().map(deterministic).collect::<Vec<_>>();
    assert_eq!(rows(a), rows(b), "{what}: train records");
    assert_eq!(
        a.report.validation, b.report.validation,
        "{what}: validation records"
    );
    assert_eq!(
        a.report.correlation, b.report.correlation,
        "{what}: correlation records"
    );
    assert_eq!(
        a.report.data_fingerprint, b.report.data_fingerprint,
        "{what}: data"
    );
}
