//! The run directory: each daemon's lock, control socket, saved rules and
//! attach mode, under `/run/ratelimit/<network namespace>/` (or
//! `$RATELIMIT_RUN_DIR/...`), in directories only root owns.
//!
//! A directory that is not the caller's own (root's), or that is a symbolic
//! link, is refused with the reason: whoever owns it could swap the socket for
//! their own listener or point a file at one of root's. Files are opened without
//! following links, and written whole or not at all (a temporary file, fsync,
//! rename, fsync of the directory).

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
    identity::Identity,
};

/// The root of the run directories: `RATELIMIT_RUN_DIR` (tests), else
/// `/run/ratelimit`.
pub fn run_root() -> PathBuf {
    std::env::var_os("RATELIMIT_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/ratelimit"))
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
/// nobody else may write in it (mode 0700 is set if root owns it but it is more
/// open); creates it, 0700, if it is missing (its parent first, likewise).
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
    if meta.mode() & 0o077 != 0 {
        // Ours, but open to others: close it.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(
            Error::io(format!("setting {} to mode 0700", path.display())),
        )?;
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

/// Writes `bytes` to `path` whole or not at all: a new temporary file beside it
/// (created exclusively, never through a link), fsync, rename over `path`, fsync
/// of the directory. A crash leaves the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = open_nofollow(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
        .map_err(|e| refused_link(&tmp, e))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Io {
            what: format!("writing {}", path.display()),
            source: e,
        });
    }
    if let Ok(d) = File::open(dir) {
        // SAFETY: a valid fd; fsync of a directory makes the rename durable.
        unsafe { libc::fsync(d.as_raw_fd()) };
    }
    Ok(())
}

/// Removes `path` if it is there (a link is removed, never followed).
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
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
    fn an_open_directory_of_ours_is_closed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tmp("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        secure_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
