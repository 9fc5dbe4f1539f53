//! `bench --calibrate` end to end, in a tiny configuration (1 KiB to 1 MiB, 3 calls a size):
//! under `mpirun` with the `mpi` feature (CI: `--features mpi --test calibrate -- mpi`), and
//! its refusal in a build without it.

use std::process::Command;

#[cfg(feature = "mpi")]
#[test]
fn calibrate_under_mpirun_writes_a_network_file_and_checks_it() {
    let scratch = std::env::temp_dir().join(format!("gym-calibrate-mpi-{}", std::process::id()));
    let (file, json) = (scratch.join("net.toml"), scratch.join("calibrate.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "--calibrate",
            "--calibrate-max-mib",
            "1",
            "--calibrate-reps",
            "3",
        ])
        .args(["--calibrate-check-ops", "allreduce,broadcast"])
        .arg("--out")
        .arg(&file)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec = stdout
        .lines()
        .find_map(|l| l.strip_prefix("calibrated link: --network "))
        .expect("the link spec is printed");
    let link: gym_core::Link = spec.parse().expect("the spec parses");
    assert!(link.latency_s >= 0.0 && link.bandwidth() > 0.0, "{link:?}");
    assert!(stdout.contains("**Calibration: the check.**"), "{stdout}");
    assert!(stdout.contains("| allreduce | 1 MiB | 3 |"), "{stdout}");

    let net: toml::Table = std::fs::read_to_string(&file).unwrap().parse().unwrap();
    assert!(
        net["title"]
            .as_str()
            .unwrap()
            .starts_with("calibrated: MPI transport on ")
    );
    assert!(
        net["source"]
            .as_str()
            .unwrap()
            .contains("k = 2 processes, sizes 1 KiB..1 MiB")
    );
    assert_eq!(net["nodes"][0]["count"].as_integer(), Some(4));
    let gbit = net["bandwidth_gbit"][0][0].as_float().unwrap();
    assert!((gbit * 1e9 / 8.0 / link.bandwidth() - 1.0).abs() < 1e-5);

    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in [
        "calib_latency_us",
        "calib_bandwidth_gbit",
        "calib_fit_allreduce_1kib_measured_s",
        "calib_check_allreduce_1mib_ratio",
        "calib_check_broadcast_1mib_predicted_s",
        "calib_check_allreduce_goal_met",
    ] {
        assert!(figures[key].is_number(), "{key}: {figures}");
    }
    // The figures name the file's link; the α-β line through the timings stands beside it.
    let figure = figures["calib_bandwidth_gbit"].as_f64().unwrap();
    assert!(
        (figure / gbit - 1.0).abs() < 1e-9,
        "{figure} against {gbit}"
    );
    assert!(
        figures["calib_line_bandwidth_gbit"].is_number(),
        "{figures}"
    );
    std::fs::remove_dir_all(&scratch).ok();
}

#[cfg(not(feature = "mpi"))]
#[test]
fn calibrate_in_a_build_without_mpi_says_how_to_build_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--calibrate", "--out", "/nonexistent/never-written.toml"])
        .output()
        .expect("bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--features mpi"), "{stderr}");
}
