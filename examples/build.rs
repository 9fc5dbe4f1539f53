//! With the `tch` feature on Linux: keep LibTorch's CUDA library among the binaries' needed
//! libraries. Nothing here calls into `libtorch_cuda` by name, so a linker that drops
//! unused libraries (`--as-needed`, the default of Debian's and Ubuntu's toolchains) would
//! leave it out and LibTorch would see no GPU ("Cannot initialize CUDA without ATen_cuda
//! library"). `libtorch.so` of a CUDA build needs `libtorch_cuda.so`, so linking it with
//! `--no-as-needed` makes the loader load both. A CPU-only LibTorch links as before.
//! (tch-rs's own build script also passes `--copy-dt-needed-entries`, which Rust's
//! default linker, lld, refuses and the loader does not need.)
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && std::env::var_os("CARGO_FEATURE_TCH").is_some() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
    }
}
