//! The live heap: bytes the process has allocated and not freed, counted by a global
//! allocator (for `bench --soak`, and tests that show memory is given back).
//!
//! The resident set counts what the allocator keeps as well as what the program holds:
//! freed blocks kept in each thread's cache (glibc's tcache, up to 7 blocks of each small
//! size per thread, so a run of 1,024 node threads can keep tens of MiB there), free holes
//! in its arenas, and, with [`retain_freed_memory`](super::retain_freed_memory), every page it ever
//! used. The live heap counts only blocks handed out and not given back: a leak shows here,
//! allocator retention does not.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The system allocator, counting the bytes live once [`start_counting`] has been called.
///
/// Install it in a binary with `#[global_allocator]`. Until counting starts, it costs one
/// relaxed load per call; after, one relaxed add.
pub struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);

fn count(delta: i64) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to `System` unchanged; only a counter is updated besides.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// Starts counting: call it first thing in `main` (blocks allocated before and freed after
/// count negative, so the earlier the better).
pub fn start_counting() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// The bytes live since counting started, or `None` if it has not (the binary does not
/// install [`CountingAllocator`], or did not start it).
pub fn live_bytes() -> Option<u64> {
    COUNTING
        .load(Ordering::Relaxed)
        .then(|| LIVE.load(Ordering::Relaxed).max(0) as u64)
}
