//! The MPI transport against the thread transport: the same calls give the same bits and
//! the same byte counts, with one node per process and with two; `Trainer::fit_with` on
//! the MPI transport trains the MNIST MLP as `Trainer::fit` does in one process, under
//! `mpirun -n 2` (two nodes per process) and `mpirun -n 4` (one each); a node count the
//! processes do not divide is refused; a killed process ends the job with an error naming
//! it.
//!
//! `cargo test --release -p tests --features mpi -- mpi`. Each test launches this test
//! binary under `mpirun` with the `#[ignore]`d worker below selected, so Open MPI's `mpirun`
//! must be on the `PATH`.
#![cfg(feature = "mpi")]

use gym_core::comm::run_on_threads;
use gym_core::{Collective, CollectiveError, Group, InProcessGroup, MpiTransport, ReduceOp};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tests::{host, rank_values, run_digest, shared_data, spread_cases, spread_config, vector};

/// MNIST for the training cases: the shared copy, and the digits as the examples read them.
fn mnist() -> gym_core::NodeData<gym_data::MnistItem> {
    use gym_data::{MnistDataset, MnistSplit};
    let dir = shared_data("mnist");
    gym_core::NodeData::shared(
        MnistDataset::load(&dir, MnistSplit::Train).expect("MNIST train"),
        MnistDataset::load(&dir, MnistSplit::Test).expect("MNIST test"),
    )
}

/// The training cases' configuration: 20 steps of 16 images, evaluations over 64.
fn mnist_config(simulated: bool) -> gym_core::TrainerConfig {
    spread_config(RANKS, 20, 16, 64, simulated)
}

fn mnist_mlp(device: &burn::tensor::Device) -> gym_models::Mlp {
    gym_models::MlpConfig::new().init(device)
}

/// Nodes in every job but one; `mpirun` starts 4 or 2 processes for them.
const RANKS: usize = 4;
/// The nodes of a `calls` job, when not [`RANKS`] (set by the launching test).
const RANKS_ENV: &str = "GYM_MPI_TEST_RANKS";
/// Where a worker writes its results (set by the launching test).
const OUT_ENV: &str = "GYM_MPI_TEST_OUT";
/// What a worker does: `calls`, `fit`, `crash` or `hang`.
const MODE_ENV: &str = "GYM_MPI_TEST_MODE";

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The calls both collectives make, from rank `c.rank()`: every result as bit patterns,
/// then the byte counters.
fn calls(c: &Collective) -> Result<Vec<Vec<u32>>, CollectiveError> {
    let r = c.rank();
    let mut out = Vec::new();
    // One chunk; several (a fold schedule cuts any tensor into 64 or more); several in
    // shared memory's 1 MiB messages as well.
    for n in [257, 100_003, 1_000_003] {
        out.push(bits(&host(
            c.all_reduce(vector(rank_values(r, n)), ReduceOp::Sum)?,
        )));
        out.push(bits(&host(
            c.all_reduce(vector(rank_values(r, n)), ReduceOp::Mean)?,
        )));
    }
    out.push(bits(&host(c.broadcast(vector(rank_values(r, 33)), 2)?)));
    for t in c.all_gather(vector(rank_values(r, 10)))? {
        out.push(bits(&host(t)));
    }
    let mine: Vec<u8> = (0..7).map(|i| (10 * r + i) as u8).collect();
    for b in c.all_gather_bytes(mine)? {
        out.push(b.into_iter().map(u32::from).collect());
    }
    // Only the root's buffer counts; the others pass buffers of other lengths.
    let state: Vec<u8> = (0..1000 + r).map(|i| (i * (r + 1)) as u8).collect();
    let got = c.broadcast_bytes_in(&c.world(), state, 1)?;
    out.push(got.into_iter().map(u32::from).collect());
    // Two islands reduce at once, each over its own communicator.
    let island = Group::new((0..c.world_size()).filter(|i| i % 2 == r % 2));
    out.push(bits(&host(c.all_reduce_in(
        &island,
        vector(rank_values(r, 50_000)),
        ReduceOp::Mean,
    )?)));
    // Pairs of neighbours: inside one process when it runs two nodes.
    let pair = Group::new([r - r % 2, r - r % 2 + 1]);
    for t in c.all_gather_in(&pair, vector(rank_values(r, 9)))? {
        out.push(bits(&host(t)));
    }
    out.push(bits(&host(c.all_reduce_in(
        &pair,
        vector(rank_values(r, 20_000)),
        ReduceOp::Sum,
    )?)));
    c.barrier()?;
    Ok(out)
}

