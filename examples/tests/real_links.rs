//! The simulated clock against real links: MPI jobs of `mnist` across emulated hosts whose
//! links have a set bandwidth (network namespaces, `tc tbf`; see `examples::cluster`).
//!
//! Needs root, iproute2 and Open MPI, and a build with the `mpi` feature:
//! `cargo test --release -p examples --features mpi --test real_links`. Where an emulated
//! cluster cannot be built (not root, no `tc`), each test says why and passes without
//! running: CI runs them as root.

#![cfg(feature = "mpi")]

use examples::bench_suite::real_links::{self, Case, Inputs, Model, WIRE_TOLERANCE};
use examples::cluster::{EmulatedCluster, HostLink};
use std::path::PathBuf;

/// Why this machine cannot run the tests, printed; `None` where it can.
fn unavailable() -> Option<String> {
    EmulatedCluster::check().err().map(|e| {
        let why = format!("skipped: {e}");
        eprintln!("{why}");
        why
    })
}

fn inputs(name: &str) -> Inputs {
    let log_dir =
        std::env::temp_dir().join(format!("gym-real-links-{name}-{}", std::process::id()));
    Inputs {
        bin_dir: PathBuf::from(env!("CARGO_BIN_EXE_mnist"))
            .parent()
            .expect("the binaries' folder")
            .to_path_buf(),
        mnist_dir: tests::shared_data("mnist"),
        text_dir: tests::shared_data("shakespeare"),
        log_dir,
    }
}

/// AllReduce of the MNIST MLP on 2 hosts at 20 Mbit/s and on 4 at 100 Mbit/s: each run's
/// wall seconds per step within its band of its simulated seconds, and the bytes that
/// crossed the hosts' links within 15% of the bytes the run counted.
#[test]
fn mpi_real_links_hold_the_simulated_clock_on_two_and_four_hosts() {
    if unavailable().is_some() {
        return;
    }
    let inputs = inputs("ci");
    for case in real_links::ci_grid() {
        let m = real_links::run_case(&case, &inputs).unwrap();
        let (lo, hi) = m.band();
        assert!(
            m.within(),
            "{}: real {:.4} s/step against simulated {:.4}: {:.3}, outside {lo}–{hi}",
            case.name,
            m.real_s,
            m.simulated_s,
            m.ratio()
        );
        assert!(
            (m.wire_ratio() - 1.0).abs() <= WIRE_TOLERANCE,
            "{}: {:.0} bytes on the wire against {:.0} counted",
            case.name,
            m.wire_bytes,
            m.counted_bytes + m.observer_bytes
        );
        // Not vacuous: the link carried the run's megabytes.
        assert!(m.wire_bytes > 5e6, "{}: {} bytes", case.name, m.wire_bytes);
    }
    std::fs::remove_dir_all(&inputs.log_dir).ok();
}

/// A case on hosts that do not exist here is refused with the cluster's reason, not a hang.
#[test]
fn mpi_real_links_cases_are_named_as_the_table_names_them() {
    let case = Case::new(
        Model::Mlp,
        "allreduce",
        vec![HostLink::symmetric(20e6); 2],
        2,
    );
    assert_eq!(case.name, "mlp-allreduce-2x20m");
    assert_eq!(case.network(), "20mbit:0ms");
}
