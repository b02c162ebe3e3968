//! The verifier's figures for the program on this kernel: the instructions
//! it processed (the kernel says) and the deepest chain's combined stack
//! (read from the object, frames rounded to 32 as the oldest kernels do),
//! against `tests/kernels.txt`. Prints the line `cargo xtask vm --record`
//! keeps.

use std::io::Write as _;

use ratelimit_tests::{
    privileged,
    verifier::{Figures, check_budget, parse_budget, stack_report},
};

use super::{limit, rules};

/// The kernel's release, as `uname -r` prints it.
fn release() -> String {
    // SAFETY: a zeroed utsname is valid; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to it.
    assert_eq!(unsafe { libc::uname(&mut u) }, 0, "uname");
    // SAFETY: uname NUL-terminates the field.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_verifier_figures_stay_within_the_budget() {
    privileged!("the_verifier_figures_stay_within_the_budget");
    let l = ratelimit_tests::testrun::Loaded::new(&rules(limit("1/s", 1)));
    let (processed, _) = l.verifier_stats();
    let stack = stack_report(ratelimit_user::EBPF_OBJECT, ratelimit_common::PROGRAM_NAME)
        .expect("reading the object's stack frames");
    let now = Figures {
        release: release(),
        instructions: u64::from(
            processed.expect("the kernel reports verified instructions (5.16 and later)"),
        ),
        stack: u64::from(stack.combined),
    };
    // For `cargo xtask vm --record`, and for the reader of the output:
    // written to stdout itself, which the test harness does not capture.
    let _ = writeln!(std::io::stdout(), "{}", now.line());
    eprintln!("deepest chain: {}", stack.chain_text());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let budget = parse_budget(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let recorded = budget.iter().find(|f| f.release == now.release);
    if recorded.is_none() {
        eprintln!(
            "{path} has no figures for {}: held to the absolute limits only (`cargo xtask vm --record` adds them)",
            now.release
        );
    }
    if let Err(e) = check_budget(&now, recorded) {
        panic!(
            "the verifier's budget ({path}):\n{e}\ndeepest chain: {}",
            stack.chain_text()
        );
    }
}
