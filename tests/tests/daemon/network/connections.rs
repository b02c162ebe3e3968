//! TCP connections through the limiter: the host's own download under the
//! default limit (and with `--host-connections limit`), and a source's upload
//! beside its own SYN flood under a SYN rule.

use std::time::Duration;

use ratelimit_tests::{
    check::{ip, within},
    fixture::Host,
    net::{Flow, Pair},
    privileged,
};

use super::{expected, stat};

/// Downloads from a server on the other side of the veth to the limiter's
/// host: up to `bytes` or `limit` of time; (bytes received, seconds).
fn download(pair: &Pair, bytes: usize, limit: Duration) -> (usize, f64) {
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
        time::Instant,
    };
    let listener = std::thread::scope(|s| {
        s.spawn(|| {
            pair.tx.enter();
            TcpListener::bind(("198.18.0.1", 0)).expect("listen in tx")
        })
        .join()
        .expect("listener")
    });
    let port = listener.local_addr().expect("addr").port();
    std::thread::scope(|s| {
        s.spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let _ = c.set_write_timeout(Some(limit));
            let chunk = vec![7u8; 64 * 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                if c.write_all(&chunk[..n]).is_err() {
                    break;
                }
                left -= n;
            }
        });
        s.spawn(move || {
            pair.rx.enter();
            let mut c = TcpStream::connect(("198.18.0.1", port)).expect("connect from rx");
            c.set_read_timeout(Some(Duration::from_millis(200)))
                .expect("timeout");
            let start = Instant::now();
            let mut buf = vec![0u8; 256 * 1024];
            let mut got = 0;
            while got < bytes && start.elapsed() < limit {
                match c.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(_) => {}
                }
            }
            (got, start.elapsed().as_secs_f64())
        })
        .join()
        .expect("client")
    })
}

/// The default (docs/concepts/how-it-decides.md) (1000 frames/s per source) must not throttle the
/// host's own download from a server: its replies belong to a connection the
/// host opened, so none is dropped (they pass as `host_connection` once the
/// server's bucket is empty). With `--host-connections limit` the same
/// download is limited. Counters and bytes are asserted, not speeds (printed).
#[test]
fn the_hosts_own_downloads_pass_the_default_limit() {
    privileged!("the_hosts_own_downloads_pass_the_default_limit");
    let (h, d) = Host::start("hostconn", &[]);
    let bytes = 64 << 20;
    let (got, secs) = download(&h.pair, bytes, Duration::from_secs(20));
    eprintln!(
        "download, host connections pass: {got} bytes in {secs:.2} s ({:.1} MB/s)",
        got as f64 / secs / 1e6
    );
    assert_eq!(got, bytes, "the download did not finish in 20 s");
    // 64 MiB is over 40 000 full-size frames: far past the server's burst.
    let passed = stat(&d, "host_connection");
    assert!(
        passed > 10_000,
        "only {passed} frames counted as host_connection: the download was judged by the limit"
    );
    // Frames the server sends after the host closed its end (its last FIN
    // and ACKs) find no established socket: a handful may be limited.
    let dropped = stat(&d, "limited");
    assert!(
        dropped < 10,
        "{dropped} frames of the host's own download were dropped"
    );

    d.cli_ok(&[
        "set",
        "default",
        "--rate",
        "1000/s",
        "--host-connections",
        "limit",
    ]);
    let (got, secs) = download(&h.pair, bytes, Duration::from_secs(3));
    eprintln!(
        "download, host connections limited: {got} bytes in {secs:.2} s ({:.1} MB/s)",
        got as f64 / secs / 1e6
    );
    assert!(
        got < bytes,
        "with --host-connections limit the download finished unhindered"
    );
    assert!(
        stat(&d, "limited") > 0,
        "nothing of the download was limited"
    );
    assert_eq!(
        stat(&d, "host_connection"),
        passed,
        "frames passed as host_connection under --host-connections limit"
    );
}

/// A SYN flood and a normal TCP upload from the same source: under a SYN
/// rule the flood's SYNs are limited to the rule, the upload's frames (ACKs,
/// no SYN) are never judged by it and all arrive.
#[test]
fn a_syn_rule_limits_the_flood_not_the_sources_established_traffic() {
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
        time::Instant,
    };
    privileged!("a_syn_rule_limits_the_flood_not_the_sources_established_traffic");
    // The recipe of docs/guide/recipes.md as written, under the default limit (1000/s per
    // source): SYNs at 20/s, the rest of TCP at up to 100k frames/s.
    let (h, d) = Host::start("syn", &[]);
    d.cli_ok(&[
        "set",
        "0.0.0.0/0",
        "--proto",
        "tcp",
        "--syn",
        "--rate",
        "20/s",
    ]);
    d.cli_ok(&["set", "0.0.0.0/0", "--proto", "tcp", "--rate", "100k/s"]);
    let listed = d.cli_ok(&["list"]);
    assert!(
        listed.contains("0.0.0.0/0 tcp syn") && listed.contains("0.0.0.0/0 tcp "),
        "list does not show the recipe's rules:\n{listed}"
    );
    let listener = std::thread::scope(|s| {
        s.spawn(|| {
            h.pair.rx.enter();
            TcpListener::bind(("198.18.0.2", 0)).expect("listen in rx")
        })
        .join()
        .expect("listener")
    });
    let port = listener.local_addr().expect("addr").port();
    let upload = Duration::from_millis(1500);
    let pair = &h.pair;
    let (received, sent, syns) = std::thread::scope(|s| {
        let server = s.spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            c.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut buf = vec![0u8; 256 * 1024];
            let mut got = 0usize;
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got += n;
            }
            got
        });
        let client = s.spawn(move || {
            pair.tx.enter();
            let mut c = TcpStream::connect(("198.18.0.2", port)).expect("connect from tx");
            c.set_write_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            let chunk = vec![7u8; 64 * 1024];
            let start = Instant::now();
            let mut sent = 0usize;
            while start.elapsed() < upload {
                match c.write(&chunk) {
                    Ok(n) => sent += n,
                    Err(e) => panic!("the upload failed after {sent} bytes: {e}"),
                }
            }
            sent
        });
        // The flood starts once the connection is up (its own SYN met a full
        // bucket): SYNs from the same source to a closed port.
        std::thread::sleep(Duration::from_millis(200));
        let mut syn = pair.udp(ip("198.18.0.1"), 9);
        syn.tcp = Some(ratelimit_tests::frames::tcp::SYN);
        let flood = [Flow {
            frame: syn.build(),
            pps: 4000,
        }];
        let syns = pair.send(&flood, Duration::from_secs(1));
        let sent = client.join().expect("client");
        (server.join().expect("server"), sent, syns[0].clone())
    });
    eprintln!(
        "upload {received} of {sent} bytes; {} SYNs sent; limited {}\n{}",
        syns.frames,
        stat(&d, "limited"),
        d.cli_ok(&["list", "--stats"])
    );
    assert_eq!(received, sent, "the upload lost bytes");
    assert!(sent > 1 << 20, "the upload sent only {sent} bytes");
    // The flood's SYNs beyond the rule's bucket are dropped; the upload's
    // frames are not (nothing else is limited).
    let admitted = expected(&syns, 20.0, 20.0);
    within(
        "SYNs limited",
        stat(&d, "limited"),
        syns.frames as f64 - admitted,
        0.02,
    );
}
