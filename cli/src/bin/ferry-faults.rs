//! `ferry` with fault injection compiled in, for the chaos harness only (docs/reliability.md):
//! the same program, built with the `failpoints` feature.
include!("../main.rs");
