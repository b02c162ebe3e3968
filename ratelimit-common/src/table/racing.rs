//! A [`Cells`] for tests of a claim's race: [`HostCells`], with another CPU
//! writing its tag into the word of a chosen operation, just before it.

extern crate std;

use super::{Cells, HostCells};

std::thread_local! {
    /// (operations left before the other CPU writes, its tag; 0: none).
    static RACE: core::cell::Cell<(u32, u64)> = const { core::cell::Cell::new((0, 0)) };
}

/// Another CPU writes `tag` into the word of the load or compare-and-swap
/// that comes after `ops` more of them on this thread.
pub(crate) fn race_after(ops: u32, tag: u64) {
    RACE.with(|r| r.set((ops, tag)));
}

/// [`HostCells`], with the race [`race_after`] set.
pub(crate) struct Racing;

impl Racing {
    fn step(p: *mut u64) {
        let (left, tag) = RACE.with(core::cell::Cell::get);
        if tag == 0 {
            return;
        }
        if left == 0 {
            HostCells::store(p, tag);
            RACE.with(|r| r.set((0, 0)));
        } else {
            RACE.with(|r| r.set((left - 1, tag)));
        }
    }
}

impl Cells for Racing {
    fn load(p: *mut u64) -> u64 {
        Self::step(p);
        HostCells::load(p)
    }
    fn cas(p: *mut u64, old: u64, new: u64) -> (u64, bool) {
        Self::step(p);
        HostCells::cas(p, old, new)
    }
    fn xchg(p: *mut u64, new: u64) -> u64 {
        HostCells::xchg(p, new)
    }
    fn add(p: *mut u64, n: u64) {
        HostCells::add(p, n)
    }
    fn store(p: *mut u64, v: u64) {
        HostCells::store(p, v)
    }
}