/// The worker: run by `mpirun`, each process running its share of the `RANKS` nodes.
#[test]
#[ignore = "run under mpirun by the tests below"]
fn mpi_worker() {
    let Some(out) = std::env::var_os(OUT_ENV).map(PathBuf::from) else {
        return;
    };
    let mode = std::env::var(MODE_ENV).unwrap_or_default();
    // Training waits for the slowest process to load MNIST: a longer leash.
    let timeout = Duration::from_secs(if mode == "fit" { 120 } else { 2 });
    let ranks = std::env::var(RANKS_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(RANKS);
    let transport = match MpiTransport::init(ranks) {
        Ok(t) => Arc::new(t.with_timeout(timeout)),
        Err(e) => {
            eprintln!("refused: {e}");
            std::process::exit(3);
        }
    };
    let process = transport.process();
    let handles: Vec<Collective> = gym_core::Transport::local_ranks(&*transport)
        .map(|rank| Collective::new(transport.clone(), rank, None))
        .collect();
    match mode.as_str() {
        "fit" => {
            let data = mnist();
            let mut digests = serde_json::Map::new();
            for (name, strategy, simulated) in spread_cases() {
                let out = gym_core::Trainer::new(mnist_config(simulated))
                    .fit_with(
                        transport.clone(),
                        mnist_mlp,
                        strategy.as_ref(),
                        &data,
                        &gym_data::MnistBatcher,
                    )
                    .expect("the process trains");
                digests.insert(name.into(), run_digest(&out));
            }
            let text = serde_json::Value::Object(digests).to_string();
            std::fs::write(out.join(format!("process{process}.json")), text).unwrap();
        }
        "hang" => {
            // Rank 1 never calls; the others must give up rather than wait for ever.
            run_on_threads(&handles, |c| {
                if c.rank() == 1 {
                    std::thread::sleep(Duration::from_secs(120));
                }
                let _ = c.all_reduce(vector(rank_values(c.rank(), 1000)), ReduceOp::Sum);
                std::thread::sleep(Duration::from_secs(120));
            })
            .unwrap();
        }
        "crash" => {
            if process == 2 {
                std::thread::sleep(Duration::from_millis(300));
                // SIGKILL: no unwinding, no MPI_Abort; the process is simply gone.
                let _ = Command::new("kill")
                    .args(["-9", &std::process::id().to_string()])
                    .status();
                std::thread::sleep(Duration::from_secs(60));
            }
            // The others wait for it in a collective; they must not hang.
            run_on_threads(&handles, |c| {
                let _ = c.all_reduce(vector(rank_values(c.rank(), 1000)), ReduceOp::Sum);
                std::thread::sleep(Duration::from_secs(120));
            })
            .unwrap();
        }
        _ => {
            let results = run_on_threads(&handles, |c| {
                let rank = c.rank();
                let results = calls(&c).expect("the calls succeed");
                let mismatch = c
                    .all_reduce(
                        vector(rank_values(rank, 10 + usize::from(rank == 3))),
                        ReduceOp::Sum,
                    )
                    .err()
                    .map(|e| e.to_string());
                let stats = c.stats();
                let json = serde_json::json!({
                    "results": results,
                    "mismatch": mismatch,
                    "bytes_sent": stats.bytes_sent,
                    "bytes_received": stats.bytes_received,
                    "all_reduce_calls": stats.all_reduce_calls,
                });
                std::fs::write(out.join(format!("rank{rank}.json")), json.to_string()).unwrap();
            })
            .unwrap();
            assert!(results.iter().all(Result::is_ok));
        }
    }
}

/// One `mpirun` job at a time: jobs started together by the test harness's threads can
/// fail to wire up their TCP connections.
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the worker on `processes` processes under `mpirun`, with `mode`, writing into `out`;
/// `extra` goes to `mpirun` (a hostfile, transports).
fn mpirun(mode: &str, processes: usize, out: &Path, extra: &[&str]) -> Output {
    mpirun_nodes(mode, processes, RANKS, out, extra)
}

/// [`mpirun`] with `ranks` nodes.
fn mpirun_nodes(mode: &str, processes: usize, ranks: usize, out: &Path, extra: &[&str]) -> Output {
    let exe = std::env::current_exe().expect("the test binary");
    let _one = ONE_JOB.lock().unwrap_or_else(|p| p.into_inner());
    Command::new("mpirun")
        .args(extra)
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(processes.to_string())
        .args(["-x", OUT_ENV, "-x", MODE_ENV, "-x", RANKS_ENV])
        .arg(exe)
        .args([
            "--exact",
            "mpi_worker",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(OUT_ENV, out)
        .env(MODE_ENV, mode)
        .env(RANKS_ENV, ranks.to_string())
        .output()
        .expect("mpirun runs (install Open MPI: apt-get install openmpi-bin libopenmpi-dev)")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-mpi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the calls under `mpirun` on `processes` processes (with `extra`) and checks every
/// rank's results and counters against the in-process group's.
fn same_as_in_process(name: &str, processes: usize, extra: &[&str]) {
    same_as_in_process_with(name, processes, RANKS, extra)
}

/// [`same_as_in_process`] with `ranks` nodes.
fn same_as_in_process_with(name: &str, processes: usize, ranks: usize, extra: &[&str]) {
    let out = scratch(name);
    let run = mpirun_nodes("calls", processes, ranks, &out, extra);
    assert!(
        run.status.success(),
        "mpirun failed: {}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let group = InProcessGroup::new(ranks);
    let reference = group
        .run(|c| {
            let results = calls(&c).unwrap();
            (results, c.stats())
        })
        .unwrap();
    for (rank, expected) in reference.into_iter().enumerate() {
        let (results, stats) = expected.unwrap();
        let text = std::fs::read_to_string(out.join(format!("rank{rank}.json"))).unwrap();
        let got: serde_json::Value = serde_json::from_str(&text).unwrap();
        let got_results: Vec<Vec<u32>> = serde_json::from_value(got["results"].clone()).unwrap();
        assert_eq!(
            got_results.len(),
            results.len(),
            "rank {rank}: result count"
        );
        for (i, (g, e)) in got_results.iter().zip(&results).enumerate() {
            assert!(
                g == e,
                "{name}, rank {rank}: result {i} differs from the in-process group's"
            );
        }
        assert_eq!(
            got["bytes_sent"], stats.bytes_sent,
            "rank {rank}: bytes sent"
        );
        assert_eq!(got["bytes_received"], stats.bytes_received, "rank {rank}");
        assert_eq!(
            got["all_reduce_calls"], stats.all_reduce_calls,
            "rank {rank}"
        );
        // Rank 3 called with another size: every rank gets the mismatch, naming it.
        let mismatch = got["mismatch"].as_str().unwrap_or_default();
        assert!(
            mismatch.contains("rank 3"),
            "rank {rank}: expected a mismatch naming rank 3, got {mismatch:?}"
        );
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn mpi_transport_gives_the_thread_transports_bits_and_byte_counts() {
    same_as_in_process("calls4", 4, &[]);
    // Two nodes per process: calls inside a process and across, islands concurrently.
    same_as_in_process("calls2", 2, &[]);
    // Two nodes on each of four processes: the world's all-reduce runs by a fold
    // schedule, several routes over the chunks of the largest tensor (the islands, one
    // node per process, as a reduce-scatter).
    same_as_in_process_with("calls8", 4, 8, &[]);
}

/// `mpirun -n 4` and `mpirun -n 2`: the MNIST MLP under AllReduce, DiLoCo (on a simulated
/// network) and DeMo for 20 steps, one and two nodes per process, gives every process the
/// bits of the in-process run: final model and master, every logged loss, traffic,
/// simulated clocks.
#[test]
fn mpi_fit_trains_the_mnist_mlp_as_the_in_process_run() {
    trains_as_in_process("fit4", 4, &[]);
    trains_as_in_process("fit2", 2, &[]);
}

/// A node count the processes do not divide is refused before any step, naming both.
#[test]
fn mpi_a_node_count_the_processes_do_not_divide_is_refused() {
    let out = scratch("indivisible");
    let run = mpirun("calls", 3, &out, &[]);
    let printed =
        String::from_utf8_lossy(&run.stderr).to_string() + &String::from_utf8_lossy(&run.stdout);
    assert!(!run.status.success(), "{printed}");
    assert!(
        printed.contains("4 nodes cannot be spread evenly over the 3 processes"),
        "{printed}"
    );
    std::fs::remove_dir_all(&out).ok();
}

/// Runs the training cases under `mpirun` on `processes` processes (with `extra`) and
/// checks every process's run against the in-process run, bit for bit.
fn trains_as_in_process(name: &str, processes: usize, extra: &[&str]) {
    let out = scratch(name);
    let run = mpirun("fit", processes, &out, extra);
    assert!(
        run.status.success(),
        "mpirun failed: {}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let data = mnist();
    for (case, strategy, simulated) in spread_cases() {
        let whole = gym_core::Trainer::new(mnist_config(simulated))
            .fit(mnist_mlp, strategy.as_ref(), &data, &gym_data::MnistBatcher)
            .unwrap();
        assert_eq!(whole.report.simulated.is_empty(), !simulated, "{case}");
        let expected = run_digest(&whole);
        for process in 0..processes {
            let file = out.join(format!("process{process}.json"));
            let got: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
            assert!(
                got[case] == expected,
                "{case}, process {process} of {processes}: the MPI run differs from the \
                 in-process run"
            );
        }
    }
    std::fs::remove_dir_all(&out).ok();
}

/// Two hosts on one machine: a hostfile naming 127.0.0.2 and 127.0.0.3 (loopback
/// addresses no interface claims, so Open MPI takes them for other machines), two slots
/// each, ranks placed across them. `mpirun` starts a daemon on each "host" through its
/// remote-shell agent (here a stand-in for ssh that runs the command locally, logging each
/// host it was asked for), and MPI's TCP transport carries every byte between the ranks:
/// the collective calls, then the training cases.
#[test]
fn mpi_two_hosts_over_tcp_on_loopback_give_the_same_bits() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("hosts");
    let hostfile = dir.join("hostfile");
    std::fs::write(&hostfile, "127.0.0.2 slots=2\n127.0.0.3 slots=2\n").unwrap();
    let agent = dir.join("fake-ssh");
    let log = dir.join("agent.log");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n\
             # Stands in for ssh: runs the command here, whatever the host.\n\
             while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n\
             echo \"$1\" >> '{}'\n\
             # Each host's daemon its own session directory, as on two machines: two\n\
             # daemons of one job on one machine race to create the same one.\n\
             OMPI_MCA_orte_tmpdir_base='{}/session-'\"$1\"\n\
             export OMPI_MCA_orte_tmpdir_base\n\
             mkdir -p \"$OMPI_MCA_orte_tmpdir_base\"\n\
             shift\n\
             exec sh -c \"$*\"\n",
            log.display(),
            dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (hostfile, agent) = (hostfile.to_string_lossy(), agent.to_string_lossy());
    let transport = [
        "--hostfile",
        &hostfile,
        "--mca",
        "plm_rsh_agent",
        &agent,
        "--mca",
        "btl",
        "tcp,self",
        // Loopback only: the "hosts" are addresses on it.
        "--mca",
        "btl_tcp_if_include",
        "lo",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        // Two daemons on one machine would both write hwloc's shared-memory topology
        // at one address (a crash in Open MPI 4.1's orted); no binding needs it.
        "--mca",
        "rtc",
        "^hwloc",
        "--bind-to",
        "none",
        "--map-by",
        "node",
    ];
    same_as_in_process("tcp", 4, &transport);
    // And the training cases, each node its own process, two "hosts".
    trains_as_in_process("tcp-fit", 4, &transport);
    let mut hosts: Vec<String> = std::fs::read_to_string(&log)
        .expect("mpirun launched through the agent")
        .lines()
        .map(str::to_string)
        .collect();
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts, ["127.0.0.2", "127.0.0.3"], "one daemon per host");
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs the worker in `mode`, which must make the job fail within 30 s; returns what
/// `mpirun` and the ranks printed.
fn failing_job(mode: &str) -> String {
    let out = scratch(mode);
    let start = Instant::now();
    let run = mpirun(mode, RANKS, &out, &[]);
    let took = start.elapsed();
    let printed =
        String::from_utf8_lossy(&run.stderr).to_string() + &String::from_utf8_lossy(&run.stdout);
    assert!(!run.status.success(), "the job must fail: {printed}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {printed}");
    std::fs::remove_dir_all(&out).ok();
    printed
}

#[test]
fn mpi_a_killed_process_ends_the_job_with_an_error_naming_it() {
    let printed = failing_job("crash");
    assert!(
        printed.contains("rank 2"),
        "mpirun's report names the killed rank: {printed}"
    );
}

#[test]
fn mpi_a_hung_process_makes_the_others_give_up_after_the_timeout() {
    let printed = failing_job("hang");
    assert!(
        printed.contains("AllReduce(Sum) in group [0, 1, 2, 3] received nothing from"),
        "a waiting rank says what it waited in: {printed}"
    );
    // Rank 1 is process 1 (one node per process): the others name it and its host.
    assert!(
        printed.contains("nothing from process 1 (host "),
        "a waiting rank names the process it waited for: {printed}"
    );
}
