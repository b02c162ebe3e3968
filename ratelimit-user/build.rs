//! Builds the XDP program (`ratelimit-ebpf`) for `bpfel-unknown-none` with the
//! nightly toolchain and `bpf-linker`, into `OUT_DIR/ratelimit-xdp` (and the
//! bench's floors into `OUT_DIR/floors`), where `lib.rs` embeds them. `cargo
//! xtask setup` installs what this needs. (The program's binary is not named
//! `ratelimit`: `cargo build --workspace` would write it over the daemon's.)
use std::path::PathBuf;

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", manifest_dir.display()))?
        .join("ratelimit-ebpf");
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "ratelimit-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the XDP program failed; `cargo xtask setup` installs the nightly toolchain, rust-src and bpf-linker it needs")
}
