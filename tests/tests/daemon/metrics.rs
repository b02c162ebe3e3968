//! The daemon's metrics endpoint against slow scrapers (issue 23, item 8): a
//! daemon with thousands of rules on a veth, its exposition megabytes long.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    os::fd::FromRawFd,
    time::{Duration, Instant},
};

use ratelimit_tests::{fixture::Host, privileged};

const ADDR: &str = "127.0.0.1:9477";

/// Rules in the config: each has 14 rule counters in the exposition.
const RULES: u32 = 4000;

/// A connection to 127.0.0.1:9477 of the calling thread's namespace with a
/// receive buffer of 1 KiB (the kernel's floor is about twice that).
fn small_window() -> TcpStream {
    // SAFETY: plain socket calls on a descriptor this function owns; it is
    // handed to TcpStream, which closes it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let size: libc::c_int = 1024;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 9477u16.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
            },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(
            fd,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        stream
    }
}

/// A field of /proc/PID/status, in kB.
fn status_kb(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// (Item 8) With 4 000 rules (5 MB of exposition), 64 connections that asked
/// for /metrics with a 1 KiB receive buffer and never read held every slot:
/// every scrape failed for 20 s and the daemon grew from 32 MB to 375 MB.
/// Now a scrape from another client is served while they hold on, the daemon
/// stays within a bound that does not grow with the number of scrapers, and
/// the slow ones are cut off after the write timeout.
#[test]
fn slow_scrapers_neither_blind_the_metrics_nor_grow_the_daemon() {
    privileged!("slow_scrapers_neither_blind_the_metrics_nor_grow_the_daemon");
    let mut text = String::from("[default]\nrate = \"1000/s\"\n");
    for i in 0..RULES {
        text.push_str(&format!(
            "[[rule]]\ncidr = \"198.18.{}.{}/32\"\naction = \"deny\"\n",
            10 + i / 250,
            1 + i % 250
        ));
    }
    let (h, d) = Host::with_config("scrapers", &text, &["--metrics", ADDR]);
    let pid = d.child.pid();
    let exposition = h.pair.rx.scrape(ADDR);
    assert!(
        exposition.len() > 4 << 20,
        "{RULES} rules give {} bytes of exposition",
        exposition.len()
    );
    let before = status_kb(pid, "VmHWM:");

    // 64 scrapers, as many as the endpoint's connections, that never read.
    let ns = h.pair.rx.name.clone();
    let slow: Vec<TcpStream> = std::thread::spawn(move || {
        ratelimit_tests::net::enter(&ns);
        (0..64)
            .map(|_| {
                let mut s = small_window();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    .expect("request");
                s
            })
            .collect()
    })
    .join()
    .expect("scrapers");

    // Every scraper's answer has begun (they share renderings) before
    // another client asks.
    for (i, s) in slow.iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut first = [0u8; 1];
        assert!(
            matches!(s.peek(&mut first), Ok(1)),
            "slow scraper {i} got no answer within 10 s"
        );
    }
    // Each answer's write timeout runs from when that answer began: by now.
    let answering = Instant::now();
    let peak = status_kb(pid, "VmHWM:");
    let asked = Instant::now();
    let out = h.pair
        .rx
        .command("python3")
        .args([
            "-c",
            &format!("import urllib.request;print(len(urllib.request.urlopen('http://{ADDR}/metrics', timeout=5).read()))"),
        ])
        .output()
        .expect("scraping");
    let took = asked.elapsed();
    let got: usize = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(
        out.status.success() && got > 4 << 20,
        "a scrape while 64 slow scrapers hold on failed after {took:?}: {} bytes (the daemon peaked at {} MB); {}",
        got,
        peak / 1024,
        String::from_utf8_lossy(&out.stderr)
    );

    // 64 answers of 5 MB each would be 320 MB more: they share at most four
    // renderings (about 25 MB with the one being made), so the daemon stays
    // within 150 MB whatever it held before (about 60 MB here).
    assert!(
        peak < 150 * 1024,
        "the daemon peaked at {} MB (before the scrapers: {} MB)",
        peak / 1024,
        before / 1024
    );

    // The write timeout (10 s) cuts the slow ones off with a reset: a reader
    // gets what was already on its way, not the rest of the 5 MB.
    let cut = answering + Duration::from_secs(10 + 3);
    if let Some(wait) = cut.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
    for (i, mut s) in slow.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        let mut read = 0usize;
        let mut buf = [0u8; 16 << 10];
        let ended = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => read += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break false;
                }
                Err(_) => break true,
            }
            if read > 1 << 20 {
                break false;
            }
        };
        assert!(
            ended && read < 1 << 20,
            "slow scraper {i}: {read} bytes and {} 13 s after asking",
            if ended { "closed" } else { "still open" }
        );
    }
    println!(
        "exposition {} bytes; daemon VmHWM {} kB before the scrapers, {} kB after; the other scrape took {took:?}",
        exposition.len(),
        before,
        peak
    );
}
