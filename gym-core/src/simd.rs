//! Loops compiled for the widest vectors the CPU has, chosen at run time: the one-pass
//! AdamW here and gym-models' flex kernels.

/// Defines `fn $name(args) = $generic(args)`, compiled for the widest vectors this CPU has:
/// AVX-512F, AVX2, or the target's baseline (SSE2 on x86-64), chosen at run time. `$generic`
/// is the same `#[inline(always)]` loop in each. Rust does not contract a multiply and an add
/// into an FMA, and division and square root are IEEE's in every width, so every lane rounds
/// as the baseline's do and the bits do not depend on the CPU.
///
/// Not part of the API: exported for gym-models' kernels, the other crate with such loops.
#[doc(hidden)]
#[macro_export]
macro_rules! widest_simd {
    ($(#[$doc:meta])* $vis:vis fn $name:ident = $generic:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $generic($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $generic($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F, checked just above.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $generic($($arg),*)
        }
    };
}
