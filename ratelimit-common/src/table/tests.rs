extern crate std;

use std::{sync::Barrier, thread, vec::Vec};

use super::*;

type C = HostCells;

fn table(lines: usize) -> Vec<Line> {
    std::vec![Line::default(); lines]
}

#[test]
fn key_words_are_never_empty_and_read_back() {
    for (addr, id) in [(0, 0), (u32::MAX, crate::MAX_RULE_ID), (7, 2 << 30 | 5)] {
        let w = key_word(addr, id);
        assert_ne!(w, 0);
        assert_eq!(key_of(w), (addr, id));
    }
}

#[test]
fn two_lines_differ_unless_there_is_one() {
    for h in [0u64, 1, u64::MAX, 0x1234_5678_9abc_def0] {
        let (a, b) = lines(h, 1023);
        assert_ne!(a, b);
        assert!(a <= 1023 && b <= 1023);
        assert_eq!(lines(h, 0), (0, 0));
    }
}

#[test]
fn a_busy_bucket_is_never_free_and_an_idle_one_always_is() {
    let p = gcra::Params::from_rate(10, 1_000_000_000, 10).unwrap();
    let now = 5_000_000_000u64;
    let mut s = gcra::State::full(now, &p);
    assert!(reads_full(s.tat, now));
    assert!(gcra::admit(&mut s, &p, now, 1));
    assert!(!reads_full(s.tat, now));
    assert!(!free(1, s.tat, now));
    // 100 ms later the one token is back.
    assert!(reads_full(s.tat, now + 100_000_000));
    assert!(
        free(0, s.tat, now),
        "an empty slot is free whatever its word"
    );
    assert!(!free(1, LOCKED, now + 10_000_000_000));
}

#[test]
fn a_claim_never_stores_the_value_it_replaced() {
    let seen = 1234u64 << 13;
    assert_ne!(fresh(seen, seen), seen);
    assert!(reads_full(fresh(seen, seen), 1234));
    assert_eq!(fresh(7, 8), 7);
}

#[test]
fn a_full_pair_of_lines_refuses_and_a_free_slot_is_reused() {
    let p = gcra::Params::from_rate(1, 1_000_000_000, 1).unwrap();
    let now = 1_000_000_000u64;
    let mut t = table(2);
    let (a, b): (*mut Line, *mut Line) = (&mut t[0], &mut t[1]);
    let busy = {
        let mut s = gcra::State::full(now, &p);
        gcra::admit(&mut s, &p, now, 1);
        s.tat
    };
    for k in 1..=8u64 {
        // SAFETY: two lines of a live table.
        let got = unsafe { claim::<C>(a, b, null(), null(), k, busy, now) };
        assert!(matches!(got, Slot::At(..)), "key {k}: {got:?}");
    }
    // SAFETY: as above.
    let got = unsafe { claim::<C>(a, b, null(), null(), 9, busy, now) };
    assert_eq!(got, Slot::Full);
    // A second later every bucket is full again: its slot may go to a new key.
    // SAFETY: as above.
    let got = unsafe { claim::<C>(a, b, null(), null(), 9, busy, now + 1_000_000_000) };
    assert!(matches!(got, Slot::At(..)));
    // SAFETY: as above.
    unsafe {
        assert!(find_in::<C>(a, 9).is_some() || find_in::<C>(b, 9).is_some());
    }
}

