//! Builds the XDP program (`ratelimit-ebpf`) for `bpfel-unknown-none` with the
//! dated nightly named in `ratelimit-ebpf/toolchain.toml` and `bpf-linker`, into `OUT_DIR/ratelimit-xdp` (and the
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
    let pin = ebpf_dir.join("toolchain.toml");
    println!("cargo:rerun-if-changed={}", pin.display());
    let text =
        std::fs::read_to_string(&pin).with_context(|| format!("reading {}", pin.display()))?;
    let nightly = pinned(&text, "nightly").ok_or_else(|| {
        anyhow!(
            "{}: no `nightly = \"nightly-YYYY-MM-DD\"` line",
            pin.display()
        )
    })?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "ratelimit-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&nightly),
    )
    .with_context(|| format!("building the XDP program failed; `cargo xtask setup` installs the toolchain it needs ({nightly}, its rust-src, and bpf-linker)"))
}

/// The value of `key = "VALUE"` in the toolchain file.
fn pinned(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}
