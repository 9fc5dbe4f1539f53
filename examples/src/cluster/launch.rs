//! `mpirun` across the hosts of an emulated cluster.
//!
//! `mpirun` runs on the first host; it reaches the others through a remote-shell agent
//! that stands in for ssh: given a host's address and a command, it runs the command in
//! the namespace that owns the address, under the host's name. MPI's own traffic (the
//! daemons' wiring and the job's messages) is kept to the cluster's network.

use super::{EmulatedCluster, SUBNET};
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

/// An MPI job to start on a cluster: `per_host` processes on each host, in host order
/// (processes `0..per_host` on `h1`, and so on).
pub struct Launch<'a> {
    cluster: &'a EmulatedCluster,
    per_host: usize,
    mca: Vec<(String, String)>,
}

impl<'a> Launch<'a> {
    pub(super) fn new(cluster: &'a EmulatedCluster, per_host: usize) -> Self {
        Launch {
            cluster,
            per_host: per_host.max(1),
            mca: Vec::new(),
        }
    }

    /// Sets Open MPI parameter `name` to `value` for the job (`--mca NAME VALUE`).
    pub fn mca(mut self, name: &str, value: &str) -> Self {
        self.mca.push((name.into(), value.into()));
        self
    }

    /// The number of processes of the job.
    pub fn processes(&self) -> usize {
        self.per_host * self.cluster.hosts()
    }

    /// The command that runs `program` with `args` as the job; spawn it as any other.
    pub fn command(&self, program: impl AsRef<OsStr>, args: &[impl AsRef<OsStr>]) -> Command {
        let c = self.cluster;
        let agent = self.agent().expect("the cluster's folder is writable");
        let hosts: Vec<String> = (0..c.hosts())
            .map(|i| format!("{}:{}", c.address(i), self.per_host))
            .collect();
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                &c.host_ns(0),
                "unshare",
                "--uts",
                "sh",
                "-c",
            ])
            .arg("hostname \"$0\" && exec \"$@\"")
            .arg(c.name(0))
            .arg("mpirun")
            .args(["--host", &hosts.join(",")])
            .args(["-np", &self.processes().to_string()])
            .args(["--map-by", "slot", "--bind-to", "none"]);
        let mut mca = vec![
            ("plm_rsh_agent".to_string(), agent.display().to_string()),
            // Every daemon started from the first host, through the agent.
            ("plm_rsh_no_tree_spawn".into(), "1".into()),
            // TCP between hosts, shared memory between the processes of one host.
            ("btl".into(), "tcp,vader,self".into()),
            ("btl_tcp_if_include".into(), SUBNET.into()),
            ("oob_tcp_if_include".into(), SUBNET.into()),
            // The hosts' daemons share one machine: hwloc's shared topology would be
            // written by each at one address.
            ("rtc".into(), "^hwloc".into()),
            // A host whose link is lost: mpirun learns it from its daemon's connection in
            // about 6 s (3 s idle, then 3 probes 1 s apart) and ends the job, where Open
            // MPI's defaults (300 s, 9 × 20 s) keep it waiting for 8 minutes.
            ("oob_tcp_keepalive_time".into(), "3".into()),
            ("oob_tcp_keepalive_intvl".into(), "1".into()),
            ("oob_tcp_keepalive_probes".into(), "3".into()),
        ];
        mca.extend(self.mca.iter().cloned());
        for (name, value) in mca {
            command.args(["--mca", &name, &value]);
        }
        command
            .arg(program)
            .args(args)
            .env("OMPI_MCA_orte_tmpdir_base", c.dir().join("session-h1"))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        command
    }

    /// Writes the remote-shell agent (once) and returns its path.
    fn agent(&self) -> std::io::Result<PathBuf> {
        let c = self.cluster;
        let path = c.dir().join("agent");
        if path.exists() {
            return Ok(path);
        }
        let mut cases = String::new();
        for i in 0..c.hosts() {
            cases.push_str(&format!(
                "  {}) ns={}; name={} ;;\n",
                c.address(i),
                c.host_ns(i),
                c.name(i)
            ));
        }
        let script = format!(
            "#!/bin/sh\n\
             # The emulated cluster's stand-in for ssh: runs a command on a host, i.e. in\n\
             # the network namespace that owns its address, under the host's name.\n\
             while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n\
             host=$1; shift\n\
             case \"$host\" in\n{cases}  *) echo \"emulated cluster: no host $host\" >&2; exit 255 ;;\n\
             esac\n\
             # Each host's daemon its own session folder, as on separate machines.\n\
             OMPI_MCA_orte_tmpdir_base='{dir}/session-'\"$name\"\n\
             export OMPI_MCA_orte_tmpdir_base\n\
             mkdir -p \"$OMPI_MCA_orte_tmpdir_base\"\n\
             exec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $name && $*\"\n",
            dir = c.dir().display()
        );
        std::fs::write(&path, script)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }
}

/// How a job ended.
#[derive(Debug)]
pub struct Finished {
    /// The launcher's exit status.
    pub status: std::process::ExitStatus,
    /// Its wall time.
    pub wall: std::time::Duration,
}

/// Runs `command` (a [`Launch::command`]) to the end, or until `timeout` passes or the
/// process is interrupted (SIGINT, SIGTERM): then the job is stopped (`mpirun` is told to
/// end it, then killed) and an error says why. Dropping the cluster afterwards removes
/// whatever still runs on its hosts.
pub fn run_job(
    mut command: Command,
    timeout: Option<std::time::Duration>,
) -> Result<Finished, String> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, interrupted.clone())
            .map_err(|e| format!("installing a signal handler: {e}"))?;
    }
    let start = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting mpirun on the cluster: {e}"))?;
    let why = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(Finished {
                status,
                wall: start.elapsed(),
            });
        }
        if interrupted.load(Ordering::SeqCst) {
            break "interrupted".to_string();
        }
        if let Some(limit) = timeout.filter(|&t| start.elapsed() > t) {
            break format!("the job ran past its {:.0} s limit", limit.as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SIGTERM first: mpirun then ends every process of the job.
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let grace = Instant::now();
    while child.try_wait().ok().flatten().is_none() {
        if grace.elapsed() > Duration::from_secs(5) {
            child.kill().ok();
            child.wait().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{why}: the job was stopped"))
}
