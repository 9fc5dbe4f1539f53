//! What DeMo puts on the wire: the `k` largest DCT coefficients of every chunk, their
//! positions in the narrowest unsigned integer that holds them, and the values as `f32`.

/// The width of the indices DeMo sends: the smallest unsigned integer type that holds every
/// position within a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexWidth {
    /// `u8`: chunks of up to 256 coefficients.
    U8,
    /// `u16`: chunks of up to 65 536 coefficients.
    U16,
    /// `u32`: larger chunks.
    U32,
}

impl IndexWidth {
    /// The width for chunks of `chunk_len` coefficients.
    pub fn for_chunk_len(chunk_len: usize) -> Self {
        if chunk_len <= 1 << 8 {
            IndexWidth::U8
        } else if chunk_len <= 1 << 16 {
            IndexWidth::U16
        } else {
            IndexWidth::U32
        }
    }

    /// Bytes per index.
    pub fn bytes(self) -> usize {
        match self {
            IndexWidth::U8 => 1,
            IndexWidth::U16 => 2,
            IndexWidth::U32 => 4,
        }
    }
}

/// What a node sends for one parameter: `k` coefficients of every chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseCoefficients {
    /// Coefficients per chunk.
    pub k: usize,
    /// For chunk `c`, entries `c·k..(c+1)·k`: positions within the chunk (row-major in the
    /// chunk, as [`ChunkGrid`](super::dct::ChunkGrid) stores them).
    pub indices: Vec<u32>,
    /// The signed coefficients at those positions.
    pub values: Vec<f32>,
}

/// The `sent.k` coefficients of largest magnitude in every chunk of `chunk_len`, written
/// into `sent` (its buffers are reused); `keys` is a workspace.
pub(crate) fn top_k_per_chunk(
    coefficients: &[f32],
    chunk_len: usize,
    keys: &mut Vec<u64>,
    sent: &mut SparseCoefficients,
) {
    let k = sent.k;
    sent.indices.clear();
    sent.values.clear();
    for chunk in coefficients.chunks_exact(chunk_len.max(1)) {
        // A non-negative float's bits order like its value (NaN above ∞, as `total_cmp`
        // orders |c|), so one u64 comparison ranks by |c| with the position as tie-break:
        // far cheaper than comparing through the chunk.
        keys.clear();
        keys.extend(
            chunk
                .iter()
                .enumerate()
                .map(|(i, c)| (u64::from(c.abs().to_bits()) << 32) | i as u64),
        );
        let (k, len) = (k.min(keys.len()), keys.len());
        if k < len {
            // Partial selection: the k largest end up last, in no particular order (the
            // original's `topk(sorted=False)`).
            keys.select_nth_unstable(len - k);
        }
        for &key in &keys[len - k..] {
            let i = key as u32;
            sent.indices.push(i);
            sent.values.push(chunk[i as usize]);
        }
    }
}

pub(crate) fn read_index(bytes: &[u8], j: usize, width: IndexWidth) -> u32 {
    match width {
        IndexWidth::U8 => bytes[j] as u32,
        IndexWidth::U16 => u16::from_le_bytes([bytes[2 * j], bytes[2 * j + 1]]) as u32,
        IndexWidth::U32 => u32::from_le_bytes(bytes[4 * j..4 * j + 4].try_into().expect("4 bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_keeps_the_largest_magnitudes_of_each_chunk() {
        let c = [0.1, -5.0, 3.0, 0.0, /* chunk 2 */ 1.0, 2.0, -3.0, 4.0];
        let mut s = SparseCoefficients {
            k: 2,
            indices: vec![9; 7],
            values: Vec::new(),
        };
        top_k_per_chunk(&c, 4, &mut Vec::new(), &mut s);
        assert_eq!(s.indices.len(), 4, "the buffers are cleared first");
        let mut first: Vec<u32> = s.indices[..2].to_vec();
        first.sort();
        let mut second: Vec<u32> = s.indices[2..].to_vec();
        second.sort();
        assert_eq!((first, second), (vec![1, 2], vec![2, 3]));
        for (j, &i) in s.indices.iter().enumerate() {
            assert_eq!(s.values[j], c[(j / 2) * 4 + i as usize]);
        }
    }

    #[test]
    fn index_width_is_the_smallest_that_holds_a_chunk_position() {
        assert_eq!(IndexWidth::for_chunk_len(256), IndexWidth::U8);
        assert_eq!(IndexWidth::for_chunk_len(257), IndexWidth::U16);
        assert_eq!(IndexWidth::for_chunk_len(64 * 64), IndexWidth::U16);
        assert_eq!(IndexWidth::for_chunk_len(65_537), IndexWidth::U32);
        for (w, x) in [
            (IndexWidth::U8, 200u32),
            (IndexWidth::U16, 4095),
            (IndexWidth::U32, 70_000),
        ] {
            let bytes = match w {
                IndexWidth::U8 => vec![x as u8],
                IndexWidth::U16 => (x as u16).to_le_bytes().to_vec(),
                IndexWidth::U32 => x.to_le_bytes().to_vec(),
            };
            assert_eq!(read_index(&bytes, 0, w), x);
        }
    }
}
