//! Fingerprints of what a run started from and read.

/// A 64-bit FNV-1a hash, for fingerprints of what a run started from.
#[derive(Debug, Clone, Copy)]
pub struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    /// A fingerprint that continues from `state` (a [`finish`](Self::finish)ed value).
    pub fn resume(state: u64) -> Self {
        Fingerprint(state)
    }

    /// Mixes `x` in.
    pub fn write_u64(&mut self, x: u64) {
        for b in x.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash.
    pub fn finish(self) -> u64 {
        self.0
    }
}
