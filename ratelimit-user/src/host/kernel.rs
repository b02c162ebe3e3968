//! What the running kernel has: its release checked against the core's
//! minimum before anything is loaded or attached, and the optional features
//! it lacks, each named with the kernel that brings it.
//!
//! The core (the XDP program and the daemon around it) needs BPF atomics:
//! every bucket is taken with a compare-and-swap, Linux 5.12. A kernel below
//! that is refused at start with its release, the feature and the minimum.
//! The optional features are probed one by one and switched off where
//! missing; today one is, the network namespace's cookie (5.14), which the
//! daemon replaces with the namespace's inode. The program's own optional
//! helpers and maps (the drop log's ring buffer, 5.8; the coarse clock,
//! 5.11; the socket lookup of the host-connection check, 5.2) are all older
//! than the core's minimum, so a kernel that passes the check has them.
//!
//! Enters: `uname`, a socket option. Leaves: [`check`]'s verdict and
//! [`missing`], read by the daemon's start (its log) and `status` (its
//! notes). Called by `daemon::run` and [`super::identity`].

use std::sync::Mutex;

use crate::error::{Error, Result};

/// The oldest kernel the core runs on.
pub const MINIMUM: (u32, u32) = (5, 12);

/// What the core needs of [`MINIMUM`].
pub const MINIMUM_WHY: &str = "BPF atomics (the compare-and-swap every bucket is taken with)";

/// A test-only switch: `RATELIMIT_TEST_WITHOUT=netns-cookie` makes the
/// daemon act as on a kernel without the feature (the tests' way to run
/// the fallback on a kernel that has it).
pub const TEST_WITHOUT: &str = "RATELIMIT_TEST_WITHOUT";

/// An optional feature this kernel lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// The feature.
    pub feature: &'static str,
    /// The kernel that brings it.
    pub since: &'static str,
    /// What the daemon does without it.
    pub instead: &'static str,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this kernel lacks {} (Linux {}): {}",
            self.feature, self.since, self.instead
        )
    }
}

/// The network namespace's cookie, missing.
pub const NO_NETNS_COOKIE: Missing = Missing {
    feature: "the network namespace's cookie (SO_NETNS_COOKIE)",
    since: "5.14",
    instead: "namespaces are told apart by their inode, which a namespace created after one is deleted may reuse (a daemon there on an interface of the same name adopts the pins the deleted one left)",
};

static MISSING: Mutex<Vec<Missing>> = Mutex::new(Vec::new());

/// Notes that this kernel lacks `m` (once).
pub(crate) fn lacks(m: Missing) {
    let mut all = MISSING.lock().unwrap_or_else(|p| p.into_inner());
    if !all.contains(&m) {
        all.push(m);
    }
}

/// The optional features found missing so far.
pub fn missing() -> Vec<Missing> {
    MISSING.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Whether a test switched `feature` off ([`TEST_WITHOUT`]).
pub(crate) fn switched_off(feature: &str) -> bool {
    std::env::var(TEST_WITHOUT).is_ok_and(|v| v.split(',').any(|f| f.trim() == feature))
}

/// The release of the running kernel, as `uname -r` prints it.
pub fn release() -> String {
    // SAFETY: a zeroed utsname is valid for uname to fill.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer; uname NUL-terminates the field.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::from("unknown");
    }
    // SAFETY: as above.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The major and minor version at the start of a release
/// (`6.1.0-44-amd64` → (6, 1)).
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Refuses a kernel below [`MINIMUM`], naming its release, the feature and
/// the minimum. A release that cannot be read is let through (the loader
/// then says what the kernel refuses).
pub fn check(release: &str) -> Result<()> {
    match version(release) {
        Some(v) if v < MINIMUM => Err(Error::Refused(format!(
            "Linux {release} is older than {}.{}: ratelimit needs {MINIMUM_WHY}, which came in Linux {}.{}; nothing was loaded or attached",
            MINIMUM.0, MINIMUM.1, MINIMUM.0, MINIMUM.1
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_below_the_minimum_are_refused_by_name() {
        assert_eq!(version("6.1.0-44-amd64"), Some((6, 1)));
        assert_eq!(version("7.2.13+deb14-amd64"), Some((7, 2)));
        assert_eq!(version("5.10.0-46-amd64"), Some((5, 10)));
        let e = check("5.10.0-46-amd64").unwrap_err().to_string();
        assert!(
            e.contains("Linux 5.10.0-46-amd64 is older than 5.12"),
            "{e}"
        );
        assert!(e.contains("BPF atomics"), "{e}");
        assert!(check("5.12.0").is_ok());
        assert!(check("6.1.0-44-amd64").is_ok());
        assert!(check("weird").is_ok());
    }
}
