//! The system side of an emulated cluster: namespaces, links and their shaping, through
//! iproute2's `ip` and `tc`.

use super::Unavailable;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a host may take to reach the first one after the links come up.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether this machine can build a cluster (see [`super::EmulatedCluster::check`]).
pub fn check() -> Result<(), Unavailable> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Unavailable(
            "it needs root (network namespaces and tc); run as root or under sudo".into(),
        ));
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("unshare", "util-linux"),
        ("mpirun", "openmpi-bin"),
    ] {
        if !on_path(tool) {
            return Err(Unavailable(format!(
                "`{tool}` not found (apt-get install {package})"
            )));
        }
    }
    // A name of its own: two threads of one process may check at once.
    let probe = format!("exo-{}-probe{}", std::process::id(), super::unique());
    add(&probe).map_err(|e| Unavailable(format!("cannot make a network namespace: {e}")))?;
    let shaped = run_tc(&probe, "lo", 1e6, "add");
    delete(&probe);
    shaped.map_err(|e| Unavailable(format!("tc's tbf does not work here: {e}")))
}

/// Deletes the namespaces of clusters whose process no longer runs (killed before it
/// could tear its cluster down).
pub fn remove_orphans() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix("exo-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete(name);
        }
    }
}

/// Makes network namespace `name`.
pub fn add(name: &str) -> Result<(), String> {
    run(&["netns", "add", name])
}

/// Kills what still runs in namespace `name` (a job cut off mid-run), then deletes it and
/// its interfaces. Errors are ignored: it is cleaning up.
pub fn delete(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// Runs `ip ARGS`.
pub fn run(args: &[&str]) -> Result<(), String> {
    checked(Command::new("ip").args(args), "ip", args)
}

/// Shapes the egress of `dev` in namespace `ns` to `bits_per_s` (a token bucket).
pub fn shape(ns: &str, dev: &str, bits_per_s: f64) -> Result<(), String> {
    run_tc(ns, dev, bits_per_s, "replace")
}

/// The pacing bucket's rate over the link's (tbf wants it above the rate).
const PEAK_OVER_RATE: f64 = 1.01;

/// The fastest link whose bursts are paced (see [`tbf`]).
const MAX_PACED_BITS_PER_S: f64 = 100e6;

fn run_tc(ns: &str, dev: &str, bits_per_s: f64, verb: &str) -> Result<(), String> {
    let mut args: Vec<String> = ["-n", ns, "qdisc", verb, "dev", dev, "root"]
        .map(String::from)
        .to_vec();
    args.extend(tbf(bits_per_s));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    checked(Command::new("tc").args(&args), "tc", &args)
}

/// The token-bucket qdisc of a link of `bits_per_s`, as `tc` takes it after `root`.
fn tbf(bits_per_s: f64) -> Vec<String> {
    // A bucket of 2 ms at the rate, at least 64 KiB. Smaller ones cost TCP throughput: the
    // MLP's all-reduce over 2 hosts at 20 Mbit/s took 1.15 times the simulated clock with
    // 16 or 32 KiB, 1.05 with 64 or 128 KiB. A queue of up to 400 ms, so that TCP is not cut
    // short by drops (a 50 ms queue was slower).
    let burst = ((bits_per_s / 8.0 * 2e-3) as u64).max(64 * 1024);
    let mut args = vec![
        "tbf".to_string(),
        "rate".into(),
        format!("{}bit", bits_per_s.round() as u64),
        "burst".into(),
        burst.to_string(),
        "latency".into(),
        "400ms".into(),
    ];
    // The bucket alone lets its 64 KiB leave at memory speed after an idle spell (DeMo's
    // 36 KB per host and step were never paced). A second bucket of one packet at 1% over
    // the rate paces that burst too: 20 KB took 0.3 ms at 20 Mbit/s, and takes 7.7 ms (the
    // rate's 8.0), with bulk transfers as fast as before. Up to 100 Mbit/s: above, pacing
    // packet by packet outruns the kernel's timers here (300 Mbit/s delivered 217).
    if bits_per_s <= MAX_PACED_BITS_PER_S {
        let peak = format!("{}bit", (bits_per_s * PEAK_OVER_RATE).round() as u64);
        args.extend(["peakrate".into(), peak, "mtu".into(), "2000".into()]);
    }
    args
}

/// The bytes sent and received on `eth0` in namespace `ns`.
pub fn link_bytes(ns: &str) -> Result<super::LinkBytes, String> {
    let read = |what: &str| -> Result<u64, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat"])
            .arg(format!("/sys/class/net/eth0/statistics/{what}"))
            .output()
            .map_err(|e| format!("reading {ns}'s counters: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| format!("{ns}'s {what}: {e}"))
    };
    Ok(super::LinkBytes {
        sent: read("tx_bytes")?,
        received: read("rx_bytes")?,
    })
}

/// Waits until a TCP connection from namespace `ns` to `address` is answered (a refusal
/// counts: the address is reachable).
pub fn wait_reachable(ns: &str, address: &str) -> Result<(), String> {
    let target: SocketAddr = format!("{address}:9")
        .parse()
        .map_err(|e| format!("{address}: {e}"))?;
    let path = format!("/var/run/netns/{ns}");
    let ns = ns.to_string();
    // A thread of its own enters the namespace, and ends with it.
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: the descriptor is open for the call; only this thread changes namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!(
                "entering {ns}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let start = Instant::now();
        loop {
            match TcpStream::connect_timeout(&target, Duration::from_millis(300)) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(()),
                Err(e) if start.elapsed() > REACH_TIMEOUT => {
                    return Err(format!("{ns} cannot reach {target}: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    })
    .join()
    .map_err(|_| "the reachability probe panicked".to_string())?
}

fn checked(command: &mut Command, tool: &str, args: &[&str]) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{tool}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{tool} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

#[cfg(test)]
mod tests {
    use super::tbf;

    #[test]
    fn links_up_to_100_mbit_pace_their_burst_and_faster_ones_do_not() {
        let slow = tbf(20e6).join(" ");
        assert_eq!(
            slow,
            "tbf rate 20000000bit burst 65536 latency 400ms peakrate 20200000bit mtu 2000"
        );
        assert!(tbf(100e6).join(" ").contains("peakrate 101000000bit"));
        assert_eq!(
            tbf(1e9).join(" "),
            "tbf rate 1000000000bit burst 250000 latency 400ms"
        );
    }
}
