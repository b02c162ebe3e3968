//! Builds the bench's XDP object (`bench/floors`: the cost floors and the
//! traffic generator) into `OUT_DIR/floors`, where `lib.rs` embeds it for the
//! flood tests and the bench (see `ratelimit-ebpf/build_object.rs`).

include!("../ratelimit-ebpf/build_object.rs");

fn main() -> anyhow::Result<()> {
    build_object("ratelimit-floors", "bench/floors")
}
