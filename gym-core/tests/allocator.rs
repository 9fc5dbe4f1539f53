//! `retain_freed_memory`: a thread that frees its buffers and allocates them again gets pages
//! that are already mapped. Its own test binary, since the setting is the process's.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use gym_core::allocator::{Retention, retain_freed_memory};

const PAGE: usize = 4096;
/// Ten 12 MiB buffers: more than one 64 MiB heap of a thread arena, and each over glibc's
/// starting mmap threshold, as a CNN's activations are.
const BUFFERS: usize = 10;
const BUFFER_BYTES: usize = 12 << 20;

/// This thread's minor page faults so far.
fn minor_faults() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: getrusage succeeded, so it wrote the struct.
    unsafe { usage.assume_init() }.ru_minflt
}

/// Minor faults of a second round of allocating, touching and freeing the buffers, on a
/// fresh thread (a node thread has its own arena), as a fraction of the pages touched.
fn second_round_faults() -> f64 {
    std::thread::spawn(|| {
        let round = || {
            let buffers: Vec<Vec<u8>> = (0..BUFFERS)
                .map(|i| {
                    let mut buffer = Vec::<u8>::with_capacity(BUFFER_BYTES);
                    // Touch every page, as a kernel writing its output does.
                    buffer.resize(BUFFER_BYTES, i as u8 + 1);
                    buffer
                })
                .collect();
            std::hint::black_box(&buffers);
        };
        round();
        let before = minor_faults();
        round();
        let faults = minor_faults() - before;
        faults as f64 / (BUFFERS * BUFFER_BYTES / PAGE) as f64
    })
    .join()
    .unwrap()
}

#[test]
fn freed_buffers_come_back_without_page_faults() {
    if std::env::vars_os().any(|(name, _)| {
        let name = name.to_string_lossy();
        name.starts_with("MALLOC_") || name == "GLIBC_TUNABLES"
    }) {
        assert_eq!(retain_freed_memory(), Retention::LeftToEnvironment);
        eprintln!("skipped: the environment configures glibc's allocator");
        return;
    }
    // glibc's defaults: the freed buffers go back to the kernel and fault in again.
    let default = second_round_faults();
    assert!(
        default > 0.5,
        "with glibc's defaults the second round faulted on {default:.3} of its pages"
    );

    assert_eq!(retain_freed_memory(), Retention::Applied);
    let retained = second_round_faults();
    assert!(
        retained < 0.02,
        "after retain_freed_memory the second round faulted on {retained:.3} of its pages"
    );
}
