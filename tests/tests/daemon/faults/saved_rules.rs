//! The rules a daemon keeps: a saved record damaged, or torn by SIGKILL during
//! changes on 20 000 rules; live changes on top of the file across reloads and
//! restarts.

use std::{process::Stdio, thread::sleep, time::Duration};

use ratelimit_tests::{ChildGuard, Daemon, check::ip, fixture::Host, privileged};

use super::{denies, in_kernel, listed, record, refused};

/// (Item 2) A damaged saved record (cut short, random bytes, empty, a value out of
/// range): the restart keeps exactly what the kernel enforces, says so loudly,
/// and writes the record again from the kernel.
#[test]
fn damaged_saved_rules_keep_what_the_kernel_enforces_and_say_so() {
    privileged!("damaged_saved_rules_keep_what_the_kernel_enforces_and_say_so");
    let (h, d) = Host::start("damaged", &["--rate", "5/s", "--burst", "5"]);
    d.cli_ok(&["deny", "198.18.0.77/32"]);
    let want = listed(&d);
    assert_eq!(in_kernel(&h.pair.rx_if), want, "kernel and list before");
    let rec = record(&h);
    let good = std::fs::read_to_string(&rec).expect("record");
    assert!(good.contains("\"burst\": 5"), "{good}");
    d.stop(libc::SIGKILL);

    let mut noise = Vec::with_capacity(512);
    let mut x: u32 = 0x9e37_79b9;
    for _ in 0..512 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push(x as u8);
    }
    let damages: [(&str, Vec<u8>); 4] = [
        ("cut short", good.as_bytes()[..good.len() / 2].to_vec()),
        ("random bytes", noise),
        ("empty", Vec::new()),
        (
            "a burst out of range",
            good.replacen("\"burst\": 5", "\"burst\": 0", 1)
                .into_bytes(),
        ),
    ];
    let (denied, limited) = (ip("198.18.0.77"), ip("198.18.0.78"));
    for (what, bytes) in damages {
        std::fs::write(&rec, &bytes).expect("damaging the record");
        let d = h.daemon(&[]);
        let out = d.output();
        assert!(
            out.contains("THE SAVED RULES CANNOT BE READ"),
            "{what}: no loud log line: {out}"
        );
        assert_eq!(listed(&d), want, "{what}: the rules changed");
        assert_eq!(in_kernel(&h.pair.rx_if), want, "{what}: the kernel changed");
        let got = h
            .pair
            .probe(&[(denied, 200), (limited, 200)], Duration::from_millis(500));
        assert_eq!(
            got.get(&denied).copied().unwrap_or(0),
            0,
            "{what}: denied source passed"
        );
        let n = got.get(&limited).copied().unwrap_or(0);
        assert!(
            n <= 5 + 3,
            "{what}: a 5/s burst 5 source passed {n} in 0.5 s"
        );
        let again = std::fs::read_to_string(&rec).expect("record");
        let v: serde_json::Value = serde_json::from_str(&again)
            .unwrap_or_else(|e| panic!("{what}: the record was not written again ({e}): {again}"));
        assert_eq!(v["version"], 3, "{what}: {again}");
        d.stop(libc::SIGKILL);
    }

    // Damaged, and no program to take the rules from: refused, not defaults.
    let d = h.daemon(&[]);
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    std::fs::write(&rec, b"{\"version\": 2, \"ba").expect("damage");
    let out = refused(
        h.daemon_command(&[]),
        "a damaged record with nothing running",
    );
    assert!(
        out.contains("cannot be read") && out.contains("--config"),
        "{out}"
    );
}

/// (Item 2, torn writes) SIGKILL while changes are being saved on a large rule set
/// never leaves a record cut short: it is the old one or the new one, and the
/// restart enforces what the kernel did.
#[test]
fn sigkill_during_changes_never_leaves_a_torn_record() {
    privileged!("sigkill_during_changes_never_leaves_a_torn_record");
    let cidrs: Vec<String> = (0..20_000u32)
        .map(|i| format!("198.19.{}.{}/32", i / 250, i % 250 + 1))
        .collect();
    let (h, mut d) =
        Host::with_config("torn", &denies("1000/s", &cidrs), &["--max-rules", "32768"]);
    for trial in 0..6u32 {
        // A stream of changes, killed part-way.
        let mut changes = Vec::new();
        for k in 0..4u32 {
            let mut c = h.command(&[
                "set",
                &format!("198.18.{}.{}/32", 100 + trial, k + 1),
                "--rate",
                "10/s",
                "--iface",
                &h.pair.rx_if,
            ]);
            c.stdout(Stdio::null()).stderr(Stdio::null());
            changes.push(ChildGuard::spawn(c, "ratelimit set"));
        }
        sleep(Duration::from_millis(u64::from(trial) * 15));
        d.stop(libc::SIGKILL);
        drop(changes);
        let rec = record(&h);
        let text = std::fs::read_to_string(&rec).expect("record");
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("trial {trial}: a torn record ({} bytes): {e}", text.len()));
        assert!(
            v["base"]["rule"].as_array().map_or(0, Vec::len) == 20_000,
            "trial {trial}: the record lost base rules"
        );
        d = h.daemon(&["--config", h.config()]);
        assert_eq!(
            listed(&d),
            in_kernel(&h.pair.rx_if),
            "trial {trial}: list and kernel disagree after the restart"
        );
    }
}

