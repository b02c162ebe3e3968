//! Who owns what the daemon trusts: a run directory, a namespace directory or
//! a file in it that root does not own or that is a link, a user's socket in
//! the daemon's place, a user who is not root.

use std::{
    io::{Read as _, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::Command,
    thread::sleep,
    time::Duration,
};

use ratelimit_tests::{
    Daemon, SharedBin, TempDir,
    fixture::Host,
    net::{NetNs, Pair},
    privileged, ratelimit_bin,
};

use super::{listed, ns_dir, refused};

const NOBODY: u32 = 65534;

/// `ratelimit run --iface IFACE ARGS` in `ns` with `run_dir`, not yet started.
fn run_cmd(ns: &NetNs, iface: &str, run_dir: &Path, args: &[&str]) -> Command {
    let mut cmd = ns.command(ratelimit_bin());
    cmd.args(["run", "--iface", iface])
        .args(args)
        .env("RATELIMIT_RUN_DIR", run_dir);
    cmd
}

fn chown(path: &Path, uid: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a C string; lchown never follows a link.
    let rc = unsafe { libc::lchown(c.as_ptr(), uid, uid) };
    assert_eq!(
        rc,
        0,
        "chown {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// (Item 1) A run directory (or a file in it) that root does not own, or that is a
/// link, is refused with the reason, and nothing is written through it; the
/// CLI never trusts a socket that is not root's.
#[test]
fn a_run_directory_root_does_not_own_is_refused_and_nothing_is_written_through_it() {
    privileged!("a_run_directory_root_does_not_own_is_refused_and_nothing_is_written_through_it");
    let pair = Pair::new();
    let base = TempDir::new("hostile");
    let start_in = |run: &Path, what: &str| {
        refused(
            run_cmd(&pair.rx, &pair.rx_if, run, &["--rate", "100/s"]),
            what,
        )
    };

    // A user's directory, open to all.
    let theirs = base.0.join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    chown(&theirs, NOBODY);
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = start_in(&theirs, "a run directory owned by nobody");
    assert!(out.contains("owned by uid 65534, not root"), "{out}");
    assert_eq!(
        std::fs::read_dir(&theirs).expect("dir").count(),
        0,
        "something was written in a directory root does not own"
    );
    assert!(!pair.rx_has_xdp(), "attached despite the refusal");

    // A link to it.
    let link = base.0.join("link");
    std::os::unix::fs::symlink(&theirs, &link).expect("symlink");
    let out = start_in(&link, "a run directory that is a link");
    assert!(out.contains("is a symbolic link"), "{out}");

    // Root's run directory, with a namespace directory a user owns.
    let run = base.0.join("run");
    let d = Daemon::start(&pair.rx, &pair.rx_if, &run, &["--rate", "100/s"]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let nsd = ns_dir(&run);
    chown(&nsd, NOBODY);
    let out = start_in(&run, "a namespace directory owned by nobody");
    assert!(out.contains("owned by uid 65534, not root"), "{out}");
    chown(&nsd, 0);

    // Each of the daemon's files as a link to one of root's files elsewhere.
    let victims = TempDir::new("victims");
    for suffix in ["lock", "rules.json", "mode", "sock"] {
        let victim = victims.0.join(format!("victim.{suffix}"));
        std::fs::write(&victim, b"root's own file\n").expect("victim");
        let planted = nsd.join(format!("{}.{suffix}", pair.rx_if));
        let _ = std::fs::remove_file(&planted);
        std::os::unix::fs::symlink(&victim, &planted).expect("symlink");
        let out = start_in(&run, &format!("{suffix} as a link"));
        assert!(out.contains("is a symbolic link"), "{suffix}: {out}");
        assert_eq!(
            std::fs::read(&victim).expect("victim"),
            b"root's own file\n",
            "{suffix}: written through a link"
        );
        std::fs::remove_file(&planted).expect("rm");
        // And as a file a user owns.
        std::fs::write(&planted, b"").expect("file");
        chown(&planted, NOBODY);
        let out = start_in(&run, &format!("{suffix} owned by nobody"));
        assert!(
            out.contains("owned by uid 65534, not root"),
            "{suffix}: {out}"
        );
        std::fs::remove_file(&planted).expect("rm");
    }
    assert!(!pair.rx_has_xdp());

    // A listener a user owns in the daemon's place: the CLI does not talk to it.
    let sock = nsd.join(format!("{}.sock", pair.rx_if));
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    chown(&sock, NOBODY);
    listener.set_nonblocking(true).expect("nonblocking");
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (a, s) = (answered.clone(), stop.clone());
    let impostor = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((mut c, _)) = listener.accept() {
                let _ = c.set_nonblocking(false);
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"{\"ok\":true,\"data\":{\"default\":\"deny\",\"rules\":[{\"cidr\":\"198.18.66.0/24\",\"rule\":\"deny\"}]}}\n",
                );
                a.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            sleep(Duration::from_millis(10));
        }
    });
    let out = pair
        .rx
        .command(ratelimit_bin())
        .args(["deny", "198.18.66.0/24", "--iface", &pair.rx_if])
        .env("RATELIMIT_RUN_DIR", &run)
        .output()
        .expect("cli");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    impostor.join().expect("impostor");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the CLI trusted a user's socket");
    assert!(err.contains("is not root's socket"), "{err}");
    assert!(
        !answered.load(std::sync::atomic::Ordering::Relaxed),
        "the CLI sent its request to a user's socket"
    );
}

/// (Item 12) A user who is not root is told so, not that no daemon runs.
#[test]
fn a_user_who_is_not_root_is_told_it_is_roots() {
    privileged!("a_user_who_is_not_root_is_told_it_is_roots");
    let (h, d) = Host::start("nonroot", &[]);
    // Where `nobody` may run it: the checkout may be closed to others.
    let shared = SharedBin::new();
    for args in [
        vec!["status"],
        vec!["status", "--iface", h.pair.rx_if.as_str()],
        vec!["deny", "198.18.0.97/32", "--iface", h.pair.rx_if.as_str()],
    ] {
        let out = h
            .command_as_nobody(&shared, &args)
            .output()
            .expect("setpriv");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} as nobody succeeded");
        assert!(
            err.contains("permission denied") && err.contains("root"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("no ratelimit daemon"), "{args:?}: {err}");
    }
    assert!(!listed(&d).iter().any(|l| l.contains("198.18.0.97")));
}
