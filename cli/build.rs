//! The `ferry` binary keeps line tables (file:line in backtraces and profiles) for Ferry's own
//! crates; uncompressed they are most of its size. On Linux the linker compresses the debug
//! sections (zlib, which backtraces, gdb and perf read), taking the binary from 66 to 37 MiB.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let gnu = std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    if linux && gnu {
        println!("cargo:rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
    }
}
