//! bfloat16 on the wire: the conversion every bf16 payload uses (the `bf16` codec's values,
//! and [`Collective::all_reduce_bf16_start_in`](crate::Collective::all_reduce_bf16_start_in)'s
//! ring).

/// The quiet bit of a bf16 NaN (the top bit of its 7-bit mantissa).
const BF16_QUIET: u16 = 0x0040;

/// The bf16 code nearest to `x`, ties to an even code: the standard conversion, which adds
/// 0x7FFF plus the lowest kept bit and drops the low 16 bits. A carry out of the mantissa
/// runs into the exponent, which is the next value up; past bf16's largest finite value
/// (0x7F7F) it reaches ±∞ (0x7F80), as the standard conversion does. ±∞ stay ±∞, −0 stays
/// −0, and subnormals round like any other value.
///
/// NaN is not rounded (a NaN whose payload lies only in the low 16 bits would truncate to
/// ∞, and rounding could carry it into the sign): its sign and the top of its payload are
/// kept and the quiet bit is set, so it stays a NaN.
pub fn bf16_encode(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) as u16 | BF16_QUIET;
    }
    // At most 0xFF80_0000 (−∞) + 0x8000 here: no overflow.
    let lsb = (bits >> 16) & 1;
    ((bits + 0x7FFF + lsb) >> 16) as u16
}

/// The value of a bf16 code, exactly: its 16 bits as the top of an f32's.
pub fn bf16_decode(code: u16) -> f32 {
    f32::from_bits(u32::from(code) << 16)
}

/// `x` rounded to the nearest bf16 value (ties to even), as an f32.
pub fn round_bf16(x: f32) -> f32 {
    bf16_decode(bf16_encode(x))
}
