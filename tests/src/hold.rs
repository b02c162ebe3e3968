//! A file whose opens hang until the test lets them go: a fanotify
//! permission mark (`FAN_OPEN_PERM`) on one regular file makes every open of
//! it by another process wait for this process's answer. It stands for a file
//! system that hangs (NFS, FUSE) with a plain file in a temporary directory.
//! Every open held is let go on [`HeldOpens::release`] and on drop (closing
//! the fanotify group also lets them go).

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// Holds the opens of one file (see the module).
pub struct HeldOpens {
    release: Arc<AtomicBool>,
    held: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl HeldOpens {
    /// Holds every open of `path` from now on (needs root).
    pub fn new(path: &Path) -> Self {
        // SAFETY: plain fanotify_init; the fd is owned below.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                (libc::O_RDONLY | libc::O_LARGEFILE) as u32,
            )
        };
        assert!(
            fd >= 0,
            "fanotify_init: {} (a kernel with CONFIG_FANOTIFY_ACCESS_PERMISSIONS, and root, are needed)",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh fd we own.
        let group = unsafe { OwnedFd::from_raw_fd(fd) };
        let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid group fd and a C string.
        let rc = unsafe {
            libc::fanotify_mark(
                group.as_raw_fd(),
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN_PERM,
                libc::AT_FDCWD,
                c.as_ptr(),
            )
        };
        assert_eq!(
            rc,
            0,
            "fanotify_mark {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        let release = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU32::new(0));
        let (r, h) = (release.clone(), held.clone());
        let thread = std::thread::spawn(move || answer(group, &r, &h));
        Self {
            release,
            held,
            thread: Some(thread),
        }
    }

    /// How many opens have been held so far.
    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Relaxed)
    }

    /// Waits up to `within` for an open to be held; whether one was.
    pub fn wait_held(&self, within: Duration) -> bool {
        let start = Instant::now();
        while self.held() == 0 {
            if start.elapsed() > within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Lets every open held go, and those to come.
    pub fn release(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.release.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HeldOpens {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads the group's events: each open is held (its event kept) until
/// `release`, then allowed. Ends once released and every held open is
/// answered; the group is closed then.
fn answer(group: OwnedFd, release: &AtomicBool, held: &AtomicU32) {
    let allow = |fd: i32| {
        let response = libc::fanotify_response {
            fd,
            response: libc::FAN_ALLOW,
        };
        // SAFETY: writing a response struct to the group fd.
        unsafe {
            libc::write(
                group.as_raw_fd(),
                (&response as *const libc::fanotify_response).cast(),
                std::mem::size_of::<libc::fanotify_response>(),
            );
            libc::close(fd);
        }
    };
    let mut pending: Vec<i32> = Vec::new();
    // Bounded: a test holds a file for seconds, never minutes.
    let start = Instant::now();
    loop {
        let released =
            release.load(Ordering::Relaxed) || start.elapsed() > Duration::from_secs(120);
        if released {
            for fd in pending.drain(..) {
                allow(fd);
            }
            return;
        }
        let mut buf = [0u64; 512];
        // SAFETY: reading into a buffer of that many bytes (aligned for the
        // event structs).
        let n = unsafe {
            libc::read(
                group.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(&buf),
            )
        };
        if n <= 0 {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let bytes =
            // SAFETY: the n bytes read.
            unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
        let mut off = 0usize;
        let size = std::mem::size_of::<libc::fanotify_event_metadata>();
        while off + size <= bytes.len() {
            // SAFETY: a whole event struct at `off`, read unaligned.
            let ev: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(bytes[off..].as_ptr().cast()) };
            if ev.event_len == 0 {
                break;
            }
            if ev.fd >= 0 {
                if ev.mask & libc::FAN_OPEN_PERM != 0 {
                    held.fetch_add(1, Ordering::Relaxed);
                    pending.push(ev.fd);
                } else {
                    // SAFETY: an event fd we own.
                    unsafe { libc::close(ev.fd) };
                }
            }
            off += ev.event_len as usize;
        }
    }
}
