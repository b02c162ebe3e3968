//! Pin directories whose network namespace is gone: a daemon SIGKILLed, or
//! run with `--keep-attached`, in a namespace deleted since. Their
//! interfaces went with the namespace, so nothing they hold enforces
//! anything, while their maps hold kernel memory (the default IPv4 state
//! map alone is ~80 MiB) for as long as the pins stay: a namespace's cookie
//! is never reused, so no daemon ever adopts them.
//!
//! Found under every pin layout (`/sys/fs/bpf/ratelimit/v*/ns<cookie>`: a
//! layout of an older version is as stale once its namespace is gone),
//! never in a namespace that is alive. Listed by `ratelimit status`, removed
//! by `ratelimit gc` and at every daemon's start. Nothing is listed or
//! removed when the live namespaces cannot all be known (not root enough to
//! enter them).

use std::{
    fs,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::sys;
use crate::host::{identity, rundir};

/// A pin directory of a network namespace that is gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    /// The directory, as the operator finds it (`/sys/fs/bpf/ratelimit/v8/ns4096`).
    pub dir: PathBuf,
    /// The pin layout it was made under (`v8`).
    pub layout: String,
    /// Kernel memory its pinned maps hold, bytes (their `memlock`).
    pub bytes: u64,
}

/// The pin directories of namespaces that are gone, under every layout.
pub fn orphans() -> Vec<Orphan> {
    let Ok(Some(root)) = identity::find_bpffs() else {
        return Vec::new();
    };
    let base = root.path.join("ratelimit");
    let Ok(layouts) = fs::read_dir(&base) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for layout in layouts.flatten() {
        let name = layout.file_name().to_string_lossy().into_owned();
        if !name.starts_with('v') {
            continue;
        }
        let Some((dirs, live)) = rundir::gone_namespaces(&layout.path()) else {
            continue;
        };
        for (cookie, dir) in dirs {
            if live.contains(&cookie) {
                continue;
            }
            found.push((
                dir.clone(),
                Orphan {
                    dir: root
                        .shown
                        .join("ratelimit")
                        .join(&name)
                        .join(format!("ns{cookie}")),
                    layout: name.clone(),
                    bytes: memlock_under(&dir),
                },
            ));
        }
    }
    found.sort_by(|a, b| a.1.dir.cmp(&b.1.dir));
    found.into_iter().map(|(_, o)| o).collect()
}

/// Removes the pin directories of namespaces that are gone; what it removed.
/// A directory that cannot be removed whole is left (and listed again).
pub fn remove_orphans() -> Vec<Orphan> {
    let Ok(Some(root)) = identity::find_bpffs() else {
        return Vec::new();
    };
    orphans()
        .into_iter()
        .filter(|o| {
            // `o.dir` is what the operator sees; the path this process
            // reaches it by is under `root.path`.
            let Ok(rel) = o.dir.strip_prefix(&root.shown) else {
                return false;
            };
            let dir = root.path.join(rel);
            let removed = fs::remove_dir_all(&dir).is_ok();
            if removed && let Some(layout) = dir.parent() {
                // The layout's directory, and ratelimit/, go while empty.
                let _ = fs::remove_dir(layout);
                if let Some(base) = layout.parent() {
                    let _ = fs::remove_dir(base);
                }
            }
            removed
        })
        .collect()
}

/// The `memlock` of every map pinned below `dir`, bytes.
fn memlock_under(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => memlock_under(&path),
                Ok(_) => memlock(&path),
                Err(_) => 0,
            }
        })
        .sum()
}

/// The `memlock` the kernel reports for the object pinned at `path` (0 for
/// a link, or what cannot be opened).
fn memlock(path: &Path) -> u64 {
    let Ok(fd) = sys::obj_get(path) else {
        return 0;
    };
    let info =
        fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap_or_default();
    memlock_of(&info)
}

/// The `memlock:` line of an fdinfo text, bytes.
fn memlock_of(fdinfo: &str) -> u64 {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memlock_of_a_map_is_read_from_its_fdinfo() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2048\nmap_type:\t9\nkey_size:\t20\nvalue_size:\t16\nmax_entries:\t1048576\nmap_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t92274688\nmap_id:\t53\n";
        assert_eq!(memlock_of(info), 92_274_688);
        assert_eq!(
            memlock_of("pos:\t0\nlink_type:\txdp\n"),
            0,
            "a link holds no map memory"
        );
    }
}
