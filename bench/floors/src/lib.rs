//! The floors and the generator live in `main.rs` and build only for
//! `bpfel-unknown-none`. This empty library lets `ratelimit-tests` list the
//! crate as a build dependency, so cargo reruns its build script when they
//! change.
#![no_std]
