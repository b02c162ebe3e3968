//! Who a daemon is: (network namespace, interface). Two interfaces with one name
//! in two namespaces are two daemons, with their own lock, socket, saved rules
//! and pins; and where those pins live so that they outlive the process.

use std::{
    fmt,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::error::{Error, Result};

/// A daemon's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The network namespace's cookie: unique for the life of the system, never
    /// reused (inode numbers are, as soon as a namespace is deleted).
    pub netns: u64,
    /// The network namespace's inode (`/proc/self/ns/net`), as `ip netns
    /// identify` and `lsns` show it; the host's is always 4026531840.
    pub netns_inode: u64,
    /// The interface.
    pub iface: String,
}

impl Identity {
    /// The identity of `iface` in the calling thread's network namespace.
    pub fn here(iface: &str) -> Result<Self> {
        let netns_inode = std::fs::metadata("/proc/self/ns/net")
            .map(|m| m.ino())
            .map_err(Error::io("reading /proc/self/ns/net"))?;
        Ok(Self {
            netns: netns_cookie()?,
            netns_inode,
            iface: iface.to_string(),
        })
    }

    /// Whether this is the host's (initial) network namespace.
    pub fn is_host(&self) -> bool {
        self.netns_inode == HOST_NETNS
    }

    /// The directory of this namespace's daemons under `root`: `host`, or
    /// `ns<cookie>` (a deleted namespace's directory is never reused by a new
    /// one).
    pub fn netns_dir(&self, root: &Path) -> PathBuf {
        if self.is_host() {
            root.join("host")
        } else {
            root.join(format!("ns{}", self.netns))
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_host() {
            f.write_str(&self.iface)
        } else {
            write!(f, "{} (network namespace {})", self.iface, self.netns_inode)
        }
    }
}

/// The inode of the initial network namespace (`PROC_NET_INIT_INO`).
pub const HOST_NETNS: u64 = 4_026_531_840;

/// `SO_NETNS_COOKIE` (Linux 5.14), not in the libc crate.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// Set in an identity made from a namespace's inode instead of its cookie
/// (a kernel without the cookie): the two never name the same directory.
const INODE_ID: u64 = 1 << 63;

/// The cookie of the calling thread's network namespace; on a kernel
/// without one (before 5.14), its inode with [`INODE_ID`] set, and the lack
/// noted ([`super::kernel::lacks`]).
pub(crate) fn netns_cookie() -> Result<u64> {
    use super::kernel::{NO_NETNS_COOKIE, lacks, switched_off};
    if switched_off("netns-cookie") {
        lacks(NO_NETNS_COOKIE);
        return netns_inode_id();
    }
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::Io {
            what: "creating a socket to learn the network namespace".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid fd and an out buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let source = std::io::Error::last_os_error();
        // A kernel that does not know the option.
        if source.raw_os_error() == Some(libc::ENOPROTOOPT) {
            lacks(NO_NETNS_COOKIE);
            return netns_inode_id();
        }
        return Err(Error::Io {
            what: "reading the network namespace's cookie".into(),
            source,
        });
    }
    Ok(cookie)
}

/// The calling thread's network namespace by its inode, marked [`INODE_ID`].
fn netns_inode_id() -> Result<u64> {
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino() | INODE_ID)
        .map_err(Error::io("reading /proc/thread-self/ns/net"))
}

const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is a valid out value; the path is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a C string and `st` a valid out value.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}

/// The mount namespace inode of process `pid` (`self` for this one); `None`
/// when it cannot be read (another user's process without CAP_SYS_PTRACE, as
/// PID 1 is to the hardened unit).
fn mount_ns(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .map(|m| m.ino())
        .ok()
}

/// The device of the filesystem at `path` (each bpffs mount is a filesystem
/// of its own; a bind mount of one shares its device).
fn device(path: &Path) -> Option<u64> {
    std::fs::metadata(path).map(|m| m.dev()).ok()
}

/// The bpffs where a daemon pins: one that outlives the process.
pub struct BpfRoot {
    /// The path to use in system calls: `/sys/fs/bpf`, or a descriptor of
    /// the init mount namespace's `/sys/fs/bpf` held open (`/proc/self/fd/N`).
    pub path: PathBuf,
    /// The path as the operator knows it (`/sys/fs/bpf`).
    pub shown: PathBuf,
    /// Keeps `path` valid when it is a descriptor.
    _fd: Option<std::fs::File>,
}

/// Finds the bpffs whose pins outlive this process, mounting one if there is
/// none:
/// - where this process's mount namespace is the lasting one (no ancestor
///   in another namespace it can see, as in the init namespace, or the
///   hardened unit, which cannot see PID 1's and whose /sys/fs/bpf is the
///   system's, bound in): `/sys/fs/bpf`, mounted if missing (some containers
///   and minimal systems lack it), where the system sees it;
/// - in a mount namespace of its own (`ip netns exec` gives its command one,
///   with a fresh /sys where a bpffs would vanish with the last process of
///   the namespace, however many share it: a shell, `cargo xtask run`): the
///   `/sys/fs/bpf` of the nearest ancestor process in another mount
///   namespace (the shell `ip netns exec` was typed in), held open by a
///   descriptor, and mounted in that namespace if missing. Never one mounted
///   in the private namespace.
pub fn bpffs_root() -> Result<BpfRoot> {
    lasting_bpffs(true).map(|r| r.expect("mounted when missing"))
}

