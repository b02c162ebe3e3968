// Shared by the build scripts that build an XDP object (`ratelimit-user`'s,
// the program; `ratelimit-tests`', the bench's floors): `include!`d, so each
// script is one call. Not a module of this crate.

/// Builds the binaries of the XDP crate `package` (its directory `dir`,
/// beside the calling crate's) for `bpfel-unknown-none` with the dated
/// nightly named in `ratelimit-ebpf/toolchain.toml` and `bpf-linker`, into
/// `OUT_DIR`. `cargo xtask setup` installs what this needs.
fn build_object(package: &str, dir: &str) -> anyhow::Result<()> {
    use anyhow::{Context as _, anyhow};
    let manifest_dir = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?,
    );
    let root = manifest_dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", manifest_dir.display()))?;
    let crate_dir = root.join(dir);
    let root_dir = crate_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", crate_dir.display()))?;
    let pin = root.join("ratelimit-ebpf/toolchain.toml");
    println!("cargo:rerun-if-changed={}", pin.display());
    let text =
        std::fs::read_to_string(&pin).with_context(|| format!("reading {}", pin.display()))?;
    let nightly = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "nightly").then(|| v.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| {
            anyhow!(
                "{}: no `nightly = \"nightly-YYYY-MM-DD\"` line",
                pin.display()
            )
        })?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: package,
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&nightly),
    )
    .with_context(|| format!("building the XDP object {package} failed; `cargo xtask setup` installs the toolchain it needs ({nightly}, its rust-src, and bpf-linker)"))
}
