//! Keeping the memory a training step frees for the next step.
//!
//! Every step of every node allocates and frees the same large buffers: activations,
//! gradients, im2col matrices. glibc's `malloc` gives each node thread its own arena of
//! 64 MiB heaps, unmaps a heap as soon as it is empty, trims the top of a heap, and serves
//! large blocks with `mmap`. So each step the kernel maps fresh pages and zeroes them again:
//! in a `perf` profile of one MNIST CNN node on the tch backend, clearing pages took 22% of
//! the node thread's samples.
//!
//! [`retain_freed_memory`] tells glibc to keep what it frees: no unmapping of empty heaps, no
//! trimming, no `mmap` for large blocks. Measured on this project's 2-core machine: the node
//! threads' page faults fall 3–4× (CNN, K = 1 to 8), and the tch CNN run of 4 nodes
//! (`bench --cnn-strategies allreduce`) gains 4% (median of six alternating pairs, five of
//! them faster). The rest of the page-clearing time was the cost of writing the memory at
//! all, which reused buffers pay in cache misses instead, so the flex CNN and the GPT show no
//! measurable change. Peak memory is unchanged (the next step reuses the blocks), but freed
//! memory stays in the process until it exits.
//!
//! It changes the process's allocator, which a library should not do behind its caller's
//! back, so the trainer never calls it: binaries do, first thing in `main` (the `examples`
//! binaries all do). It applies to Burn's CPU tensors (Rust's system allocator is `malloc`)
//! and to LibTorch's alike.
//!
//! [`fit_to_threads`] is the second setting, for runs of many node threads. glibc gives
//! every thread a cache of freed small blocks (the tcache, up to 7 of each size), which the
//! arenas count as in use: with hundreds of threads sharing a few arenas, the cached blocks
//! pin holes that cannot merge, and the resident set creeps up though the program holds no
//! more (`bench --soak`, 1,024 nodes: +15% in 300 steps with the caches, +4.8% without; the
//! live heap was flat in both). The caches can only be turned off when the process starts
//! (the `glibc.malloc.tcache_count` tunable), so for a run of [`MANY_THREADS`] threads or
//! more the binaries start themselves again with it set. (mimalloc, tried as the global
//! allocator instead, kept the soak flat but resident at 3.9 GB against glibc's 0.26 GB.)
//!
//! [`CountingAllocator`] counts the live heap, to tell memory a program holds from memory
//! the allocator keeps ([`live_bytes`]).

mod live_heap;

pub use live_heap::{CountingAllocator, live_bytes, start_counting};

/// What [`retain_freed_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// glibc now keeps freed memory.
    Applied,
    /// The environment sets glibc's allocator (a `MALLOC_*_` variable or `GLIBC_TUNABLES`),
    /// so it was left as the user set it.
    LeftToEnvironment,
    /// This build's allocator is not glibc's `malloc` (another OS or C library): nothing done.
    Unsupported,
}

/// The variables of glibc's allocator that the environment can set (see `mallopt(3)`).
const ALLOCATOR_VARIABLES: [&str; 5] = [
    "MALLOC_TOP_PAD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
];

/// Makes glibc's `malloc` keep the memory the process frees (see the [module](self) docs for
/// why): call it first thing in `main`, before the node threads start. Where the environment
/// already configures the allocator it leaves it alone, and elsewhere than glibc it does
/// nothing; the result says which.
pub fn retain_freed_memory() -> Retention {
    if ALLOCATOR_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some())
    {
        return Retention::LeftToEnvironment;
    }
    glibc::retain_freed_memory()
}

/// Threads from which [`fit_to_threads`] turns glibc's per-thread caches off: below, the
/// caches' speed on small blocks is worth their memory; from here on, the blocks they pin
/// grow with every thread (`bench --soak`, 64 nodes, 128 threads, 10,000 steps: +9.5%
/// resident after warm-up with the caches, +3.7% without; see the [module](self) docs).
pub const MANY_THREADS: usize = 64;

/// Set in the environment of a process that [`fit_to_threads`] started again, so that the
/// new process knows (and says) why its allocator is set.
pub const RESTARTED_VARIABLE: &str = "EXOGYM_ALLOCATOR_RESTARTED";

