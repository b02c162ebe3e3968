//! The XDP program lives in `main.rs` and `program/` (one module per stage) and
//! builds only for `bpfel-unknown-none`.
//! This empty library lets `ratelimit-user` list the crate as a build dependency,
//! so cargo reruns its build script when the program changes.
#![no_std]
