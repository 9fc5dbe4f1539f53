//! The harness of the hostile-file tests: an allocator that notes each thread's largest
//! request, the loop that feeds a parser and names the input that broke it, input
//! generators, and valid files to start from.

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use gym_data::DataError;
use gym_data::cifar::RECORD;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::time::Instant;
use tests::shared_data;

// ---------------------------------------------------------------------------------------
// The largest allocation of the current thread, to catch a parser that trusts a header.

/// The system allocator, noting the largest request each thread makes.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

pub fn note(size: usize) {
    // `try_with`: the thread-local may be gone while a thread exits.
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size);
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; `note` neither allocates nor
// unwinds.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's guarantees on `layout` are passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

// ---------------------------------------------------------------------------------------
// The harness.

/// Inputs per parser without `GYM_FUZZ_CASES`: about 3 s for the whole file in release on
/// two cores.
pub const DEFAULT_CASES: usize = 100_000;

pub fn cases() -> usize {
    std::env::var("GYM_FUZZ_CASES")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("GYM_FUZZ_CASES={v:?} is not a count"))
        })
        .unwrap_or(DEFAULT_CASES)
}

pub fn base_seed() -> u64 {
    std::env::var("GYM_FUZZ_SEED")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("GYM_FUZZ_SEED={v:?} is not a u64"))
        })
        .unwrap_or(0x6a79_6d5f_6675_7a7a)
}

/// How much a parser may allocate at once for `len` input bytes: `factor` times the input
/// plus 1 MiB of slack, far below what a header claiming millions of images would ask for.
pub fn cap(len: usize, factor: usize) -> usize {
    (1 << 20) + factor * len
}

/// The first bytes of each input in hex, to reproduce a failure.
pub fn describe(inputs: &[Vec<u8>]) -> String {
    inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let head: String = v.iter().take(96).map(|b| format!("{b:02x}")).collect();
            let more = if v.len() > 96 { "…" } else { "" };
            format!("  input {i}: {} bytes: {head}{more}", v.len())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".into())
}

/// Runs `parse` on `inputs`: a panic, or an allocation above `cap(total input, factor)`,
/// fails the test naming the parser, the case and the input.
pub fn survive<T>(
    parser: &str,
    case: usize,
    inputs: &[Vec<u8>],
    factor: usize,
    parse: impl FnOnce() -> Result<T, DataError>,
) -> Result<T, DataError> {
    LARGEST.with(|l| l.set(0));
    let outcome = catch_unwind(AssertUnwindSafe(parse));
    let largest = LARGEST.with(|l| l.get());
    let result = match outcome {
        Ok(result) => result,
        Err(payload) => panic!(
            "the {parser} parser panicked on input {case} (GYM_FUZZ_SEED={}): {}\n{}",
            base_seed(),
            panic_message(&*payload),
            describe(inputs)
        ),
    };
    let total: usize = inputs.iter().map(Vec::len).sum();
    assert!(
        largest <= cap(total, factor),
        "the {parser} parser allocated {largest} bytes at once for {total} input bytes \
         (input {case}, GYM_FUZZ_SEED={}): it trusts a size it did not check\n{}",
        base_seed(),
        describe(inputs)
    );
    result
}

/// Tally of one parser's run.
pub struct Tally {
    parser: &'static str,
    ok: usize,
    err: usize,
    start: Instant,
}

impl Tally {
    pub fn new(parser: &'static str) -> Self {
        Tally {
            parser,
            ok: 0,
            err: 0,
            start: Instant::now(),
        }
    }

    pub fn count<T>(&mut self, result: &Result<T, DataError>) {
        match result {
            Ok(_) => self.ok += 1,
            Err(_) => self.err += 1,
        }
    }

    /// Prints the tally and checks that both outcomes were reached (so the generators do
    /// reach past the first checks).
    pub fn report(self) {
        let tried = self.ok + self.err;
        eprintln!(
            "fuzz {}: {tried} inputs tried ({} parsed, {} typed errors, no panic) in {:.2?} \
             (GYM_FUZZ_CASES={}, GYM_FUZZ_SEED={})",
            self.parser,
            self.ok,
            self.err,
            self.start.elapsed(),
            cases(),
            base_seed()
        );
        if tried >= 200 {
            assert!(self.ok > 0, "{}: no input parsed", self.parser);
            assert!(self.err > 0, "{}: no input was refused", self.parser);
        }
    }
}

