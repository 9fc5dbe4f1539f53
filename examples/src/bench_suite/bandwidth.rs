//! Part 2 of the suite, the collectives' bandwidth: all-reduce, all-gather and broadcast of
//! an in-process group against a memcpy, and the MPI all-reduce rows (`mpirun`, and the
//! worker it starts with the `mpi` feature).

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::{InProcessGroup, ReduceOp};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::{MB, SuiteCollective, SuiteConfig, SuiteResult, median};
use crate::runner::BoxError;

/// Median seconds of copying `bytes` bytes into a buffer that is already faulted in: the
/// memory bandwidth a collective of that size is held against.
fn memcpy_seconds(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    // The warm-up touches every page of `dst`, so the timed copies move bytes only.
    dst.copy_from_slice(&src);
    let times = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(times)
}

/// Median seconds, seen by rank 0, of each operation on each size over a group of `k`,
/// in the order `sizes` × [`SuiteCollective::ALL`].
fn collective_seconds(k: usize, sizes: &[usize], reps: usize) -> Result<Vec<f64>, BoxError> {
    let group = InProcessGroup::new(k);
    let results = group.run(|comm| -> Result<Vec<f64>, String> {
        let device = Device::default();
        let rank = comm.rank();
        let mut medians = Vec::new();
        for &mb in sizes {
            let n = mb * MB / 4;
            let host = vec![rank as f32 + 1.0; n];
            let input = Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device);
            for op in SuiteCollective::ALL {
                let mut times = Vec::with_capacity(reps);
                // One warm-up call, then the timed ones.
                for rep in 0..=reps {
                    // An all-reduce consumes and may reuse its input, as a strategy's
                    // gradient would be: it gets a fresh tensor, made before the clock
                    // starts. The others only pass theirs along.
                    let tensor = match op {
                        SuiteCollective::AllReduce => {
                            Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device)
                        }
                        _ => input.clone(),
                    };
                    // Every rank enters the timed call together.
                    comm.barrier().map_err(|e| e.to_string())?;
                    let start = Instant::now();
                    // The clock stops before the result is dropped: freeing is not the call's.
                    let elapsed = match op {
                        SuiteCollective::AllReduce => {
                            let r = comm.all_reduce(tensor, ReduceOp::Mean);
                            let t = start.elapsed();
                            r.map_err(|e| e.to_string())?;
                            t
                        }
                        SuiteCollective::AllGather => {
                            let r = comm.all_gather(tensor);
                            let t = start.elapsed();
                            r.map_err(|e| e.to_string())?;
                            t
                        }
                        SuiteCollective::Broadcast => {
                            let r = comm.broadcast(tensor, 0);
                            let t = start.elapsed();
                            r.map_err(|e| e.to_string())?;
                            t
                        }
                    };
                    if rep > 0 {
                        times.push(elapsed.as_secs_f64());
                    }
                }
                medians.push(median(times));
            }
        }
        Ok(medians)
    })?;
    match results.into_iter().next() {
        Some(Ok(Ok(m))) => Ok(m),
        Some(Ok(Err(e))) | Some(Err(e)) => Err(format!("collectives over {k} ranks: {e}").into()),
        None => Err("an empty group".into()),
    }
}

/// The largest copy timed as "memcpy of the K buffers": beyond it the figure is left out
/// rather than allocating twice that much.
const MEMCPY_ALL_MAX: usize = 1024 * MB;