/// A new key takes an empty slot first, then the free slot idle the
/// longest: a source that sends now and then keeps its slot (and its birth)
/// while keys that came once give theirs to each other.
#[test]
fn a_new_key_takes_the_slot_idle_the_longest() {
    let p = gcra::Params::from_rate(1, 1_000_000_000, 1).unwrap();
    let mut t = table(2);
    let (a, b): (*mut Line, *mut Line) = (&mut t[0], &mut t[1]);
    // Eight keys, one a second: key k last charged at k s.
    let at = |s: u64| s * 1_000_000_000;
    for k in 1..=8u64 {
        let mut st = gcra::State::full(at(k), &p);
        gcra::admit(&mut st, &p, at(k), 1);
        // SAFETY: two lines of a live table.
        let got = unsafe { claim::<C>(a, b, null(), null(), k, st.tat, at(k)) };
        assert!(matches!(got, Slot::At(..)), "key {k}: {got:?}");
    }
    // Key 3 sends again at 20 s: the freshest of all.
    // SAFETY: as above.
    let (l, i) = unsafe {
        find_in::<C>(a, 3)
            .map(|i| (a, i))
            .or(find_in::<C>(b, 3).map(|i| (b, i)))
    }
    .expect("key 3 holds a slot");
    let mut st = gcra::State::full(at(20), &p);
    gcra::admit(&mut st, &p, at(20), 1);
    // SAFETY: as above.
    unsafe { *words_of(l, i).1 = st.tat };
    // At 30 s every bucket is full again: new keys (idle from now on) take
    // the old keys' slots in the order those went idle, key 3 last.
    let order = [1u64, 2, 4, 5, 6, 7, 8];
    for n in 0..order.len() {
        let new = 100 + n as u64;
        let fresh = gcra::State::full(at(30), &p).tat;
        // SAFETY: as above.
        let got = unsafe { claim::<C>(a, b, null(), null(), new, fresh, at(30)) };
        assert!(matches!(got, Slot::At(..)), "key {new}: {got:?}");
        let gone: Vec<u64> = (1..=8u64).filter(|k| !holds_in(a, b, *k)).collect();
        assert_eq!(
            gone.as_slice(),
            {
                let mut g = order[..=n].to_vec();
                g.sort();
                g
            }
            .as_slice(),
            "after {} new keys",
            n + 1
        );
    }
    assert!(holds_in(a, b, 3));
    // An empty slot goes before any idle one.
    let mut t = table(2);
    let (a, b): (*mut Line, *mut Line) = (&mut t[0], &mut t[1]);
    // SAFETY: as above.
    unsafe {
        let idle = gcra::State::full(at(1), &p).tat;
        claim::<C>(a, b, null(), null(), 1, idle, at(1));
        claim::<C>(a, b, null(), null(), 2, 0, at(30));
    }
    assert!(
        holds_in(a, b, 1),
        "an idle key was replaced while an empty slot was left"
    );
}

fn holds_in(a: *mut Line, b: *mut Line, k: u64) -> bool {
    // SAFETY: two lines of a live table.
    unsafe { find_in::<C>(a, k).is_some() || find_in::<C>(b, k).is_some() }
}

fn null() -> *mut Born {
    core::ptr::null_mut()
}

/// Threads claim the same keys at the same moment, and each charges the
/// key's bucket once, wherever it found it: a key never ends with two slots,
/// and no charge is lost (two CPUs owning one slot would overwrite one).
#[test]
fn a_key_claimed_on_many_cpus_at_once_gets_one_slot() {
    const THREADS: usize = 4;
    // A bucket far from full at time 0, so that no slot is free once taken.
    let state = 1u64 << 40;
    for round in 0..500u64 {
        let mut t = table(2);
        let base = t.as_mut_ptr() as usize;
        let barrier = Barrier::new(THREADS);
        let charged = std::sync::atomic::AtomicU64::new(0);
        thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let (a, b) = (base as *mut Line, (base + 64) as *mut Line);
                    barrier.wait();
                    for k in 1..=3u64 {
                        let key = k + round * 10;
                        // SAFETY: lines of a table that outlives the scope.
                        let at = unsafe {
                            let found = |l: *mut Line| find_in::<C>(l, key).map(|i| (l, i));
                            match found(a).or_else(|| found(b)) {
                                Some(at) => Some(at),
                                None => match claim::<C>(a, b, null(), null(), key, state, 0) {
                                    Slot::At(0, i) => Some((a, i)),
                                    Slot::At(_, i) => Some((b, i)),
                                    _ => found(a).or_else(|| found(b)),
                                },
                            }
                        };
                        let Some((line, i)) = at else { continue };
                        // SAFETY: as above.
                        let (kw, tw) = unsafe { words_of(line, i) };
                        loop {
                            let seen = C::load(tw);
                            if seen == LOCKED {
                                continue;
                            }
                            assert_eq!(C::load(kw), key);
                            if C::cas(tw, seen, seen + 1).1 {
                                charged.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                });
            }
        });
        let charged = charged.into_inner();
        let mut total = 0;
        for k in 1..=3u64 {
            let key = k + round * 10;
            let slots: Vec<u64> = t
                .iter()
                .flat_map(|l| l.keys.iter().zip(l.tats.iter()))
                .filter(|(w, _)| **w == key)
                .map(|(_, tat)| *tat)
                .collect();
            assert!(
                slots.len() <= 1,
                "round {round}: key {key} holds {} slots",
                slots.len()
            );
            total += slots.iter().map(|tat| tat - state).sum::<u64>();
        }
        assert_eq!(total, charged, "round {round}: charges lost");
    }
}

