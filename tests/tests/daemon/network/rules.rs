//! Allow and deny under traffic: allowlist-only mode on and off, and a
//! 100 000-line blocklist loaded, refused when one line is bad, shadowed by an
//! allow list and unloaded.

use std::{net::IpAddr, time::Duration};

use ratelimit_tests::{Daemon, check::ip, fixture::Host, privileged};

use super::{PORT, stat};

/// `mode allowlist-only` under traffic drops every source but the allowed
/// ones (counted `not_allowed`), and `mode normal` brings the rules back.
#[test]
fn allowlist_only_mode_on_and_off_under_traffic() {
    privileged!("allowlist_only_mode_on_and_off_under_traffic");
    let (h, d) = Host::start("allowonly", &[]);
    d.cli_ok(&["allow", "198.18.0.1"]);
    let (friend, other) = (ip("198.18.0.1"), ip("198.18.0.7"));
    // (frames sent, frames arrived) per source, for 500 ms at 200/s each.
    let probe = || {
        let got = h
            .pair
            .probe_sent(&[friend, other], 200, Duration::from_millis(500));
        (got[0], got[1])
    };
    let (f, o) = probe();
    assert!(
        f.0 > 0 && f.0 == f.1,
        "normal mode, allowed: {f:?} (sent, arrived)"
    );
    assert!(o.0 > 0 && o.0 == o.1, "normal mode, other: {o:?}");

    let listed = d.cli_ok(&["mode", "allowlist-only"]);
    assert!(listed.contains("allowlist-only"), "{listed}");
    let before = stat(&d, "not_allowed");
    let (f, o) = probe();
    assert!(f.0 > 0 && f.0 == f.1, "allowlist-only, allowed: {f:?}");
    assert_eq!(o.1, 0, "allowlist-only, other: {o:?}");
    counter_moved(&d, "not_allowed", before, o.0);

    d.cli_ok(&["mode", "normal"]);
    let (f, o) = probe();
    assert!(f.0 > 0 && f.0 == f.1, "normal again, allowed: {f:?}");
    assert!(o.0 > 0 && o.0 == o.1, "normal again, other: {o:?}");
}

/// `reason` moved by at least `n` since `before` (the kernel's own IPv6
/// chatter may add a few).
fn counter_moved(d: &Daemon, reason: &str, before: u64, n: u64) {
    let now = stat(d, reason);
    assert!(
        (n..n + 10).contains(&(now - before)),
        "{reason} moved by {}, expected {n}",
        now - before
    );
}

/// A blocklist of `n` lines: /32s spread over 198.19.0.0/16 and
/// 198.18.64.0-198.18.255.255, `listed` among them, with a comment and a blank line.
fn blocklist(n: usize, listed: IpAddr) -> String {
    let mut text = String::from("# generated for the test\n\n");
    text.push_str(&format!("{listed}\n"));
    for i in 0..n - 1 {
        let (b, c, d) = if i < 65_536 {
            (19, i / 256, i % 256)
        } else {
            let j = i - 65_536;
            (18, 64 + j / 256, j % 256)
        };
        text.push_str(&format!("198.{b}.{c}.{d}\n"));
    }
    text
}

