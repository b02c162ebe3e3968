//! The run directory: each daemon's lock, control socket, saved rules and
//! attach mode, under `/run/ratelimit/<network namespace>/` (or
//! `$RATELIMIT_RUN_DIR/...`), in directories only root owns.
//!
//! A directory that is not the caller's own (root's), that others may write
//! in, or that is a symbolic link, is refused with the reason: whoever owns it
//! or writes in it could swap the socket for their own listener or point a
//! file at one of root's. A directory is never chmodded: one the daemon did
//! not make may be shared (`RATELIMIT_RUN_DIR=/tmp`). A shared directory
//! with the sticky bit that root owns (`/tmp`) gets a `ratelimit` directory
//! of the daemon's own inside it. Files are opened without following links,
//! and written whole or not at all (a temporary file, fsync, rename, fsync of
//! the directory); a temporary file a killed daemon left is removed at the
//! next start, and so are the directories of network namespaces that are gone
//! ([`sweep`]).

use std::{
    ffi::CString,
    fs::File,
    io::{Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use crate::{
    error::{Error, Result},
    host::identity::Identity,
};

/// The root of the run directories: `RATELIMIT_RUN_DIR` (tests), else
/// `/run/ratelimit`; `ratelimit` inside it when it is a shared directory with
/// the sticky bit that root owns, like `/tmp` (see [`own_dir_in`]).
pub fn run_root() -> PathBuf {
    let root = std::env::var_os("RATELIMIT_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/ratelimit"));
    own_dir_in(root)
}

/// `dir`, or `dir/ratelimit` when `dir` is a directory everybody may write
/// in with the sticky bit set, owned by root (`/tmp`, `/var/tmp`): there
/// others cannot remove or rename what root makes, so a directory of root's
/// own inside it is safe, while the shared directory itself must stay open
/// to all.
fn own_dir_in(dir: PathBuf) -> PathBuf {
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o1002 == 0o1002 => dir.join("ratelimit"),
        _ => dir,
    }
}

/// The run directory of `id`'s network namespace.
pub fn netns_dir(id: &Identity) -> PathBuf {
    id.netns_dir(&run_root())
}

/// Checks (creating them if missing) the run root and `id`'s namespace
/// directory: both root's, closed to others, not links. The root counts too:
/// whoever may write in it could swap the namespace directory for their own.
pub fn secure(id: &Identity) -> Result<()> {
    secure_dir(&run_root())?;
    secure_dir(&netns_dir(id))
}

/// The files a daemon keeps in its namespace's directory.
pub const FILES: [&str; 4] = ["lock", "sock", "rules.json", "mode"];

/// Refuses `id`'s files that are symbolic links or not root's: whoever made
/// them could point root's writes elsewhere or answer in the daemon's name.
pub fn check_files(id: &Identity) -> Result<()> {
    for suffix in FILES {
        let path = file(id, suffix);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let why = if meta.file_type().is_symlink() {
            "is a symbolic link".to_string()
        } else if meta.uid() != euid() {
            format!("is owned by uid {}, not root", meta.uid())
        } else {
            continue;
        };
        return Err(Error::Refused(format!(
            "{} {why}: ratelimit never writes or trusts such a file in its run directory; remove it (and find out who made it)",
            path.display()
        )));
    }
    Ok(())
}

/// A file of `id`'s daemon: `<netns dir>/<iface>.<suffix>`.
pub fn file(id: &Identity, suffix: &str) -> PathBuf {
    netns_dir(id).join(format!("{}.{suffix}", id.iface))
}

fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

fn cstr(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::invalid("path", format!("{} contains a NUL byte", path.display())))
}

/// Checks that `path` is a real directory owned by this user (root) and that
/// nobody else may write in it (a directory others may write in is refused,
/// never chmodded: it may be shared); creates it, 0700, if it is missing (its
/// parent first, likewise).
pub fn secure_dir(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent()
                && parent != Path::new("/run")
                && parent != Path::new("/")
                && !parent.as_os_str().is_empty()
                && !parent.exists()
            {
                secure_dir(parent)?;
            }
            let c = cstr(path)?;
            // SAFETY: a C string.
            if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(Error::Io {
                        what: format!("creating {}", path.display()),
                        source: e,
                    });
                }
            }
            check_dir(path)
        }
        Err(e) => Err(Error::Io {
            what: format!("reading {}", path.display()),
            source: e,
        }),
        Ok(_) => check_dir(path),
    }
}

