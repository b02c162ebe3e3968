//! Idle clients: 1 100 metrics connections under `prlimit --nofile=1024`, 500
//! control connections and a request line without end.

use std::{
    io::{Read as _, Write as _},
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{fixture::Host, privileged, ratelimit_bin};

use super::{listed, ns_dir};

/// An answer slower than this is a stall: a CLI call is a process start,
/// slower on a loaded machine, and a daemon that waited on its idle
/// connections would wait one request timeout (2 s; 5 s for a scrape's
/// header) for each of the hundreds ahead.
const STALL: Duration = Duration::from_secs(3);

/// (Item 9) Out of file descriptors: idle connections to the metrics port cost a
/// bounded number of descriptors, little CPU and little log, and scrapes are
/// still answered.
#[test]
fn idle_metrics_connections_under_a_low_fd_limit_cost_little() {
    privileged!("idle_metrics_connections_under_a_low_fd_limit_cost_little");
    let h = Host::bare("fds");
    let mut cmd = h.pair.rx.command("prlimit");
    cmd.args(["--nofile=1024:1024", "--"])
        .arg(ratelimit_bin())
        .args([
            "run",
            "--iface",
            &h.pair.rx_if,
            "--metrics",
            "127.0.0.1:9477",
        ]);
    let d = h.spawn(cmd);
    let pid = d.child.pid();
    let cpu = || -> f64 {
        // utime + stime of every thread, in clock ticks.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 =
            f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
        ticks as f64 / 100.0
    };
    let log_before = d.output().len();

    let ns = h.pair.rx.name.clone();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        ratelimit_tests::net::enter(&ns);
        let mut held = Vec::new();
        for _ in 0..1100 {
            match std::net::TcpStream::connect_timeout(
                &"127.0.0.1:9477".parse().expect("addr"),
                Duration::from_secs(3),
            ) {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        let _ = opened_tx.send(held.len());
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        drop(held);
    });
    let opened = opened_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("connections");
    let cpu0 = cpu();
    let t0 = Instant::now();
    // The control socket answers while they are held, and so does /metrics.
    let asked = Instant::now();
    d.cli_ok(&["stats"]);
    assert!(
        asked.elapsed() < STALL,
        "stats took {:?} with {opened} idle metrics connections",
        asked.elapsed()
    );
    sleep(Duration::from_secs(2));
    let out = h.pair
        .rx
        .command("python3")
        .args([
            "-c",
            "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9477/metrics', timeout=5).read().decode(),end='')",
        ])
        .output()
        .expect("scraping");
    let spent = cpu() - cpu0;
    let secs = t0.elapsed().as_secs_f64();
    let _ = release_tx.send(());
    holder.join().expect("holder");
    let logged = d.output().len() - log_before;
    assert!(opened >= 1000, "only {opened} connections were made");
    assert!(
        spent < 0.3 * secs,
        "{spent:.2} CPU-s in {secs:.1} s with {opened} idle connections"
    );
    assert!(
        logged < 16 << 10,
        "{logged} bytes of log with {opened} idle connections: {}",
        d.output()
    );
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && body.contains("ratelimit_packets_total"),
        "the scrape among idle connections failed: {} {body}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    assert!(fds < 400, "{fds} file descriptors open");
}

/// (Item 10) Idle control clients hold up nobody; an endless line is cut off.
#[test]
fn idle_control_connections_do_not_stall_the_daemon() {
    privileged!("idle_control_connections_do_not_stall_the_daemon");
    let (h, d) = Host::start("idle", &[]);
    let sock = ns_dir(h.run_dir()).join(format!("{}.sock", h.pair.rx_if));
    let idle: Vec<_> = (0..500)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).expect("connect"))
        .collect();
    for _ in 0..3 {
        let asked = Instant::now();
        d.cli_ok(&["stats"]);
        assert!(
            asked.elapsed() < STALL,
            "stats took {:?} with 500 idle connections",
            asked.elapsed()
        );
    }
    // A change goes through too, and is serialised with the others.
    d.cli_ok(&["deny", "198.18.0.95/32"]);
    drop(idle);

    // A line without end: refused once past the cap, memory bounded.
    let rss = |pid: i32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .expect("VmRSS")
    };
    let pid = d.child.pid();
    let before = rss(pid);
    let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let chunk = vec![b'x'; 1 << 20];
    let mut sent = 0usize;
    for _ in 0..64 {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break,
        }
    }
    let mut answer = String::new();
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let _ = s.read_to_string(&mut answer);
    assert!(
        sent < 64 << 20 || answer.contains("longer than"),
        "64 MiB without a newline were taken whole; answer: {answer:?}"
    );
    let grown = rss(pid).saturating_sub(before);
    assert!(grown < 16 << 10, "RSS grew by {grown} kB on one long line");
    assert!(listed(&d).contains("198.18.0.95/32 deny"));
}
