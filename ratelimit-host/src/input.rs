//! Reading the files an operator names: the config file (`--config`,
//! `ratelimit check`, every reload) and list files (`[[list]]` paths,
//! `deny|allow --from FILE`, and standard input for `--from -`).
//!
//! What enters: a path. What leaves: its whole text, or a message that names
//! the file and says what is wrong with it. Only a regular file is read (a
//! FIFO would block the reader until someone writes to it, `/dev/zero` never
//! ends), and at most a cap of bytes ([`CONFIG_MAX_BYTES`],
//! [`LIST_MAX_BYTES`]): a file that is larger, or that grows past the cap
//! while it is read, is refused, so a reader's memory is bounded by the cap.
//! The file is opened without blocking (a FIFO without a writer would block
//! `open` itself), then checked, then read.

use std::{
    io::Read as _,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

/// The largest config file read, bytes (16 MiB: some 150 000 rules).
pub const CONFIG_MAX_BYTES: u64 = 16 << 20;
/// The largest list file read, bytes (256 MiB: some 15 million entries; the
/// default `--max-list-entries` of 1 048 576 takes about 16 MiB of list).
pub const LIST_MAX_BYTES: u64 = 256 << 20;

/// What a reader is reading, for messages and its cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A config file: at most [`CONFIG_MAX_BYTES`].
    Config,
    /// A list file: at most [`LIST_MAX_BYTES`].
    List,
}

impl Kind {
    /// The most bytes read of such a file.
    pub const fn cap(self) -> u64 {
        match self {
            Kind::Config => CONFIG_MAX_BYTES,
            Kind::List => LIST_MAX_BYTES,
        }
    }

    /// `a config file`, `a list`.
    const fn noun(self) -> &'static str {
        match self {
            Kind::Config => "a config file",
            Kind::List => "a list",
        }
    }
}

/// Reads the regular file `path` whole, at most `kind`'s cap. `what` names it
/// in messages (`the config file`, `the list /etc/ratelimit/bans.netset`).
pub fn read(path: &Path, kind: Kind, what: &str) -> Result<String, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        // A FIFO without a writer would block open(2) itself.
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let is = if ft.is_fifo() {
            "a FIFO (named pipe)"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(format!(
            "{what} is {is}, not a regular file: {} must be a regular file (it is read whole, and a pipe or a device may never end)",
            kind.noun()
        ));
    }
    if meta.len() > kind.cap() {
        return Err(too_large(what, kind, Some(meta.len())));
    }
    // Back to blocking reads (O_NONBLOCK means nothing to a regular file, but
    // say what is meant).
    // SAFETY: a valid fd; F_SETFL with flags read from it.
    unsafe {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    // The size may be wrong (a file that grows, /proc files say 0): the cap
    // holds for what is read.
    capped(file, kind, what)
}

/// Reads standard input whole, at most `kind`'s cap (`--from -`).
pub fn read_stdin(kind: Kind) -> Result<String, String> {
    capped(std::io::stdin().lock(), kind, "standard input")
}

/// Reads `r` to its end, refusing it past `kind`'s cap.
fn capped(r: impl std::io::Read, kind: Kind, what: &str) -> Result<String, String> {
    let mut text = String::new();
    r.take(kind.cap() + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {what}: {e}"))?;
    if text.len() as u64 > kind.cap() {
        return Err(too_large(what, kind, None));
    }
    Ok(text)
}

fn too_large(what: &str, kind: Kind, size: Option<u64>) -> String {
    let cap = kind.cap();
    match size {
        Some(n) => format!(
            "{what} is {} ({n} bytes): {} may be at most {} ({cap} bytes)",
            mib(n),
            kind.noun(),
            mib(cap)
        ),
        None => format!(
            "{what} holds more than {} ({cap} bytes), the most {} may be",
            mib(cap),
            kind.noun()
        ),
    }
}

/// `300 MiB`, `1.5 MiB`.
fn mib(n: u64) -> String {
    let m = n as f64 / f64::from(1 << 20);
    let s = format!("{m:.1}");
    format!("{} MiB", s.trim_end_matches(".0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("rl-input-{tag}-{}", std::process::id()))
    }

    #[test]
    fn a_regular_file_is_read_whole() {
        let p = tmp("ok");
        std::fs::write(&p, "198.18.0.1\n").unwrap();
        assert_eq!(read(&p, Kind::List, "the list").unwrap(), "198.18.0.1\n");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_fifo_is_refused_at_once_naming_what_it_is() {
        let p = tmp("fifo");
        let _ = std::fs::remove_file(&p);
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: a blocking open would never return.
        let e = read(&p, Kind::List, &format!("the list {}", p.display())).unwrap_err();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("is a FIFO (named pipe)"),
            "{e}"
        );
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = read(Path::new("/dev/zero"), Kind::List, "/dev/zero").unwrap_err();
        assert!(e.starts_with("/dev/zero is a character device"), "{e}");
        let e = read(Path::new("/"), Kind::Config, "the config file").unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
    }

    #[test]
    fn a_file_past_the_cap_is_refused_with_the_cap() {
        let p = tmp("big");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(CONFIG_MAX_BYTES + 1).unwrap();
        let e = read(&p, Kind::Config, "the config file").unwrap_err();
        assert_eq!(
            e,
            format!(
                "the config file is 16 MiB ({} bytes): a config file may be at most 16 MiB (16777216 bytes)",
                CONFIG_MAX_BYTES + 1
            )
        );
        let _ = std::fs::remove_file(&p);
        // What grows past the cap while it is read (or says a size of 0).
        let e = capped(std::io::repeat(b'x'), Kind::Config, "standard input").unwrap_err();
        assert_eq!(
            e,
            "standard input holds more than 16 MiB (16777216 bytes), the most a config file may be"
        );
    }
}
