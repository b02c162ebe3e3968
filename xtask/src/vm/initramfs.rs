//! The initramfs a guest boots with, written in Rust as an uncompressed
//! `newc` cpio archive (the kernel needs no compressor for it).
//!
//! What enters: a [`Kernel`] (its modules directory), the host's static
//! busybox (`/usr/bin/busybox`, from `busybox-static`), and the script the
//! guest is to run. What leaves: the archive's bytes, which `qemu.rs` writes
//! to a file of its own for each run.
//!
//! It holds `/bin/busybox` and a link for each applet `/init` uses, the
//! modules of [`MODULES`] and their dependencies (read from each module's
//! `.modinfo` section, as depmod would; `.ko.xz`, `.ko.zst` and `.ko.gz` are
//! decompressed on the host with `xz`, `zstd` and `gzip`, since busybox's
//! insmod reads plain ELF only), `/modules` (their load order), `/init`
//! ([`INIT`]) and `/cmd` (the command's script).
//!
//! `/init` mounts proc, sysfs and devtmpfs, loads the modules, brings
//! loopback up, mounts the host's root read-only over 9p (mount tag
//! `hostroot`) at `/newroot`, puts tmpfs on its `/tmp`, `/run`, `/var/tmp`
//! and `/dev/shm` and the kernel's own proc, sysfs, devtmpfs, devpts, bpffs,
//! debugfs, tracefs and cgroup2 on their places, copies `/cmd` to
//! `/newroot/run/ratelimit-vm/cmd` and runs it with the host's `/bin/sh`
//! under `chroot /newroot`, stdin from /dev/null. Then it prints
//! `RATELIMIT-VM-EXIT=<status>` and powers off. A step that fails before the
//! command prints `RATELIMIT-VM-ERROR=<what>` instead.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::kernels::Kernel;

/// The modules every guest loads, dependencies first added by [`modules`]:
/// virtio (for 9p's transport, when modular), 9p itself, and veth. A module
/// the kernel has built in (modules.builtin) is skipped. Add here what a
/// test needs and the kernels have as modules.
pub(super) const MODULES: &[&str] = &[
    "virtio",
    "virtio_ring",
    "virtio_pci",
    // netfs comes as 9p's dependency where it has one (6.x; 5.10 has none).
    "9pnet",
    "9pnet_virtio",
    "9p",
    "veth",
];

/// The line the guest prints with the command's exit status.
pub(super) const EXIT_MARKER: &str = "RATELIMIT-VM-EXIT=";
/// The line the guest prints when it could not get to the command.
pub(super) const ERROR_MARKER: &str = "RATELIMIT-VM-ERROR=";
/// The first line `/init` prints: the kernel booted and runs user space.
pub(super) const INIT_MARKER: &str = "ratelimit-vm: init";

/// The guest's `/init`, run by busybox's sh.
const INIT: &str = r#"#!/bin/busybox sh
export PATH=/bin
fail() {
    echo "RATELIMIT-VM-ERROR=$*"
    poweroff -f
    echo o > /proc/sysrq-trigger
    sleep 60
}
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo
echo "ratelimit-vm: init"
for m in $(cat /modules); do
    insmod "/lib/modules/$m" || fail "insmod $m"
done
ip link set lo up || fail "ip link set lo up"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot \
    || fail "mounting the host's root over 9p"
# The host's paths under /tmp, /run or /var/tmp the command needs (its
# directory, its binaries: a checkout in /tmp): held aside before the
# guest's tmpfs covers them, then put back in place, read-only.
n=0
while read -r p; do
    n=$((n + 1))
    mkdir -p "/held/$n"
    mount -o bind "/newroot$p" "/held/$n" || fail "holding $p"
done < /keep
for d in tmp run var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs "/newroot/$d" || fail "tmpfs on /$d"
done
n=0
while read -r p; do
    n=$((n + 1))
    mkdir -p "/newroot$p"
    mount -o bind "/held/$n" "/newroot$p" || fail "keeping $p"
done < /keep
chmod 755 /newroot/run
mount -t proc proc /newroot/proc || fail "proc"
mount -t sysfs sysfs /newroot/sys || fail "sysfs"
mount -t devtmpfs devtmpfs /newroot/dev || fail "devtmpfs"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t bpf bpf /newroot/sys/fs/bpf || fail "bpffs"
mount -t debugfs debugfs /newroot/sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /newroot/sys/kernel/tracing 2>/dev/null
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup 2>/dev/null
mkdir -p /newroot/run/ratelimit-vm
cp /cmd /newroot/run/ratelimit-vm/cmd || fail "copying /cmd"
chroot /newroot /bin/sh /run/ratelimit-vm/cmd < /dev/null
echo "RATELIMIT-VM-EXIT=$?"
poweroff -f
echo o > /proc/sysrq-trigger
sleep 60
"#;

