//! Restarts change nothing: a daemon of the fleet restarted every way
//! (SIGTERM, SIGKILL, `--reset`, `--keep-attached`) in the middle of a flood
//! spread over the fleet neither shuts the source out (a restarted daemon
//! that reported the key's whole history again emptied the fleet's bucket
//! for seconds: 8 % of the limit admitted) nor gives it a fresh burst: the
//! frames at the three receivers stay within the bound.

use std::{
    net::IpAddr,
    thread::sleep,
    time::{Duration, Instant},
};

use ratelimit_tests::{fleet::Fleet, privileged};

use super::{BURST, DELTA, RATE, RULE, bound};

#[derive(Clone, Copy, Debug)]
enum Restart {
    /// SIGTERM without `--keep-attached`: detached while down.
    Term,
    /// SIGKILL: the program stays, unsynced.
    Kill,
    /// SIGKILL, then a start with `--reset` (fresh maps).
    Reset,
    /// SIGTERM with `--keep-attached` (the shipped unit's restart).
    KeepAttached,
}

#[test]
fn restarts_neither_shut_a_source_out_nor_give_it_a_fresh_burst() {
    privileged!("restarts_neither_shut_a_source_out_nor_give_it_a_fresh_burst");
    let fleet = Fleet::start(3, false, &[], &RULE);
    fleet.wait_in_step(3, Duration::from_secs(10));
    let src: IpAddr = "198.18.0.61".parse().unwrap();
    // History: the key's counts grow in every program before any restart.
    fleet.flood(src, 67, &[0, 1, 2], Duration::from_secs(2));
    let secs = 6.0;
    for kind in [
        Restart::Term,
        Restart::Kill,
        Restart::Reset,
        Restart::KeepAttached,
    ] {
        if matches!(kind, Restart::KeepAttached) {
            // Its daemon must run with --keep-attached to be stopped so.
            fleet.members[1].stop(libc::SIGKILL);
            fleet.members[1].start(&["--keep-attached"]);
            fleet.wait_in_step(3, Duration::from_secs(10));
        }
        // The bucket full again between rounds.
        sleep(Duration::from_millis(500));
        let (got, gap) = std::thread::scope(|s| {
            let flood = s.spawn(|| fleet.flood(src, 67, &[0, 1, 2], Duration::from_secs_f64(secs)));
            sleep(Duration::from_millis(1500));
            let m = &fleet.members[1];
            let down = Instant::now();
            match kind {
                Restart::Term => {
                    m.stop(libc::SIGTERM);
                    m.start(&[]);
                }
                Restart::Kill => {
                    m.stop(libc::SIGKILL);
                    m.start(&[]);
                }
                Restart::Reset => {
                    m.stop(libc::SIGKILL);
                    m.start(&["--reset"]);
                }
                Restart::KeepAttached => {
                    m.stop(libc::SIGTERM);
                    m.start(&["--keep-attached"]);
                }
            }
            let gap = down.elapsed().as_secs_f64();
            (flood.join().expect("flood"), gap)
        });
        let total: u64 = got.iter().sum();
        // A dead daemon's program admits its bucket unsynced for 0.5 s
        // before it charges three times: the Δ of its term is 0.5 s once.
        let mut limit = bound(3.0, secs, DELTA) + BURST + RATE * 0.5;
        if matches!(kind, Restart::Term) {
            // Detached while down: what reached that host then passed
            // unlimited, as for any rule (67/s for the gap).
            limit += 67.0 * gap + 10.0;
        }
        eprintln!(
            "fleet, restart {kind:?} (down {gap:.1} s): {got:?} = {total} admitted of {} sent over {secs} s; exact {}, bound {limit:.0}",
            67.0 * 3.0 * secs,
            BURST + RATE * secs
        );
        assert!(
            (total as f64) <= limit,
            "restart {kind:?}: {total} admitted ({got:?}), bound {limit:.0}: a fresh burst"
        );
        assert!(
            (total as f64) >= 0.85 * RATE * secs,
            "restart {kind:?}: {total} admitted ({got:?}): the source was shut out (the limit admits {} over {secs} s)",
            RATE * secs
        );
        fleet.wait_in_step(3, Duration::from_secs(10));
    }
}