/// `deny --from` a 100 000-line blocklist: the listed source's frames are
/// dropped (counted `denied`) while another passes; a bad file (one bad line
/// among 100 000) is refused with its file and line and changes nothing; an
/// allow list wins over the blocklist for its entry; the list unloaded under
/// traffic lets the source through again.
#[test]
fn a_100k_line_blocklist_drops_its_sources_and_unloads_under_traffic() {
    privileged!("a_100k_line_blocklist_drops_its_sources_and_unloads_under_traffic");
    let (h, d) = Host::start("blocklist", &[]);
    let (listed, other) = (ip("198.18.0.10"), ip("198.18.0.7"));
    let file = h.path("bulk.netset");
    std::fs::write(&file, blocklist(100_000, listed)).expect("writing the list");
    let path = file.to_str().expect("utf-8");

    // (frames sent, frames arrived) per source, for 500 ms at 200/s each.
    let probe = || {
        let got = h
            .pair
            .probe_sent(&[listed, other], 200, Duration::from_millis(500));
        (got[0], got[1])
    };

    let started = std::time::Instant::now();
    let out = d.cli_ok(&["deny", "--from", path]);
    println!(
        "deny --from (100 000 lines) took {:?}: {}",
        started.elapsed(),
        out.lines().next().unwrap_or("")
    );
    let lists = d.json(&["list"])["lists"].clone();
    assert_eq!(
        lists[0]["name"], "bulk",
        "the name is the file's stem: {lists}"
    );
    assert_eq!(lists[0]["entries"], 100_000, "{lists}");
    assert_eq!(lists[0]["action"], "deny", "{lists}");
    assert_eq!(
        d.json(&["list"])["rules"].as_array().map(Vec::len),
        Some(0),
        "list entries are not rules"
    );

    let before = stat(&d, "denied");
    let (l, o) = probe();
    assert_eq!(l.1, 0, "listed source: {l:?} (sent, arrived)");
    assert!(o.0 > 0 && o.0 == o.1, "other source: {o:?} (sent, arrived)");
    counter_moved(&d, "denied", before, l.0);

    // One bad line among 100 000: refused with file and line, nothing changes.
    let bad = h.path("bad.txt");
    let mut text = blocklist(100_000, other);
    let at = text.match_indices('\n').nth(50_000).expect("lines").0;
    text.insert_str(at + 1, "198.18.0.300\n");
    std::fs::write(&bad, text).expect("writing the bad list");
    let bad_path = bad.to_str().expect("utf-8");
    for args in [
        vec!["deny", "--from", bad_path, "--name", "bulk"],
        vec!["deny", "--from", bad_path],
    ] {
        let out = d.cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a bad list was accepted: {args:?}");
        assert!(
            err.contains(&format!("{bad_path}:50002:")) && err.contains("198.18.0.300"),
            "the error names the file and line: {err}"
        );
    }
    let after = d.json(&["list"])["lists"].clone();
    assert_eq!(after, lists, "a refused list changed the lists");
    let (l, o) = probe();
    assert_eq!(l.1, 0, "after a refused list, listed source: {l:?}");
    assert!(o.0 == o.1, "after a refused list, other source: {o:?}");

    // An allow list entry wins over the same CIDR in a deny list.
    let friends = h.path("friends.txt");
    std::fs::write(&friends, format!("{listed}\n")).expect("writing the allow list");
    d.cli_ok(&["allow", "--from", friends.to_str().expect("utf-8")]);
    let shadowed = d.json(&["list"])["lists"]
        .as_array()
        .and_then(|a| a.iter().find(|l| l["name"] == "bulk").cloned())
        .expect("the blocklist");
    assert_eq!(shadowed["shadowed"], 1, "{shadowed}");
    let (l, _) = probe();
    assert!(
        l.0 > 0 && l.0 == l.1,
        "allow-listed inside a blocklist: {l:?}"
    );
    d.cli_ok(&["unset", "--list", "friends"]);

    // Unloaded under traffic: dropped before, passing after.
    let rx = h.pair.receiver(PORT);
    let flows = [h.pair.flow(listed, PORT, 400)];
    let start = std::time::Instant::now();
    let sender = h.pair.send_async(&flows, Duration::from_millis(4000));
    std::thread::sleep(Duration::from_millis(1000));
    let unset_at = std::time::Instant::now();
    d.cli_ok(&["unset", "--list", "bulk"]);
    let done_at = std::time::Instant::now();
    println!(
        "unset --list (100 000 entries) took {:?}",
        done_at - unset_at
    );
    let sent = sender.join().expect("sender");
    let got = rx.finish_timed();
    assert_eq!(
        got.between(&listed, start, unset_at),
        0,
        "frames of a listed source arrived before the list was unloaded"
    );
    let after_unset = got.between(&listed, done_at, start + Duration::from_secs(10));
    let secs = sent[0]
        .last
        .saturating_duration_since(done_at)
        .as_secs_f64();
    assert!(
        secs >= 1.0,
        "the unset took {:?}: too little traffic after it to judge",
        done_at - unset_at
    );
    assert!(
        after_unset as f64 >= 0.9 * 400.0 * secs,
        "only {after_unset} frames arrived in the {secs:.2} s after the list was unloaded (400/s sent)"
    );
    assert!(
        d.json(&["list"])["lists"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "lists left after unset"
    );
}

/// A port set through the veth: `deny --proto udp --dport 5001,5003,5010-5012`
/// drops every frame to its ports and passes every frame to the ports
/// between them; `list` writes the set back as given (sorted).
#[test]
fn a_port_set_drops_its_ports_and_passes_the_ports_between() {
    privileged!("a_port_set_drops_its_ports_and_passes_the_ports_between");
    let (h, d) = Host::start("portset", &[]);
    let out = d.cli_ok(&[
        "deny",
        "198.18.0.0/15",
        "--proto",
        "udp",
        "--dport",
        "5010-5012,5003,5001",
    ]);
    assert!(out.contains("dport 5001,5003,5010-5012"), "{out}");
    let listed = d.cli_ok(&["list"]);
    assert!(
        listed.contains("198.18.0.0/15 udp dport 5001,5003,5010-5012"),
        "{listed}"
    );
    let src = ip("198.18.0.9");
    let ports = [5001u16, 5002, 5003, 5004, 5009, 5010, 5011, 5012, 5013];
    let receivers: Vec<_> = ports.iter().map(|p| h.pair.receiver(*p)).collect();
    let flows: Vec<_> = ports.iter().map(|p| h.pair.flow(src, *p, 100)).collect();
    let sent = h.pair.send(&flows, Duration::from_millis(500));
    for ((port, rx), s) in ports.iter().zip(receivers).zip(sent) {
        let got = rx.finish().get(&src).copied().unwrap_or(0);
        assert!(s.frames >= 20, "port {port}: only {} sent", s.frames);
        let denied = [5001, 5003, 5010, 5011, 5012].contains(port);
        if denied {
            assert_eq!(
                got, 0,
                "port {port} is in the set: {got} of {} arrived",
                s.frames
            );
        } else {
            assert_eq!(got, s.frames, "port {port} is between the set's ports");
        }
    }
}

/// Per-list counters: a deny list and an allow list each count the frames
/// they judged, exactly, in `list --stats` (text and JSON) and in
/// Prometheus; another source counts in neither.
#[test]
fn each_list_counts_the_frames_it_judged() {
    privileged!("each_list_counts_the_frames_it_judged");
    const ADDR: &str = "127.0.0.1:9481";
    let (h, d) = Host::start("liststats", &["--metrics", ADDR]);
    let (bad, friend, other) = (ip("198.18.0.5"), ip("198.18.0.6"), ip("198.18.0.7"));
    let deny = h.write("scanners.txt", "198.18.0.5\n198.18.9.0/24\n");
    let allow = h.write("partners.txt", "198.18.0.6\n");
    d.cli_ok(&["deny", "--from", &deny]);
    d.cli_ok(&["allow", "--from", &allow]);
    let got = h
        .pair
        .probe_sent(&[bad, friend, other], 200, Duration::from_millis(500));
    let (b, f, o) = (got[0], got[1], got[2]);
    assert!(b.0 > 0 && b.1 == 0, "listed source: {b:?} (sent, arrived)");
    assert!(f.0 > 0 && f.0 == f.1, "allowed source: {f:?}");
    assert!(o.0 > 0 && o.0 == o.1, "other source: {o:?}");
    let lists = d.json(&["list", "--stats"])["lists"].clone();
    let frames = |name: &str| {
        let l = lists
            .as_array()
            .and_then(|a| a.iter().find(|l| l["name"] == name))
            .unwrap_or_else(|| panic!("no list {name}: {lists}"));
        l["counters"]["packets"].as_u64().expect("packets")
    };
    assert_eq!(frames("scanners"), b.0, "the deny list's drops: {lists}");
    assert_eq!(frames("partners"), f.0, "the allow list's passes: {lists}");
    assert!(
        d.json(&["list"])["lists"][0].get("counters").is_none(),
        "counters only with --stats"
    );
    let text = d.cli_ok(&["list", "--stats"]);
    let row = text
        .lines()
        .find(|l| l.starts_with("scanners"))
        .unwrap_or_else(|| panic!("no scanners row: {text}"));
    assert!(
        row.split_whitespace().any(|w| w == b.0.to_string()),
        "{text}"
    );
    let exposition = h.pair.rx.scrape(ADDR);
    for (name, action, n) in [("scanners", "deny", b.0), ("partners", "allow", f.0)] {
        let line = format!(
            "ratelimit_list_packets_total{{iface=\"{}\",list=\"{name}\",action=\"{action}\"}} {n}",
            h.pair.rx_if
        );
        assert!(exposition.contains(&line), "{line} not in:\n{exposition}");
    }

    // A SIGKILL, frames while no daemon runs, a start that adopts the pins:
    // the lists keep their rules, so their counters go on and the drop log's
    // records of those frames name the list.
    d.stop(libc::SIGKILL);
    let more = h.pair.probe_sent(&[bad], 200, Duration::from_millis(300))[0];
    assert!(more.0 > 0 && more.1 == 0, "listed, no daemon: {more:?}");
    // With no daemon, `list --stats` answers from the pins, the lists'
    // counters included.
    let out = h
        .command(&["list", "--stats", "--json", "--iface", &h.pair.rx_if])
        .output()
        .expect("ratelimit list");
    let offline: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("list --stats --json with no daemon ({e}): {out:?}"));
    assert_eq!(offline["daemon"], false, "{offline}");
    let counted = offline["lists"]
        .as_array()
        .and_then(|a| a.iter().find(|l| l["name"] == "scanners"))
        .map(|l| l["counters"]["packets"].clone());
    assert_eq!(
        counted.and_then(|c| c.as_u64()),
        Some(b.0 + more.0),
        "the deny list's drops read from the pins with no daemon: {offline}"
    );
    let d = h.daemon(&["--metrics", ADDR]);
    let lists = d.json(&["list", "--stats"])["lists"].clone();
    let scanners = lists
        .as_array()
        .and_then(|a| a.iter().find(|l| l["name"] == "scanners"))
        .unwrap_or_else(|| panic!("no list scanners after the restart: {lists}"));
    assert_eq!(
        scanners["counters"]["packets"].as_u64(),
        Some(b.0 + more.0),
        "the deny list's drops across the restart: {lists}"
    );
    let log = d.cli_ok(&["log", "-n", "5"]);
    assert!(
        log.lines().any(|l| l.contains("list scanners")),
        "the drop log names the list after the restart:\n{log}"
    );
    assert!(!log.contains("(removed rule)"), "{log}");
}

/// A hand-made deny that covers the host's own address (or loopback) is
/// applied, as asked, and the command says what it covers; one that does
/// not says nothing more.
#[test]
fn a_deny_covering_the_host_is_applied_and_said() {
    privileged!("a_deny_covering_the_host_is_applied_and_said");
    let (h, d) = Host::start("denyhost", &[]);
    let out = d.cli(&["deny", "198.18.0.0/24"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "warning: this deny covers this host's {}",
            h.pair.rx_v4
        )),
        "{err}"
    );
    let listed = d.json(&["list"]);
    assert!(
        listed.to_string().contains("198.18.0.0/24"),
        "applied: {listed}"
    );
    let out = d.cli(&["deny", "198.18.5.0/24"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{out:?}"
    );
}
