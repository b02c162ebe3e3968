//! The `ratelimit` XDP program: parse, classify, decide, count, verdict.
//!
//! Builds only for `bpfel-unknown-none` (through `ratelimit-user`'s build script);
//! on the host this is an empty binary so that workspace-wide commands still work.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// `atomic_cxchg` compiles to the BPF `cmpxchg` instruction; the stable `AtomicU64`
// has no compare-and-swap on this target.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod program;

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("ratelimit-ebpf is an XDP program: it builds for bpfel-unknown-none only");
}
