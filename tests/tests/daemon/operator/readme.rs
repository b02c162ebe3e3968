//! The README's examples are real output (issue 39, "docs that cannot
//! rot"): each `console` block of "A 30-second example" is run again, its
//! commands typed as the README types them, on a fresh daemon, with the
//! floods the README describes, and every line compared with what the
//! README shows. Numbers (counts, ids, times) differ from run to run and
//! are compared as numbers, not by value; everything else must be the same
//! words in the same order.

use std::{path::Path, time::Duration};

use ratelimit_tests::{check::ip, fixture::Host, privileged, ratelimit_bin};

use super::PORT;

/// One command of a console block, and the lines the README shows after it.
#[derive(Debug)]
struct Shown {
    /// Its line in README.md (1-based).
    line: usize,
    command: String,
    output: Vec<String>,
}

/// The console blocks of the section titled `heading` (to the next `## `).
fn blocks(readme: &str, heading: &str) -> Vec<Vec<Shown>> {
    let mut out: Vec<Vec<Shown>> = Vec::new();
    let mut in_section = false;
    let mut in_block = false;
    // After `^C`, the lines are the first command's (the daemon's) again.
    let mut stopped = false;
    for (i, line) in readme.lines().enumerate() {
        if line.starts_with("## ") {
            in_section = line.trim_end() == heading;
            continue;
        }
        if !in_section {
            continue;
        }
        if line.trim_end() == "```console" {
            in_block = true;
            stopped = false;
            out.push(Vec::new());
            continue;
        }
        if in_block && line.trim_end() == "```" {
            in_block = false;
            continue;
        }
        if !in_block {
            continue;
        }
        let block = out.last_mut().expect("a block");
        if line.trim_end() == "^C" {
            stopped = true;
        }
        if stopped {
            if let Some(first) = block.first_mut() {
                first.output.push(line.to_string());
            }
        } else if let Some(command) = line.strip_prefix("$ ") {
            block.push(Shown {
                line: i + 1,
                command: command.to_string(),
                output: Vec::new(),
            });
        } else if line.starts_with("# ") {
            // A comment between commands.
        } else if let Some(last) = block.last_mut() {
            last.output.push(line.to_string());
        }
    }
    out
}

/// A line as compared: every number (a run of digits) is `N`, every run of
/// blanks one space, the test's interface is called `eth0` as in the
/// README.
fn shape(line: &str, iface: &str) -> String {
    let line = line.replace(iface, "eth0");
    let mut out = String::new();
    let mut last = ' ';
    for c in line.trim().chars() {
        let c = if c.is_ascii_digit() {
            'N'
        } else if c.is_whitespace() {
            ' '
        } else {
            c
        };
        if (c == 'N' && last == 'N') || (c == ' ' && last == ' ') {
            continue;
        }
        out.push(c);
        last = c;
    }
    out
}

/// The lines of `shown` that are not blank, as shapes.
fn shapes<'a>(lines: impl IntoIterator<Item = &'a String>, iface: &str) -> Vec<String> {
    lines
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| shape(l, iface))
        .collect()
}

/// Fails with every line of `what` that differs, README's against this
/// run's.
fn compare(
    what: &str,
    readme: &[String],
    real: &[String],
    iface: &str,
    mismatches: &mut Vec<String>,
) {
    let (want, got) = (shapes(readme, iface), shapes(real, iface));
    if want != got {
        mismatches.push(format!(
            "{what}:\n  the README shows:\n    {}\n  this run printed:\n    {}",
            readme.join("\n    "),
            real.join("\n    ")
        ));
    }
}

/// Runs `command` (as the README types it, `ratelimit` first, perhaps piped)
/// in the daemon's namespace: what it printed, stdout then stderr, and its
/// exit code.
fn run(h: &Host, command: &str) -> (Vec<String>, i32) {
    let rest = command
        .strip_prefix("ratelimit ")
        .unwrap_or_else(|| panic!("not a ratelimit command: {command}"));
    let line = format!("{} {rest}", ratelimit_bin().display());
    let out = h
        .pair
        .rx
        .command("sh")
        .args(["-c", &line])
        .env("RATELIMIT_RUN_DIR", h.run_dir())
        .output()
        .expect("sh -c");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.extend(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(str::to_string),
    );
    (lines, out.status.code().unwrap_or(-1))
}

