//! Builds the XDP program (`ratelimit-ebpf`) for `bpfel-unknown-none` into
//! `OUT_DIR/ratelimit-xdp`, where `lib.rs` embeds it (see
//! `ratelimit-ebpf/build_object.rs`). The program's binary is not named
//! `ratelimit`: `cargo build --workspace` would write it over the daemon's.
//! The bench's floors and generator are another crate's (`bench/floors`),
//! embedded by `ratelimit-tests`, never by the daemon.

include!("../ratelimit-ebpf/build_object.rs");

fn main() -> anyhow::Result<()> {
    build_object("ratelimit-ebpf", "ratelimit-ebpf")
}
