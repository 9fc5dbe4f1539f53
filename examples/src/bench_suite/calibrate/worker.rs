//! The calibration's MPI jobs: `mpirun` of this binary's `--calibrate-worker`, and the
//! worker itself (with the `mpi` feature).

use super::{CalibrateArgs, CalibrateConfig, Timing};
use crate::bench_suite::SuiteCollective;
use std::process::Command;

/// Bytes in a MiB (the worker's sizes are whole MiB).
const MIB_BYTES: usize = 1 << 20;
#[cfg(feature = "mpi")]
use {
    super::fit::{MIB, calls_for, sizes},
    crate::runner::BoxError,
    gym_core::ReduceOp,
};

/// Runs `P` workers under `mpirun` timing `ops` (on `P` emulated hosts with
/// `--calibrate-rate`, one each; on this host otherwise), and reads rank 0's lines.
pub(super) fn run_workers(
    config: &CalibrateConfig,
    processes: usize,
    ops: &[SuiteCollective],
) -> Result<Vec<Timing>, String> {
    let a = &config.args;
    let names: Vec<&str> = ops.iter().map(|o| o.name()).collect();
    let worker = [
        "--calibrate-worker".to_string(),
        processes.to_string(),
        "--calibrate-ops".into(),
        names.join(","),
        "--calibrate-max-mib".into(),
        (a.max_bytes() / MIB_BYTES).max(1).to_string(),
        "--calibrate-reps".into(),
        a.reps().to_string(),
        "--calibrate-allgather-max-mib".into(),
        a.calibrate_allgather_max_mib.to_string(),
    ];
    let out = match a.calibrate_rate {
        Some(rate) => {
            let cluster = crate::cluster::EmulatedCluster::up(&vec![rate; processes])
                .map_err(|e| e.to_string())?;
            cluster
                .mpirun(1)
                .command(&config.exe, &worker)
                .output()
                .map_err(|e| format!("mpirun on the emulated hosts: {e}"))?
        }
        None => Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(processes.to_string())
            .arg(&config.exe)
            .args(worker)
            .output()
            .map_err(|e| format!("mpirun: {e} (apt-get install openmpi-bin)"))?,
    };
    if !out.status.success() {
        return Err(format!(
            "mpirun -np {processes} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let timings = parse_timings(&String::from_utf8_lossy(&out.stdout))?;
    if timings.is_empty() {
        return Err("no timings from rank 0".into());
    }
    Ok(timings)
}

/// The worker's `calibrate-timing OP BYTES CALLS SECONDS` lines.
fn parse_timings(stdout: &str) -> Result<Vec<Timing>, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("calibrate-timing "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let bad = || format!("a worker's line `{l}`");
            if f.len() != 4 {
                return Err(bad());
            }
            Ok(Timing {
                op: CalibrateArgs::ops(&[f[0].to_string()])?[0],
                bytes: f[1].parse().map_err(|_| bad())?,
                calls: f[2].parse().map_err(|_| bad())?,
                seconds: f[3].parse().map_err(|_| bad())?,
            })
        })
        .collect()
}

#[cfg(feature = "mpi")]
/// Untimed calls before the timed ones (connections, first-touch page faults).
fn warmups_for(bytes: usize) -> usize {
    if bytes >= 64 * MIB { 1 } else { 3 }
}

/// One process of the calibration (run by `mpirun`, one node per process): times each of
/// `--calibrate-ops` at each size and rank 0 prints `calibrate-timing OP BYTES CALLS S`,
/// `S` the median over the timed calls of the slowest rank's seconds.
#[cfg(feature = "mpi")]
pub fn worker(args: &CalibrateArgs, processes: usize) -> Result<(), BoxError> {
    use burn::tensor::{Device, Tensor, TensorData};
    use gym_core::{Collective, MpiTransport, Transport};
    use std::time::{Duration, Instant};

    let ops = CalibrateArgs::ops(&args.calibrate_ops)?;
    let transport =
        std::sync::Arc::new(MpiTransport::init(processes)?.with_timeout(Duration::from_secs(300)));
    let rank = transport.local_ranks().start;
    let comm = Collective::new(transport, rank, None);
    let device = Device::default();
    for &op in &ops {
        for bytes in sizes(args.max_bytes()) {
            if op == SuiteCollective::AllGather && bytes > args.calibrate_allgather_max_mib * MIB {
                continue;
            }
            let n = bytes / 4;
            let host = vec![rank as f32 + 1.0; n];
            let (warm, calls) = (warmups_for(bytes), calls_for(bytes, args.calibrate_reps));
            let mut times = Vec::with_capacity(calls);
            for call in 0..warm + calls {
                // A fresh tensor, made before the clock starts (an all-reduce consumes it).
                let tensor = Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device);
                comm.barrier()?;
                let start = Instant::now();
                // The clock stops before the result is dropped.
                let elapsed = match op {
                    SuiteCollective::AllReduce => {
                        let r = comm.all_reduce(tensor, ReduceOp::Mean);
                        let t = start.elapsed();
                        r?;
                        t
                    }
                    SuiteCollective::Broadcast => {
                        let r = comm.broadcast(tensor, 0);
                        let t = start.elapsed();
                        r?;
                        t
                    }
                    SuiteCollective::AllGather => {
                        let r = comm.all_gather(tensor);
                        let t = start.elapsed();
                        r?;
                        t
                    }
                };
                if call >= warm {
                    times.push(elapsed.as_secs_f64());
                }
            }
            // Each call's slowest rank.
            let mine: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
            let all = comm.all_gather_bytes(mine)?;
            let slowest: Vec<f64> = (0..calls)
                .map(|i| {
                    all.iter()
                        .map(|b| {
                            f64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
                        })
                        .fold(0.0, f64::max)
                })
                .collect();
            if rank == 0 {
                println!(
                    "calibrate-timing {} {bytes} {calls} {:e}",
                    op.name(),
                    crate::bench_suite::median(slowest)
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_lines_parse_and_bad_ones_are_errors() {
        let t = parse_timings("noise\ncalibrate-timing allreduce 1024 15 1.5e-5\n").unwrap();
        assert_eq!(
            t,
            vec![Timing {
                op: SuiteCollective::AllReduce,
                bytes: 1024,
                calls: 15,
                seconds: 1.5e-5
            }]
        );
        assert!(parse_timings("calibrate-timing scatter 1 1 1").is_err());
        assert!(parse_timings("calibrate-timing allreduce x 1 1").is_err());
    }
}