pub(super) fn bandwidth(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let reps = config.collective_reps.max(1);
    let mut sizes = config.collective_mb.clone();
    sizes.retain(|&s| s > 0);
    sizes.sort_unstable();
    sizes.dedup();
    let mut ks = config.collective_ks.clone();
    ks.retain(|&k| k >= 1);
    ks.sort_unstable();
    ks.dedup();
    // A copy is cheap: more repetitions steady its median.
    let copy_reps = reps.max(9);
    let mut memcpy = BTreeMap::new();
    for &mb in &sizes {
        for &k in std::iter::once(&1).chain(&ks) {
            if k * mb * MB <= MEMCPY_ALL_MAX && !memcpy.contains_key(&(mb * k)) {
                memcpy.insert(mb * k, memcpy_seconds(mb * k * MB, copy_reps));
            }
        }
    }
    let mut rows = vec![
        "| op | size (MiB) | K | ms/call | memcpy of one buffer (ms) | one buffer ÷ call | \
         memcpy of the K buffers (ms) | K buffers ÷ call |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut cells = BTreeMap::new();
    for &k in &ks {
        eprintln!("bandwidth: {k} ranks, {sizes:?} MiB …");
        let secs = collective_seconds(k, &sizes, reps)?;
        for (i, &mb) in sizes.iter().enumerate() {
            for j in 0..SuiteCollective::ALL.len() {
                let s = secs[i * SuiteCollective::ALL.len() + j];
                cells.insert((j, mb, k), s);
            }
        }
    }
    let mut headline: Option<f64> = None;
    for ((j, mb, k), s) in cells {
        let op = SuiteCollective::ALL[j];
        let name = op.name();
        let one = memcpy[&mb];
        out.figures
            .insert(format!("{name}_vs_memcpy_{mb}mb_k{k}"), one / s);
        let all = memcpy.get(&(mb * k)).copied();
        let all_cells = match all {
            Some(all) if op == SuiteCollective::AllReduce => {
                out.figures
                    .insert(format!("{name}_vs_memcpy_all_{mb}mb_k{k}"), all / s);
                if mb == 16 && k >= 2 {
                    headline = Some(headline.map_or(all / s, |h| h.min(all / s)));
                }
                format!("{:.3} | {:.3}", all * 1e3, all / s)
            }
            _ => "- | -".to_string(),
        };
        rows.push(format!(
            "| {name} | {mb} | {k} | {:.3} | {:.3} | {:.3} | {all_cells} |",
            s * 1e3,
            one * 1e3,
            one / s
        ));
    }
    if let Some(h) = headline {
        out.figures.insert("allreduce_vs_memcpy_16mb".into(), h);
    }
    if let Some(exe) = &config.mpi_bench {
        for &k in ks.iter().filter(|&&k| k >= 2) {
            eprintln!("bandwidth: MPI, {k} processes, {sizes:?} MiB …");
            match mpi_seconds(exe, k, &sizes, reps) {
                Ok(secs) => {
                    for (&mb, s) in sizes.iter().zip(secs) {
                        let one = memcpy[&mb];
                        let all = memcpy.get(&(mb * k)).copied();
                        out.figures
                            .insert(format!("mpi_allreduce_vs_memcpy_{mb}mb_k{k}"), one / s);
                        let all_cells = match all {
                            Some(all) => {
                                out.figures.insert(
                                    format!("mpi_allreduce_vs_memcpy_all_{mb}mb_k{k}"),
                                    all / s,
                                );
                                format!("{:.3} | {:.3}", all * 1e3, all / s)
                            }
                            None => "- | -".to_string(),
                        };
                        rows.push(format!(
                            "| allreduce (MPI, {k} processes) | {mb} | {k} | {:.3} | {:.3} | {:.3} | {all_cells} |",
                            s * 1e3,
                            one * 1e3,
                            one / s
                        ));
                    }
                }
                Err(e) => rows.push(format!(
                    "| allreduce (MPI) | - | {k} | error: {e} | | | | |"
                )),
            }
        }
    }
    let note = format!(
        "Each rank of an in-process group of K holds an f32 tensor of the size given; \
         ms/call is rank 0's median over {reps} call(s) after a warm-up, each starting \
         after a barrier (all-reduce: mean, of a fresh tensor; broadcast: from rank 0). \
         memcpy: median `copy_from_slice` into a buffer already faulted in, of one rank's \
         buffer and of all K ranks' buffers at once. An all-reduce must read every rank's \
         buffer: \"K buffers ÷ call\" ≥ 1 means it finishes sooner than copying them once. \
         The headline `allreduce_vs_memcpy_16mb` is the smallest \"K buffers ÷ call\" of \
         the 16 MiB all-reduces over K ≥ 2{}. All-gather and broadcast hand every rank the \
         senders' buffers themselves (shared, copy-on-write: no byte is copied), so their \
         figures measure the rendezvous only. MPI rows (a `bench` built with the `mpi` \
         feature): K processes on this host under `mpirun`, shared memory, the same \
         rank-ordered reduce-scatter and all-gather the MPI collective always uses.",
        if sizes.contains(&16) && ks.iter().any(|&k| k >= 2) {
            ""
        } else {
            " (not measured in this run)"
        }
    );
    out.push_table("Collective bandwidth", &config.command, &note, rows);
    Ok(())
}

/// Seconds (rank 0's median) of an MPI all-reduce of each size over `k` processes started
/// by `mpirun` on this host, each running `exe --mpi-bandwidth-worker K`.
fn mpi_seconds(exe: &Path, k: usize, sizes: &[usize], reps: usize) -> Result<Vec<f64>, String> {
    let sizes_arg = sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &k.to_string(),
        ])
        .arg(exe)
        .args([
            "--mpi-bandwidth-worker",
            &k.to_string(),
            "--suite-mb",
            &sizes_arg,
        ])
        .args(["--suite-reps", &reps.to_string()])
        .output()
        .map_err(|e| format!("mpirun: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mpirun exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("mpi-allreduce-seconds "))
        .ok_or("no timings from rank 0")?;
    let secs: Vec<f64> = line
        .split(',')
        .map(|x| x.trim().parse::<f64>().map_err(|e| format!("{x:?}: {e}")))
        .collect::<Result<_, _>>()?;
    if secs.len() != sizes.len() {
        return Err(format!("{} timings for {} sizes", secs.len(), sizes.len()));
    }
    Ok(secs)
}

/// One process of the MPI rows (run by `mpirun`): times the all-reduce (mean) of a fresh
/// f32 tensor of each size in MiB, `reps` times after a warm-up, each call after a
/// barrier; rank 0 prints `mpi-allreduce-seconds S1,S2,…` (the medians).
#[cfg(feature = "mpi")]
pub fn mpi_worker(nodes: usize, sizes: &[usize], reps: usize) -> Result<(), BoxError> {
    use gym_core::{Collective, MpiTransport, ReduceOp, Transport};
    let transport = std::sync::Arc::new(MpiTransport::init(nodes)?);
    let rank = transport.local_ranks().start;
    let comm = Collective::new(transport, rank, None);
    let device = Device::default();
    let mut medians = Vec::new();
    for &mb in sizes {
        let n = mb * MB / 4;
        let host = vec![comm.rank() as f32 + 1.0; n];
        let mut times = Vec::new();
        for rep in 0..=reps.max(1) {
            let tensor = Tensor::<1>::from_data(TensorData::new(host.clone(), [n]), &device);
            comm.barrier()?;
            let start = Instant::now();
            let r = comm.all_reduce(tensor, ReduceOp::Mean);
            let t = start.elapsed().as_secs_f64();
            r?;
            if rep > 0 {
                times.push(t);
            }
        }
        medians.push(median(times));
    }
    if comm.rank() == 0 {
        let line: Vec<String> = medians.iter().map(|s| format!("{s:e}")).collect();
        println!("mpi-allreduce-seconds {}", line.join(","));
    }
    Ok(())
}
