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
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod glibc {
    use super::Retention;

    pub(super) fn retain_freed_memory() -> Retention {
        Retention::Unsupported
    }
}