/// (Item 8) Where rules come from: the file is the base, live changes sit on top and
/// stay across reloads and restarts until unset or `reload --replace`; a flag
/// that sets what the file sets is refused.
#[test]
fn live_rules_stay_across_reloads_and_restarts_and_conflicting_flags_are_refused() {
    privileged!("live_rules_stay_across_reloads_and_restarts_and_conflicting_flags_are_refused");
    let h = Host::bare("live");
    let cfg = h.write(
        "r.toml",
        "[default]\nrate = \"100/s\"\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"allow\"\n",
    );
    let cfg_s = cfg.as_str();
    let out = refused(
        h.daemon_command(&["--config", cfg_s, "--rate", "50/s"]),
        "--rate against the file's rate",
    );
    assert!(
        out.contains("--rate conflicts with `[default] rate`") && out.contains("r.toml"),
        "{out}"
    );

    // A flag the file leaves alone is merged.
    let d = h.daemon(&["--config", cfg_s, "--clock", "coarse"]);
    assert!(
        d.json(&["list"])["clock"]
            .as_str()
            .unwrap_or("")
            .starts_with("coarse")
    );
    d.cli_ok(&["deny", "198.18.9.0/24"]);
    let has = |d: &Daemon, rule: &str| listed(d).contains(rule);
    d.child.signal(libc::SIGHUP);
    sleep(Duration::from_millis(500));
    assert!(has(&d, "198.18.9.0/24 deny"), "SIGHUP dropped a live rule");
    assert!(has(&d, "198.18.1.0/24 allow"));
    std::fs::write(
        &cfg,
        "[default]\nrate = \"100/s\"\n[[rule]]\ncidr = \"198.18.1.0/24\"\naction = \"allow\"\n[[rule]]\ncidr = \"198.18.3.0/24\"\naction = \"deny\"\n",
    )
    .expect("write");
    d.cli_ok(&["reload"]);
    assert!(has(&d, "198.18.9.0/24 deny"), "reload dropped a live rule");
    assert!(
        has(&d, "198.18.3.0/24 deny"),
        "reload did not read the file"
    );
    let origins = d.json(&["list"]);
    let origin = |cidr: &str| {
        origins["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .find(|r| r["cidr"] == cidr)
            .map(|r| r["origin"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(origin("198.18.9.0/24").as_deref(), Some("live"));
    assert_eq!(origin("198.18.3.0/24").as_deref(), Some("config"));
    // A file rule unset live stays unset across a reload.
    d.cli_ok(&["unset", "198.18.1.0/24"]);
    d.cli_ok(&["reload"]);
    assert!(
        !has(&d, "198.18.1.0/24 allow"),
        "an unset came back on reload"
    );

    // A clean restart with the same file: the live changes come back.
    assert_eq!(d.stop(libc::SIGTERM).code(), Some(0));
    let d = h.daemon(&["--config", cfg_s]);
    assert!(
        has(&d, "198.18.9.0/24 deny"),
        "a restart dropped a live rule"
    );
    assert!(!has(&d, "198.18.1.0/24 allow"), "a restart undid an unset");
    assert_eq!(listed(&d), in_kernel(&h.pair.rx_if));
    let denied = ip("198.18.9.9");
    let got = h.pair.probe(&[(denied, 200)], Duration::from_millis(300));
    assert_eq!(got.get(&denied).copied().unwrap_or(0), 0);

    // --replace: the file alone.
    d.cli_ok(&["reload", "--replace"]);
    assert!(!has(&d, "198.18.9.0/24 deny"));
    assert!(has(&d, "198.18.1.0/24 allow"));
    assert_eq!(d.json(&["list"])["live_changes"], 0);
    assert_eq!(listed(&d), in_kernel(&h.pair.rx_if));
}
