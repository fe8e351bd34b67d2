//! `ferry` with fault injection compiled in, for the chaos harness only (docs/reliability.md):
//! the same program, built with the `failpoints` feature.

#[path = "../main.rs"]
mod ferry;

fn main() -> std::process::ExitCode {
    ferry::main()
}