/// [`bpffs_root`] without mounting: `None` where it would mount one (then
/// nothing is pinned anywhere). For the read-only commands.
pub fn find_bpffs() -> Result<Option<BpfRoot>> {
    lasting_bpffs(false)
}

fn lasting_bpffs(mount: bool) -> Result<Option<BpfRoot>> {
    let shown = PathBuf::from(BPFFS);
    let here = || BpfRoot {
        path: shown.clone(),
        shown: shown.clone(),
        _fd: None,
    };
    let Some(pid) = lasting_ancestor() else {
        if is_bpffs(&shown) {
            return Ok(Some(here()));
        }
        if !mount {
            return Ok(None);
        }
        mount_bpffs(None)?;
        return Ok(Some(here()));
    };
    let there = Path::new("/proc")
        .join(pid.to_string())
        .join("root")
        .join(BPFFS.trim_start_matches('/'));
    if !is_bpffs(&there) {
        if !mount {
            return Ok(None);
        }
        mount_bpffs(Some(pid))?;
    }
    if is_bpffs(&shown) && device(&shown) == device(&there) {
        return Ok(Some(here()));
    }
    let dir =
        std::fs::File::open(&there).map_err(Error::io(format!("opening {}", there.display())))?;
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    ));
    tracing::debug!(
        pid,
        "this process runs in a mount namespace of its own (as under `ip netns exec`): pinning in the bpffs of its ancestor's namespace, where pins outlive it"
    );
    Ok(Some(BpfRoot {
        path,
        shown,
        _fd: Some(dir),
    }))
}

/// The nearest ancestor process in another mount namespace than this one,
/// or `None` when this one is the lasting namespace: no ancestor it can see
/// is elsewhere (the chain ends at PID 1 in this namespace, or at a process
/// whose namespace it may not read). A process whose parent is gone (started
/// in the background from a shell that exited) reaches PID 1; where PID 1's
/// namespace cannot be read (a PID 1 with capabilities this process lacks),
/// kthreadd's (PID 2) stands for it: the kernel's threads live in the init
/// mount namespace.
fn lasting_ancestor() -> Option<u32> {
    let mine = mount_ns("self")?;
    let mut pid = std::os::unix::process::parent_id();
    // Bounded: process trees are far shallower.
    for _ in 0..64 {
        if pid == 0 {
            return None;
        }
        match mount_ns(&pid.to_string()) {
            None if pid == 1 => {
                return mount_ns("2").filter(|ns| *ns != mine).map(|_| 2);
            }
            None => return None,
            Some(ns) if ns != mine => return Some(pid),
            Some(_) if pid == 1 => return None,
            Some(_) => pid = parent_of(pid)?,
        }
    }
    None
}

/// The parent of process `pid` (the field after the command in
/// `/proc/PID/stat`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command is in parentheses and may hold spaces or parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Mounts bpffs at /sys/fs/bpf: here, or in the mount namespace of process
/// `pid` (from a child process: a thread of this one cannot change its
/// mount namespace).
fn mount_bpffs(pid: Option<u32>) -> Result<()> {
    let fail = |source: std::io::Error| {
        // Without CAP_SYS_ADMIN nothing can be mounted, and without it (or
        // CAP_SYS_PTRACE) an ancestor's bpffs cannot be reached either: the
        // way `ip netns exec` under the unit's capabilities ends.
        let how = if source.raw_os_error() == Some(libc::EPERM) {
            "; mounting needs CAP_SYS_ADMIN. With fewer capabilities (the unit's), run the daemon in the host's mount namespace: `nsenter --net=/run/netns/NAME ratelimit run …` or the unit's NetworkNamespacePath=, not `ip netns exec`, whose fresh /sys has no bpffs"
        } else {
            ""
        };
        Error::Io {
            what: format!(
                "{BPFFS} is not bpffs and mounting it failed (mount -t bpf bpf {BPFFS}){how}"
            ),
            source,
        }
    };
    let path = std::ffi::CString::new(BPFFS).expect("no NUL");
    let fstype = std::ffi::CString::new("bpf").expect("no NUL");
    let Some(pid) = pid else {
        let _ = std::fs::create_dir_all(BPFFS);
        // SAFETY: C strings; no data argument.
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                path.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        tracing::info!("mounted bpffs at {BPFFS}");
        return Ok(());
    };
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).map_err(fail)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&ns);
    // SAFETY: the child calls only async-signal-safe system calls on values
    // prepared before the fork, then _exit; the parent waits for it.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: see above.
        unsafe {
            let ok = libc::setns(fd, libc::CLONE_NEWNS) == 0
                && libc::mount(
                    fstype.as_ptr(),
                    path.as_ptr(),
                    fstype.as_ptr(),
                    0,
                    std::ptr::null(),
                ) == 0;
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(fail(std::io::Error::other(format!(
            "in the mount namespace of process {pid}"
        ))));
    }
    tracing::info!(
        pid,
        "mounted bpffs at {BPFFS} in the mount namespace of process {pid}"
    );
    Ok(())
}