/// The tunables [`fit_to_threads`] starts the process with: the retention of
/// [`retain_freed_memory`], no per-thread caches, and one arena per core.
///
/// One arena per core, not glibc's eight: node threads take turns on the cores
/// ([`ComputeSlots`](crate::comm::ComputeSlots)), so no more threads allocate at once than
/// there are cores, and each arena's memory goes to the next node that takes a turn instead
/// of idling in one of 16 arenas. `mnist`, 1,024 nodes, 2 steps, on 2 cores: peak resident
/// 4.65 GiB with 16 arenas, 3.57 GiB with 2, and 6.5 s against 10.0 s.
pub fn many_threads_tunables() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=2147483647:\
         glibc.malloc.top_pad=67108864:glibc.malloc.mmap_max=0:glibc.malloc.arena_max={cores}"
    )
}

/// What [`fit_to_threads`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadCaches {
    /// Fewer than [`MANY_THREADS`] threads: the caches stay on.
    Kept,
    /// This process was started again by [`fit_to_threads`]: the caches are off.
    Off,
    /// The environment sets glibc's allocator, or this process was already restarted with
    /// other settings: left as it is.
    LeftToEnvironment,
    /// Not glibc's `malloc`, or the program could not be started again (the error is
    /// returned by [`fit_to_threads`] instead): nothing done.
    Unsupported,
}

/// For a process about to run `threads` node threads: from [`MANY_THREADS`] on, on glibc,
/// where the environment does not set the allocator, starts the program again (same
/// executable, arguments and environment, plus [`many_threads_tunables`] in
/// `GLIBC_TUNABLES`) and does not return. Call it in `main` once the command line says how
/// many nodes run, before anything is written or any thread starts: the new process parses
/// the same command line and gets [`ThreadCaches::Off`] here. Like
/// [`retain_freed_memory`], it is for binaries: a library must not restart its caller.
///
/// # Errors
/// If the program cannot be started again (the error of `execv`); the caller can go on
/// with the caches on.
pub fn fit_to_threads(threads: usize) -> std::io::Result<ThreadCaches> {
    if std::env::var_os(RESTARTED_VARIABLE).is_some() {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        return Ok(if tunables == many_threads_tunables() {
            ThreadCaches::Off
        } else {
            ThreadCaches::LeftToEnvironment
        });
    }
    if threads < MANY_THREADS {
        return Ok(ThreadCaches::Kept);
    }
    if ALLOCATOR_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some())
    {
        return Ok(ThreadCaches::LeftToEnvironment);
    }
    glibc::restart_without_thread_caches()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use super::Retention;

    /// Top pad as large as a thread arena's heap: glibc unmaps an empty heap only when the
    /// room it frees exceeds the pad, so no heap is ever unmapped.
    const TOP_PAD: libc::c_int = 64 << 20;

    pub(super) fn retain_freed_memory() -> Retention {
        let settings = [
            // Never give the top of a heap back (the largest value the setting takes).
            (libc::M_TRIM_THRESHOLD, libc::c_int::MAX),
            (libc::M_TOP_PAD, TOP_PAD),
            // Large blocks from the heaps too: an mmap'd block is unmapped when freed.
            (libc::M_MMAP_MAX, 0),
        ];
        for (parameter, value) in settings {
            // SAFETY: `mallopt` only sets the allocator's parameters, under its own lock;
            // these are documented parameters with values in their range.
            if unsafe { libc::mallopt(parameter, value) } != 1 {
                return Retention::Unsupported;
            }
        }
        Retention::Applied
    }

    pub(super) fn restart_without_thread_caches() -> std::io::Result<super::ThreadCaches> {
        use std::os::unix::process::CommandExt;
        let mut args = std::env::args_os();
        let _program = args.next();
        let exe = std::env::current_exe()?;
        // `exec` returns only on failure.
        Err(std::process::Command::new(exe)
            .args(args)
            .env("GLIBC_TUNABLES", super::many_threads_tunables())
            .env(super::RESTARTED_VARIABLE, "1")
            .exec())
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod glibc {
    use super::Retention;

    pub(super) fn retain_freed_memory() -> Retention {
        Retention::Unsupported
    }

    pub(super) fn restart_without_thread_caches() -> std::io::Result<super::ThreadCaches> {
        Ok(super::ThreadCaches::Unsupported)
    }
}