pub fn rng_for(parser: &str) -> ChaCha8Rng {
    let salt = parser.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    ChaCha8Rng::seed_from_u64(base_seed() ^ salt)
}

// ---------------------------------------------------------------------------------------
// Input generators.

pub fn random_bytes(rng: &mut ChaCha8Rng, max: usize) -> Vec<u8> {
    let mut v = vec![0u8; rng.random_range(0..=max)];
    rng.fill_bytes(&mut v);
    v
}

/// A size a header might declare: the edges of `u32` and of the formats, or any value.
pub fn interesting_u32(rng: &mut ChaCha8Rng) -> u32 {
    const EDGES: [u32; 14] = [
        0,
        1,
        2,
        9,
        10,
        27,
        28,
        29,
        784,
        10_000,
        0x7fff_ffff,
        0x8000_0000,
        u32::MAX - 1,
        u32::MAX,
    ];
    if rng.random_bool(0.7) {
        EDGES[rng.random_range(0..EDGES.len())]
    } else {
        rng.random()
    }
}

/// `v` damaged one way: truncated, bits flipped, a header-sized word overwritten with an
/// [`interesting_u32`], bytes appended, a range overwritten or cut out.
pub fn mutate(rng: &mut ChaCha8Rng, mut v: Vec<u8>) -> Vec<u8> {
    let len = v.len();
    match rng.random_range(0..6) {
        0 => v.truncate(rng.random_range(0..=len)),
        1 if len > 0 => {
            for _ in 0..rng.random_range(1..=8) {
                let at = rng.random_range(0..len);
                v[at] ^= 1 << rng.random_range(0..8);
            }
        }
        2 if len >= 4 => {
            // A word of the header (first 32 bytes) mostly, aligned or not.
            let end = if rng.random_bool(0.8) {
                len.min(32)
            } else {
                len
            };
            let at = rng.random_range(0..=end.max(4) - 4);
            v[at..at + 4].copy_from_slice(&interesting_u32(rng).to_be_bytes());
        }
        3 => {
            let tail = random_bytes(rng, 64);
            v.extend_from_slice(&tail);
        }
        4 if len > 0 => {
            let at = rng.random_range(0..len);
            let n = rng.random_range(1..=(len - at).min(64));
            rng.fill_bytes(&mut v[at..at + n]);
        }
        5 if len > 0 => {
            let at = rng.random_range(0..len);
            let n = rng.random_range(1..=(len - at));
            v.drain(at..at + n);
        }
        _ => v.push(rng.random()),
    }
    v
}

/// `v` damaged 0 to 3 times (0: a valid input stays valid, so success paths run too).
pub fn maybe_mutate(rng: &mut ChaCha8Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.random_range(0..=3) {
        v = mutate(rng, v);
    }
    v
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

pub fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
    raw
}

/// An IDX header: magic `00 00 08 D` and the dimensions.
pub fn idx_header(dims: &[u32]) -> Vec<u8> {
    let mut v = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v
}

// ---------------------------------------------------------------------------------------
// Valid files to start from: the shared data, cut small.

/// The shared MNIST test images and labels, decompressed.
pub fn mnist_test() -> &'static (Vec<u8>, Vec<u8>) {
    static FILES: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = shared_data("mnist");
        let read = |name: &str| gunzip(&std::fs::read(dir.join(name)).unwrap());
        (
            read("t10k-images-idx3-ubyte.gz"),
            read("t10k-labels-idx1-ubyte.gz"),
        )
    })
}

/// Valid IDX image and label files of the first `n` shared MNIST test images.
pub fn mnist_files(n: usize) -> (Vec<u8>, Vec<u8>) {
    let (images, labels) = mnist_test();
    let mut i = idx_header(&[n as u32, 28, 28]);
    i.extend_from_slice(&images[16..16 + n * 784]);
    let mut l = idx_header(&[n as u32]);
    l.extend_from_slice(&labels[8..8 + n]);
    (i, l)
}

/// The first 20 CIFAR-10 test records of the shared data.
pub fn cifar_first20() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let bytes = std::fs::read(shared_data("cifar10").join("test_batch_first20.bin")).unwrap();
        assert_eq!(bytes.len(), 20 * RECORD);
        bytes
    })
}

/// The shared tiny-shakespeare text.
pub fn shakespeare() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| std::fs::read(shared_data("shakespeare").join("input.txt")).unwrap())
}

pub const ORIGIN: &str = "fuzz-input";