/// The busybox applets `/init` calls, linked in `/bin`.
const APPLETS: &[&str] = &[
    "sh", "mkdir", "mount", "cat", "insmod", "ip", "chmod", "cp", "chroot", "poweroff", "echo",
    "sleep", "ls", "dmesg", "lsmod",
];

const BUSYBOX: &str = "/usr/bin/busybox";

/// The archive for `kernel`, with `script` as `/cmd` and `keep` (host
/// paths under /tmp, /run or /var/tmp that stay visible over the guest's
/// tmpfs) as `/keep`.
pub(super) fn build(kernel: &Kernel, script: &str, keep: &[String]) -> Result<Vec<u8>> {
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "lib", "lib/modules", "proc", "sys", "newroot"] {
        cpio.dir(dir);
    }
    cpio.node("dev/console", 0o020600, (5, 1));
    cpio.node("dev/null", 0o020666, (1, 3));
    let busybox = fs::read(BUSYBOX)
        .with_context(|| format!("reading {BUSYBOX}: the busybox-static package provides it"))?;
    if has_interpreter(&busybox) {
        bail!("{BUSYBOX} is linked dynamically: install busybox-static instead of busybox");
    }
    cpio.file("bin/busybox", 0o755, &busybox);
    for applet in APPLETS {
        cpio.symlink(&format!("bin/{applet}"), "busybox");
    }
    let mut order = String::new();
    for (name, path) in modules(kernel, MODULES)? {
        let data = read_module(&path)?;
        let file = format!("{name}.ko");
        cpio.file(&format!("lib/modules/{file}"), 0o644, &data);
        order.push_str(&file);
        order.push('\n');
    }
    cpio.file("modules", 0o644, order.as_bytes());
    cpio.file("init", 0o755, INIT.as_bytes());
    cpio.file("cmd", 0o644, script.as_bytes());
    let mut kept = keep.join("\n");
    if !kept.is_empty() {
        kept.push('\n');
    }
    cpio.file("keep", 0o644, kept.as_bytes());
    Ok(cpio.finish())
}

/// A module's name as the kernel spells it: `_` for `-`, no `.ko*`.
fn module_name(file: &str) -> Option<String> {
    let stem = file.split_once(".ko")?.0;
    Some(stem.replace('-', "_"))
}

/// `wanted` and their dependencies, each after what it depends on, as
/// (name, path); built-in modules are left out.
pub(super) fn modules(kernel: &Kernel, wanted: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let mut files = HashMap::new();
    index(&kernel.modules.join("kernel"), &mut files)?;
    let builtin: HashSet<String> = fs::read_to_string(kernel.modules.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next().and_then(module_name))
        .collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for name in wanted {
        visit(
            &name.replace('-', "_"),
            &files,
            &builtin,
            &mut seen,
            &mut order,
            kernel,
        )?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    files: &HashMap<String, PathBuf>,
    builtin: &HashSet<String>,
    seen: &mut HashSet<String>,
    order: &mut Vec<(String, PathBuf)>,
    kernel: &Kernel,
) -> Result<()> {
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let Some(path) = files.get(name) else {
        if builtin.contains(name) {
            return Ok(());
        }
        bail!(
            "kernel {} ({}) has no module {name}, as a file or built in",
            kernel.name,
            kernel.release
        );
    };
    let data = read_module(path)?;
    for dep in modinfo(&data, "depends")
        .with_context(|| format!("reading the .modinfo of {}", path.display()))?
        .iter()
        .flat_map(|d| d.split(','))
        .filter(|d| !d.is_empty())
    {
        visit(&dep.replace('-', "_"), files, builtin, seen, order, kernel)?;
    }
    order.push((name.to_string(), path.clone()));
    Ok(())
}

/// Every module file under `dir`, by module name.
fn index(dir: &Path, files: &mut HashMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            index(&path, files)?;
        } else if let Some(name) = entry.file_name().to_str().and_then(module_name) {
            files.insert(name, path);
        }
    }
    Ok(())
}

