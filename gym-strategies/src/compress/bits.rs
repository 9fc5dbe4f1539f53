//! Bit fields packed least significant bit first: field `i` of width `w` occupies bits
//! `i·w .. (i+1)·w` of the buffer, bit `b` being bit `b % 8` of byte `b / 8`.

/// Bytes for `count` fields of `bits` bits, packed.
pub(crate) fn packed_bytes(count: usize, bits: u32) -> usize {
    let bytes = (count as u128 * u128::from(bits)).div_ceil(8);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Writes bit fields least significant bit first, after what `out` already holds.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    pending: u128,
    pending_bits: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter {
            out,
            pending: 0,
            pending_bits: 0,
        }
    }

    /// Appends the low `bits` (≤ 64) bits of `value`.
    pub(crate) fn push(&mut self, value: u64, bits: u32) {
        let mask = (1u128 << bits) - 1;
        self.pending |= (u128::from(value) & mask) << self.pending_bits;
        self.pending_bits += bits;
        while self.pending_bits >= 8 {
            self.out.push(self.pending as u8);
            self.pending >>= 8;
            self.pending_bits -= 8;
        }
    }

    /// Writes the last partial byte, zero-padded.
    pub(crate) fn finish(self) {
        if self.pending_bits > 0 {
            self.out.push(self.pending as u8);
        }
    }
}

/// Reads bit fields least significant bit first; past the end it reads zeros (callers
/// size the buffer first, so that never happens on a checked buffer).
pub(crate) struct BitReader<'a> {
    bytes: &'a [u8],
    next_byte: usize,
    pending: u128,
    pending_bits: u32,
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        BitReader {
            bytes,
            next_byte: 0,
            pending: 0,
            pending_bits: 0,
        }
    }

    /// The next `bits` (≤ 64) bits.
    pub(crate) fn read(&mut self, bits: u32) -> u64 {
        while self.pending_bits < bits {
            let byte = self.bytes.get(self.next_byte).copied().unwrap_or(0);
            self.pending |= u128::from(byte) << self.pending_bits;
            self.next_byte += 1;
            self.pending_bits += 8;
        }
        let value = self.pending & ((1u128 << bits) - 1);
        self.pending >>= bits;
        self.pending_bits -= bits;
        value as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zoo_bit_fields_round_trip_across_bytes() {
        let fields: Vec<(u64, u32)> = (0..200u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15), (i % 64) as u32 + 1))
            .collect();
        let mut out = vec![0xAB];
        let mut writer = BitWriter::new(&mut out);
        fields.iter().for_each(|&(v, b)| writer.push(v, b));
        writer.finish();
        let total: u32 = fields.iter().map(|f| f.1).sum();
        assert_eq!(out.len(), 1 + (total as usize).div_ceil(8));
        let mut reader = BitReader::new(&out[1..]);
        for &(v, b) in &fields {
            let mask = if b == 64 { u64::MAX } else { (1 << b) - 1 };
            assert_eq!(reader.read(b), v & mask);
        }
    }
}