/// The daemon's own lines in `output` that start with `prefix`.
fn daemon_lines(output: &str, prefix: &str) -> Vec<String> {
    output
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_readmes_example_is_what_this_version_prints() {
    privileged!("the_readmes_example_is_what_this_version_prints");
    if !ratelimit_tests::require_tool("the_readmes_example_is_what_this_version_prints", "jq") {
        return;
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README.md");
    let blocks = blocks(&readme, "## A 30-second example");
    assert_eq!(blocks.len(), 2, "the example's two console blocks");
    let mut mismatches = Vec::new();

    // The first block: the daemon, changes and readings under two floods
    // from 198.18.0.1 at 1600 frames/s for 3 s, the first before the
    // first `list --stats`, the second while `top` watches.
    let (start, commands) = blocks[0].split_first().expect("the daemon's start");
    assert!(
        start
            .command
            .contains("run --iface eth0 -- --rate 100/s --burst 50"),
        "{start:?}"
    );
    let h = Host::bare("readme");
    let d = h.daemon(&["--rate", "100/s", "--burst", "50"]);
    let iface = h.pair.rx_if.clone();
    let stop_at = start
        .output
        .iter()
        .position(|l| l == "^C")
        .unwrap_or(start.output.len());
    let (started, stopped) = start.output.split_at(stop_at);
    let started: Vec<String> = started
        .iter()
        .filter(|l| l.starts_with("ratelimit:"))
        .cloned()
        .collect();
    compare(
        &format!("README.md:{}: the daemon's start", start.line),
        &started,
        &daemon_lines(&d.output(), "ratelimit: enforcing"),
        &iface,
        &mut mismatches,
    );
    let flood = |h: &Host| {
        h.pair.send_async(
            &[h.pair.flow(ip("198.18.0.1"), PORT, 1600)],
            Duration::from_secs(3),
        )
    };
    let mut floods = 0;
    let mut pending = None;
    for shown in commands {
        let c = shown.command.as_str();
        // The first flood after the /24's rule in dry run; the second
        // after dry run is off, `top` watching it.
        if (c == "ratelimit list --stats" && floods == 0)
            || (c.starts_with("ratelimit top") && floods == 1)
        {
            let f = flood(&h);
            floods += 1;
            if floods == 1 {
                f.join().expect("the first flood");
            } else {
                std::thread::sleep(Duration::from_millis(1500));
                pending = Some(f);
            }
        }
        let (real, _) = run(&h, c);
        compare(
            &format!("README.md:{}: $ {c}", shown.line),
            &shown.output,
            &real,
            &iface,
            &mut mismatches,
        );
        if c.starts_with("ratelimit top") {
            pending.take().map(|f| f.join().expect("the second flood"));
        }
    }
    assert_eq!(floods, 2, "the block's two floods were not placed");
    let log = d.log.clone();
    d.stop(libc::SIGINT);
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let stopped: Vec<String> = stopped
        .iter()
        .filter(|l| l.starts_with("ratelimit:"))
        .cloned()
        .collect();
    compare(
        &format!("README.md:{}: the daemon's exit on Ctrl-C", start.line),
        &stopped,
        &daemon_lines(&output, "ratelimit: detached"),
        &iface,
        &mut mismatches,
    );

    // The second block ("from another run"): each command's output and its
    // exit status, on a fresh daemon.
    let d = h.daemon(&[]);
    for shown in &blocks[1] {
        let (mut real, code) = run(&h, &shown.command);
        real.push(format!("exit {code}"));
        // The exit status is a number the README states: compared by value.
        let want_exit = shown.output.iter().rev().find(|l| l.starts_with("exit "));
        if let Some(w) = want_exit
            && *w != format!("exit {code}")
        {
            mismatches.push(format!(
                "README.md:{}: $ {}: the README says {w}, this run exited {code}",
                shown.line, shown.command
            ));
        }
        let want: Vec<String> = shown.output.clone();
        let real = if want_exit.is_some() {
            real
        } else {
            real[..real.len() - 1].to_vec()
        };
        compare(
            &format!("README.md:{}: $ {}", shown.line, shown.command),
            &want,
            &real,
            &iface,
            &mut mismatches,
        );
    }
    d.stop(libc::SIGTERM);
    assert!(
        mismatches.is_empty(),
        "the README's example is not what this version prints (rerun it and paste the real output):\n\n{}",
        mismatches.join("\n\n")
    );
}

#[test]
fn shapes_compare_words_not_numbers() {
    assert_eq!(
        shape("passed   62   6324  10", "rl1"),
        shape("passed 1 42 0", "rl1")
    );
    assert_ne!(shape("notes []", "x"), shape("notes [\"a note\"]", "x"));
    assert_eq!(
        shape("iface \"rl58530r\"", "rl58530r"),
        shape("iface \"eth0\"", "x")
    );
}