/// The layout of the maps this build pins. A daemon never adopts pins of another
/// layout: they live under another directory.
pub const PIN_LAYOUT: &str = "v12";

/// What [`PIN_LAYOUT`] was recorded for: a digest of the code that decides
/// what is pinned (the maps' types in `ratelimit-common/src/maps/` and the
/// maps themselves in `ratelimit-ebpf/src/program/maps.rs`, comments and
/// blanks aside). A test fails when that code changes and this is not
/// recorded again: a change to what is pinned bumps the layout first.
pub const PIN_LAYOUT_OF: u64 = 0x74e3_edcc_94e5_f2ca;

/// Layouts of earlier versions whose running program a daemon of this one
/// takes over (an upgrade with `--keep-attached`): its link is swapped to
/// this version's program, its maps unpinned.
pub const OLDER_LAYOUTS: &[&str] = &["v11", "v10", "v9"];

/// A test-only switch: `RATELIMIT_TEST_PIN_LAYOUT=v9` (one of
/// [`OLDER_LAYOUTS`]) makes the daemon pin where an earlier version did: the
/// tests' way to run an upgrade with one build. Any other value is ignored.
pub const TEST_PIN_LAYOUT: &str = "RATELIMIT_TEST_PIN_LAYOUT";

/// The layout this process pins under: [`PIN_LAYOUT`], unless the test
/// switch [`TEST_PIN_LAYOUT`] names an older one.
pub fn pin_layout() -> &'static str {
    std::env::var(TEST_PIN_LAYOUT)
        .ok()
        .and_then(|v| OLDER_LAYOUTS.iter().find(|l| **l == v).copied())
        .unwrap_or(PIN_LAYOUT)
}

/// Where the daemon of `id` pins its link and maps under `root`.
pub fn pin_dir(root: &Path, id: &Identity) -> PathBuf {
    pin_dir_of(root, id, pin_layout())
}

/// Where a daemon of pin layout `layout` pins them.
pub fn pin_dir_of(root: &Path, id: &Identity, layout: &str) -> PathBuf {
    id.netns_dir(&root.join("ratelimit").join(layout))
        .join(&id.iface)
}

#[cfg(test)]
mod tests {
    /// FNV-1a of the code under the pinned layout, comments and blanks
    /// aside, file by file in name order (see [`super::PIN_LAYOUT_OF`]).
    fn layout_digest() -> u64 {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let maps = root.join("ratelimit-common/src/maps");
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&maps)
            .expect("ratelimit-common/src/maps")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        files.push(root.join("ratelimit-ebpf/src/program/maps.rs"));
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            let name = file
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            let code = text
                .lines()
                .map(|l| l.split_once("//").map_or(l, |(code, _)| code).trim())
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("\n");
            for b in name.bytes().chain([0]).chain(code.bytes()).chain([0]) {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        hash
    }

    #[test]
    fn a_change_to_what_is_pinned_bumps_the_layout() {
        let now = layout_digest();
        assert_eq!(
            now,
            super::PIN_LAYOUT_OF,
            "the code of the pinned maps changed (ratelimit-common/src/maps/, ratelimit-ebpf/src/program/maps.rs): its digest is now {now:#018x}. If what is pinned changed (a map's key or value type, a field, a size, a map's name or kind), bump PIN_LAYOUT (from {}; add the old one to OLDER_LAYOUTS if an upgrade can take its program over, and say what an upgrade does in CHANGELOG.md); then, either way, record PIN_LAYOUT_OF = {now:#018x}",
            super::PIN_LAYOUT
        );
    }

    use super::*;

    #[test]
    fn pins_are_per_namespace_and_interface() {
        let host = Identity {
            netns: 1,
            netns_inode: HOST_NETNS,
            iface: "eth0".into(),
        };
        let other = |cookie| Identity {
            netns: cookie,
            netns_inode: 4_026_532_000,
            iface: "eth0".into(),
        };
        let root = Path::new("/sys/fs/bpf");
        assert_eq!(
            pin_dir(root, &host),
            Path::new("/sys/fs/bpf/ratelimit/v12/host/eth0")
        );
        // One inode, reused by a later namespace: another directory.
        assert_ne!(pin_dir(root, &other(7)), pin_dir(root, &other(8)));
        assert_eq!(
            pin_dir(root, &other(7)),
            Path::new("/sys/fs/bpf/ratelimit/v12/ns7/eth0")
        );
    }

    #[test]
    fn the_calling_threads_namespace_has_a_cookie() {
        let id = Identity::here("lo").unwrap();
        assert_ne!(id.netns, 0);
        assert_eq!(id, Identity::here("lo").unwrap());
    }
}