/// The old owner of a slot keeps charging it while other threads reclaim it
/// for new keys: every charge that succeeded while the slot was the old
/// owner's lands in the old owner's bucket, never in a new owner's, and no
/// new owner starts with anything but its fresh bucket.
#[test]
fn a_reclaimed_slot_never_takes_the_old_owners_charge() {
    const CHARGES: u64 = 20_000;
    let mut t = table(1);
    let base = t.as_mut_ptr() as usize;
    let old = 1u64;
    // The old owner's slot, idle (a full bucket: 0 ticks at time 10 s).
    let now = 10_000_000_000u64;
    t[0].keys[0] = old;
    t[0].tats[0] = 0;
    let wrong = std::sync::atomic::AtomicU64::new(0);
    thread::scope(|s| {
        // The old owner: find, read, check, compare-and-swap +1 tick.
        s.spawn(|| {
            let line = base as *mut Line;
            for _ in 0..CHARGES {
                // SAFETY: a line of a live table.
                let Some(i) = (unsafe { find_in::<C>(line, old) }) else {
                    continue;
                };
                // SAFETY: as above.
                let (kw, tw) = unsafe { words_of(line, i) };
                let seen = C::load(tw);
                if !owned(seen, C::load(kw), old) {
                    continue;
                }
                // A charge that keeps the bucket reading full (so that the
                // slot stays free to claim): one tick, then back.
                let _ = C::cas(tw, seen, seen ^ 1);
            }
        });
        // Claimers: take the slot for new keys whose state is a marker, and
        // check it is theirs, untouched, once stored.
        s.spawn(|| {
            let line = base as *mut Line;
            for n in 0..CHARGES / 4 {
                let key = 100 + n;
                let mine = (now - 1_000_000) << 13 & gcra::TAT_MASK;
                // SAFETY: as above.
                let claimed = unsafe { claim::<C>(line, line, null(), null(), key, mine, now) };
                if let Slot::At(_, i) = claimed {
                    // SAFETY: as above.
                    let (kw, tw) = unsafe { words_of(line, i) };
                    let got = C::load(tw);
                    if C::load(kw) == key && got != mine && got != fresh(mine, mine) {
                        wrong.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    // Give it back to the old owner, idle.
                    // SAFETY: as above.
                    unsafe { sweep_slot::<C>(line, i, key, now) };
                    C::xchg(kw, old);
                }
            }
        });
    });
    assert_eq!(wrong.into_inner(), 0, "a new owner's bucket was charged");
}

#[test]
fn each_family_keeps_to_its_region() {
    // IPv4: lines 0..1024; IPv6: 256 lines after them.
    let v4 = region(1023, 0);
    let v6 = region(255, 1024);
    for h in [0u64, 1, u64::MAX, 0x1234_5678_9abc_def0, 0xdead_beef] {
        let (a, b) = region_lines(h, v4);
        assert!(a < 1024 && b < 1024 && a != b);
        let (a, b) = region_lines(h, v6);
        assert!((1024..1280).contains(&a) && (1024..1280).contains(&b) && a != b);
    }
}

#[test]
fn ipv6_key_words_are_never_empty_and_differ_by_key_and_seed() {
    let a: Words = [0x2001_0db8u32.to_be(), 0, 0, 0];
    let mut b = a;
    b[1] = 1;
    let w = key_word6(&a, 7, 42);
    assert_ne!(w, 0);
    assert_eq!(w, key_word6(&a, 7, 42));
    assert_ne!(w, key_word6(&b, 7, 42));
    assert_ne!(w, key_word6(&a, 8, 42));
    // Another seed, another word: nobody can compute it without the seed.
    assert_ne!(w, key_word6(&a, 7, 43));
    // Not the hash that picks the lines.
    assert_ne!(w | 1, crate::doorkeeper::hash_words(&a, 7, 42) | 1);
    // Never 0, whatever the key.
    for i in 0..10_000u32 {
        assert_ne!(key_word6(&[i, 0, 0, 0], i, 1), 0);
    }
}