/// A module's ELF, decompressed when its name says it is compressed.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".ko.xz") {
        "xz"
    } else if name.ends_with(".ko.zst") {
        "zstd"
    } else if name.ends_with(".ko.gz") {
        "gzip"
    } else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} -dc (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "{tool} -dc {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The values of `key` in a module's `.modinfo` section (an ELF64
/// little-endian object; the section holds `key=value` strings, each ended by
/// a NUL).
fn modinfo(elf: &[u8], key: &str) -> Result<Vec<String>> {
    let u16_at = |o: usize| -> Result<u64> {
        let b = elf.get(o..o + 2).context("truncated ELF")?;
        Ok(u64::from(u16::from_le_bytes([b[0], b[1]])))
    };
    let u32_at = |o: usize| -> Result<u64> {
        let b = elf.get(o..o + 4).context("truncated ELF")?;
        Ok(u64::from(u32::from_le_bytes(b.try_into()?)))
    };
    let u64_at = |o: usize| -> Result<u64> {
        let b = elf.get(o..o + 8).context("truncated ELF")?;
        Ok(u64::from_le_bytes(b.try_into()?))
    };
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!("not a little-endian ELF64 object");
    }
    let shoff = usize::try_from(u64_at(0x28)?)?;
    let shentsize = usize::try_from(u16_at(0x3a)?)?;
    let shnum = usize::try_from(u16_at(0x3c)?)?;
    let shstrndx = usize::try_from(u16_at(0x3e)?)?;
    let section = |i: usize| -> Result<(u64, usize, usize)> {
        let h = shoff + i * shentsize;
        Ok((
            u32_at(h)?,
            usize::try_from(u64_at(h + 0x18)?)?,
            usize::try_from(u64_at(h + 0x20)?)?,
        ))
    };
    let (_, stroff, strsize) = section(shstrndx)?;
    let strtab = elf.get(stroff..stroff + strsize).context("truncated ELF")?;
    for i in 0..shnum {
        let (name, off, size) = section(i)?;
        let name = strtab
            .get(usize::try_from(name)?..)
            .and_then(|s| s.split(|&b| b == 0).next())
            .unwrap_or_default();
        if name != b".modinfo" {
            continue;
        }
        let data = elf.get(off..off + size).context("truncated ELF")?;
        let prefix = format!("{key}=");
        return Ok(data
            .split(|&b| b == 0)
            .filter_map(|s| std::str::from_utf8(s).ok())
            .filter_map(|s| s.strip_prefix(&prefix))
            .map(str::to_string)
            .collect());
    }
    bail!("no .modinfo section")
}

/// Whether an ELF64 executable asks for a dynamic loader (a PT_INTERP
/// program header).
fn has_interpreter(elf: &[u8]) -> bool {
    let get = |o: usize, n: usize| elf.get(o..o + n);
    let (Some(phoff), Some(phentsize), Some(phnum)) = (get(0x20, 8), get(0x36, 2), get(0x38, 2))
    else {
        return false;
    };
    let phoff = u64::from_le_bytes(phoff.try_into().expect("8 bytes")) as usize;
    let phentsize = usize::from(u16::from_le_bytes([phentsize[0], phentsize[1]]));
    let phnum = usize::from(u16::from_le_bytes([phnum[0], phnum[1]]));
    (0..phnum).any(|i| get(phoff + i * phentsize, 4) == Some(&3u32.to_le_bytes()[..]))
}

/// A `newc` cpio archive being written.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            u32::try_from(data.len()).expect("an initramfs file under 4 GiB"),
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            u32::try_from(name.len() + 1).expect("a short name"),
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, (0, 0), data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, (0, 0), target.as_bytes());
    }

    fn node(&mut self, name: &str, mode: u32, rdev: (u32, u32)) {
        self.entry(name, mode, rdev, &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::{Cpio, module_name};

    #[test]
    fn names_modules_as_the_kernel_does() {
        assert_eq!(
            module_name("9pnet_virtio.ko").as_deref(),
            Some("9pnet_virtio")
        );
        assert_eq!(
            module_name("virtio-rng.ko.xz").as_deref(),
            Some("virtio_rng")
        );
        assert_eq!(module_name("veth.ko.zst").as_deref(), Some("veth"));
        assert_eq!(module_name("modules.order"), None);
    }

    #[test]
    fn writes_newc_headers_aligned() {
        let mut cpio = Cpio::default();
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        let out = cpio.finish();
        assert!(out.starts_with(b"070701"));
        assert_eq!(out.len() % 4, 0);
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