fn check_dir(path: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(Error::io(format!("reading {}", path.display())))?;
    let refuse = |why: String| {
        Error::Refused(format!(
            "{} {why}: ratelimit keeps its lock, socket and saved rules only in a directory root owns and nobody else can write; remove it (it is re-created) or set RATELIMIT_RUN_DIR to another place",
            path.display()
        ))
    };
    if meta.file_type().is_symlink() {
        return Err(refuse("is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    if meta.uid() != euid() {
        return Err(refuse(format!("is owned by uid {}, not root", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        // Root's, but others may write in it: it may be shared (a directory
        // like /tmp without the sticky bit), so it is left as it is.
        return Err(refuse(format!(
            "is writable by others (mode {:04o}; ratelimit never changes a directory's mode: `chmod go-w` it if it is ratelimit's alone)",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Opens `path` without following a symbolic link, `flags` added.
fn open_nofollow(path: &Path, flags: i32, mode: u32) -> std::io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a C string; the fd is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Checks that an open file is a regular file of ours.
fn check_file(path: &Path, f: &File) -> Result<()> {
    let meta = f
        .metadata()
        .map_err(Error::io(format!("reading {}", path.display())))?;
    if !meta.is_file() || meta.uid() != euid() {
        return Err(Error::Refused(format!(
            "{} is not a regular file owned by root: remove it",
            path.display()
        )));
    }
    Ok(())
}

fn refused_link(path: &Path, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        Error::Refused(format!(
            "{} is a symbolic link: ratelimit never follows one in its run directory; remove it",
            path.display()
        ))
    } else {
        Error::Io {
            what: format!("opening {}", path.display()),
            source: e,
        }
    }
}

/// Opens (creating it, 0600) the lock file `path`.
pub fn open_lock(path: &Path) -> Result<File> {
    let f = open_nofollow(path, libc::O_RDWR | libc::O_CREAT, 0o600)
        .map_err(|e| refused_link(path, e))?;
    check_file(path, &f)?;
    Ok(f)
}

/// Reads the file `path` if it exists: not through a symbolic link, and only if
/// it is root's.
pub fn read(path: &Path) -> Result<Option<String>> {
    let mut f = match open_nofollow(path, libc::O_RDONLY, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(refused_link(path, e)),
    };
    check_file(path, &f)?;
    let mut text = String::new();
    f.read_to_string(&mut text)
        .map_err(Error::io(format!("reading {}", path.display())))?;
    Ok(Some(text))
}

/// Writes `bytes` into the file `path` at `at`, cutting off whatever was
/// past `at` (the tail of an append no record named), and flushes it; the
/// file's new length. The bytes before `at` are not touched, so a record
/// that names a length up to `at` reads what it read before.
pub fn append_at(path: &Path, at: u64, bytes: &[u8]) -> Result<u64> {
    use std::io::{Seek as _, Write as _};
    let mut f = open_nofollow(path, libc::O_WRONLY, 0).map_err(|e| refused_link(path, e))?;
    check_file(path, &f)?;
    let what = format!("writing {}", path.display());
    let io = |source| Error::Io {
        what: what.clone(),
        source,
    };
    f.set_len(at).map_err(io)?;
    f.seek(std::io::SeekFrom::Start(at)).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_data().map_err(io)?;
    Ok(at + bytes.len() as u64)
}

/// Writes `bytes` to `path` whole or not at all: a new temporary file beside it
/// (created exclusively, never through a link), fsync, rename over `path`, fsync
/// of the directory. A crash leaves the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    stage(path, bytes)?.commit()
}

/// A file written and flushed under a temporary name beside its path, not
/// in place yet: [`Staged::commit`] renames it over its path; dropped
/// uncommitted, it is removed. Whether it can be written at all (a full
/// disk) is known before anything else is changed.
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    done: bool,
}

/// Writes `bytes` to a temporary file beside `path` (created exclusively,
/// never through a link) and flushes it.
pub fn stage(path: &Path, bytes: &[u8]) -> Result<Staged> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = open_nofollow(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
        .map_err(|e| refused_link(&tmp, e))?;
    let staged = Staged {
        tmp,
        path: path.to_path_buf(),
        done: false,
    };
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(Error::io(format!("writing {}", path.display())))?;
    Ok(staged)
}

impl Staged {
    /// Puts the file in place (rename, then fsync of the directory).
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.path)
            .map_err(Error::io(format!("writing {}", self.path.display())))?;
        self.done = true;
        if let Some(dir) = self.path.parent()
            && let Ok(d) = File::open(dir)
        {
            // SAFETY: a valid fd; fsync of a directory makes the rename durable.
            unsafe { libc::fsync(d.as_raw_fd()) };
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Removes `path` if it is there (a link is removed, never followed).
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// What a daemon starting for `id` tidies, holding its lock: the temporary
/// files a killed daemon of `id` left, and the directories of namespaces that
/// are gone ([`sweep`]). Each removal is logged.
pub fn tidy(id: &Identity) {
    for name in remove_stale_temps(id) {
        tracing::info!(file = %netns_dir(id).join(&name).display(), "removed a temporary file a daemon killed while it saved left");
    }
    for dir in sweep() {
        tracing::info!(dir = %dir.display(), "removed the run directory of a network namespace that is gone");
    }
}

/// Whether `name` is a temporary file [`write_atomic`] makes for `id`'s
/// file `suffix`: `.IFACE.SUFFIX.PID.tmp`.
fn is_temp_of(name: &str, iface: &str, suffix: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|n| n.strip_prefix(iface))
        .and_then(|n| n.strip_prefix('.'))
        .and_then(|n| n.strip_prefix(suffix))
        .and_then(|n| n.strip_prefix('.'))
        .and_then(|n| n.strip_suffix(".tmp"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes the temporary files a daemon of `id` killed while it wrote (say,
/// SIGKILL during a save) left; returns their names. Call it holding `id`'s
/// lock: nobody else writes them then.
pub fn remove_stale_temps(id: &Identity) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(netns_dir(id)) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let list_temp = name
            .strip_prefix(&format!(".{}.list-", id.iface))
            .is_some_and(|rest| rest.ends_with(".tmp"));
        if (list_temp || FILES.iter().any(|s| is_temp_of(&name, &id.iface, s)))
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed.push(name);
        }
    }
    removed
}

/// Removes the directories of network namespaces that are gone
/// (`ns<cookie>`, left by daemons and commands run in a namespace since
/// deleted): those whose cookie no live namespace has, in which no daemon
/// holds a lock, and that hold only the daemons' files. Returns the removed
/// directories. Nothing is removed when the live namespaces cannot all be
/// known (not root enough to enter them, a process whose namespace cannot be
/// read).
pub fn sweep() -> Vec<PathBuf> {
    let Some((dirs, live)) = gone_namespaces(&run_root()) else {
        return Vec::new();
    };
    dirs.into_iter()
        .filter(|(cookie, _)| !live.contains(cookie))
        .filter_map(|(_, dir)| remove_ns_dir(&dir).then_some(dir))
        .collect()
}

/// The cookies of the network namespaces alive.
pub(crate) type LiveCookies = std::collections::HashSet<u64>;

/// The `ns<cookie>` directories under `root` (a run directory, a pin
/// layout's directory), with their cookies, and the cookies of the network
/// namespaces alive: `None` when there are no such directories or the live
/// namespaces cannot all be known (then nothing may be removed).
pub(crate) fn gone_namespaces(root: &Path) -> Option<(Vec<(u64, PathBuf)>, LiveCookies)> {
    let entries = std::fs::read_dir(root).ok()?;
    // Listed before the live namespaces are looked up: a directory listed
    // belongs to a namespace made before, which is found if it is alive.
    let dirs: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let cookie = name.to_str()?.strip_prefix("ns")?.parse::<u64>().ok()?;
            Some((cookie, e.path()))
        })
        .collect();
    if dirs.is_empty() {
        return None;
    }
    Some((dirs, live_netns_cookies()?))
}

/// The names of the files daemons keep in a namespace directory end so.
const FILE_ENDS: [&str; 6] = [".lock", ".sock", ".rules.json", ".mode", ".tmp", ".entries"];

/// Removes a namespace directory that is root's, holds only daemons' files
/// and no lock a daemon holds; whether it did.
fn remove_ns_dir(dir: &Path) -> bool {
    let ok = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == euid());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    let ours = files.iter().all(|f| {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
        std::fs::symlink_metadata(f).is_ok_and(|m| !m.is_dir())
            && name.is_some_and(|n| FILE_ENDS.iter().any(|end| n.ends_with(end)))
    });
    let held = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "lock"))
        .any(|f| is_locked(f));
    if !ok || !ours || held {
        return false;
    }
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    std::fs::remove_dir(dir).is_ok()
}

/// Whether someone holds the lock file `path` (a daemon runs).
fn is_locked(path: &Path) -> bool {
    let Ok(f) = open_nofollow(path, libc::O_RDONLY, 0) else {
        return false;
    };
    // SAFETY: a valid fd; the lock, if taken, goes with the fd.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

/// The cookies of every network namespace alive now: those of the
/// processes (each thread), of `ip netns` (`/run/netns`) and of the nsfs
/// files mounted elsewhere. `None` when one cannot be learnt: a namespace
/// that cannot be entered (entering it is the only way to learn its cookie,
/// and needs CAP_SYS_ADMIN), or a process whose namespace cannot be opened
/// (a process ptrace may not see) and that shares it with no process whose
/// namespace can be (its `/proc/PID/net`, which anybody may look at, tells
/// which namespace it shares).
fn live_netns_cookies() -> Option<std::collections::HashSet<u64>> {
    use std::collections::{HashMap, HashSet};
    // One open file per namespace (by inode); the /proc/PID/net of the
    // threads seen in one, and of those whose namespace could not be opened.
    let mut by_inode: HashMap<u64, File> = HashMap::new();
    let mut seen_net: HashSet<u64> = HashSet::new();
    let mut unseen_net: HashSet<u64> = HashSet::new();
    let net_of = |task: &Path| {
        std::fs::metadata(task.join("net/dev"))
            .map(|m| m.ino())
            .ok()
    };
    let mut open = |path: &Path, task: Option<&Path>| -> Option<()> {
        match File::open(path) {
            Ok(file) => {
                let ino = file.metadata().ok()?.ino();
                by_inode.entry(ino).or_insert(file);
                seen_net.extend(task.and_then(net_of));
            }
            // A process that ended, a file unmounted: nothing to find.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && task.is_some() => {
                unseen_net.insert(task.and_then(net_of)?);
            }
            Err(_) => return None,
        }
        Some(())
    };
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = p.file_name();
        if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let task = t.path();
            open(&task.join("ns/net"), Some(&task))?;
        }
    }
    if let Ok(named) = std::fs::read_dir("/run/netns") {
        for e in named.flatten() {
            open(&e.path(), None)?;
        }
    }
    if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
        for line in mounts.lines() {
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT ... - FSTYPE SOURCE ...
            let fields: Vec<&str> = line.split(' ').collect();
            let fstype = line.split(" - ").nth(1).and_then(|r| r.split(' ').next());
            if fstype == Some("nsfs") && fields.get(3).is_some_and(|r| r.starts_with("net:")) {
                open(Path::new(&fields[4].replace("\\040", " ")), None)?;
            }
        }
    }
    if !unseen_net.is_subset(&seen_net) {
        return None;
    }
    // Each namespace entered in turn, on a thread of its own: the caller's
    // threads stay where they are.
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut cookies = HashSet::new();
            for file in by_inode.values() {
                // SAFETY: a valid nsfs fd; only this thread moves.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return None;
                }
                cookies.insert(crate::host::identity::netns_cookie().ok()?);
            }
            Some(cookies)
        })
        .join()
        .ok()
        .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("rl-rundir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn writes_are_whole_and_reads_refuse_links() {
        let dir = tmp("atomic");
        secure_dir(&dir).unwrap();
        let f = dir.join("x.rules.json");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(read(&f).unwrap().as_deref(), Some("two"));
        let link = dir.join("y.rules.json");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = read(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(read(&dir.join("none")).unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let real = tmp("real");
        secure_dir(&real).unwrap();
        let link = tmp("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = secure_dir(&link).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&real);
    }

    #[test]
    fn a_directory_others_may_write_in_is_refused_and_left_as_it_is() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tmp("open");
        std::fs::create_dir(&dir).unwrap();
        for (mode, ok) in [(0o777, false), (0o770, false), (0o755, true), (0o700, true)] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let got = secure_dir(&dir);
            assert_eq!(got.is_ok(), ok, "mode {mode:o}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("is writable by others"), "{e}");
            }
            // Never chmodded: it may be shared.
            assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, mode);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_shared_sticky_directory_gets_a_directory_of_its_own() {
        // /tmp: root's, 1777.
        let tmp_mode = std::fs::metadata("/tmp").unwrap().mode() & 0o7777;
        if tmp_mode == 0o1777 {
            assert_eq!(own_dir_in("/tmp".into()), Path::new("/tmp/ratelimit"));
        }
        let dir = tmp("plain");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(own_dir_in(dir.clone()), dir);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn temporary_files_are_known_by_interface_and_file() {
        assert!(is_temp_of(
            ".eth0.rules.json.4242.tmp",
            "eth0",
            "rules.json"
        ));
        assert!(is_temp_of(".eth0.mode.7.tmp", "eth0", "mode"));
        // Another interface's, whose name starts alike.
        assert!(!is_temp_of(
            ".eth0.100.rules.json.4242.tmp",
            "eth0",
            "rules.json"
        ));
        assert!(!is_temp_of(".eth0.rules.json.tmp", "eth0", "rules.json"));
        assert!(!is_temp_of("eth0.rules.json", "eth0", "rules.json"));
        assert!(!is_temp_of(
            ".eth0.rules.json.12x.tmp",
            "eth0",
            "rules.json"
        ));
    }
}
