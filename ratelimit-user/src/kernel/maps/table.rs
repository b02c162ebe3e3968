//! The state table ([`common::table`]) and `top`'s ([`common::top`]) as the daemon sees them: the program's
//! two arrays mapped into its memory (`BPF_F_MMAPABLE`), read
//! without a system call per key and, under fleet-wide rules, written with
//! the same atomics and claim protocol as the program's.

use std::os::fd::AsFd as _;

use aya::maps::{Array, IterableMap as _, MapData};
use ratelimit_common::{
    self as common, FlowKey, MAP_BORN, MAP_TABLE, Words,
    table::{self, Born, Cells as _, HostCells, Line, Slot},
};

use crate::error::{Error, Result};

/// One shared mapping of an array map's values.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory the daemon only touches through
// atomics (the table's words) or plain reads of words written once (birth
// stamps); it is unmapped once, on drop.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn of(map: &MapData, name: &'static str) -> Result<Self> {
        let info = map.info().map_err(super::map_err("reading", name))?;
        // SAFETY: a query with no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let bytes = info.value_size() as usize * info.max_entries() as usize;
        let len = bytes.div_ceil(page) * page;
        // SAFETY: a shared mapping of an mmapable array map's values, as
        // long as the kernel has it (`len` rounded to pages, as it maps).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&map.fd().as_fd()),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::Io {
                what: format!("mapping {name} into memory (BPF_F_MMAPABLE, kernel 5.5 or later)"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The state table and its birth stamps.
pub(super) struct StateTable {
    pub(super) lines_map: Array<MapData, Line>,
    pub(super) born_map: Array<MapData, Born>,
    lines: Mapping,
    born: Mapping,
    count: u32,
    /// Lines of IPv4 keys (first); the rest are IPv6 keys'.
    v4_lines: u32,
}

/// What the table holds ([`StateTable::census`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Slots holding an IPv4 key.
    pub v4: u64,
    /// Slots holding an IPv6 key.
    pub v6: u64,
    /// Of those, slots whose bucket is not full.
    pub active: u64,
}

/// A slot that holds a key: its line, slot, key word, state word and birth.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub line: u32,
    pub slot: u32,
    pub word: u64,
    pub state: common::SourceState,
}

impl StateTable {
    /// Maps the two arrays, whose first `v4_lines` lines are IPv4 keys'.
    pub(super) fn new(
        lines_map: Array<MapData, Line>,
        born_map: Array<MapData, Born>,
        v4_lines: u32,
    ) -> Result<Self> {
        let count = lines_map.len();
        let v6_lines = count.wrapping_sub(v4_lines);
        if born_map.len() != count
            || !v4_lines.is_power_of_two()
            || !v6_lines.is_power_of_two()
            || v4_lines >= count
        {
            return Err(Error::invalid(
                "--max-sources",
                format!(
                    "{MAP_TABLE} has {count} lines ({v4_lines} of them IPv4 keys', as the pinned config says) and {MAP_BORN} {}: the accepted form is a power of two of lines for each family, the same in both maps; the pinned maps were changed by hand: restart with --reset to create them anew (rules are kept)",
                    born_map.len()
                ),
            ));
        }
        Ok(Self {
            lines: Mapping::of(lines_map.map(), MAP_TABLE)?,
            born: Mapping::of(born_map.map(), MAP_BORN)?,
            lines_map,
            born_map,
            count,
            v4_lines,
        })
    }

    /// Lines of (IPv4, IPv6) keys.
    pub(super) fn lines(&self) -> (u32, u32) {
        (self.v4_lines, self.count - self.v4_lines)
    }

    /// Slots in the table.
    pub(super) fn slots(&self) -> u64 {
        u64::from(self.count) * table::WAYS as u64
    }

    /// The region of the family of `key` ([`table::region`]).
    fn region(&self, key: &FlowKey) -> u64 {
        if common::is_v4_mapped(&key.addr) {
            table::region(self.v4_lines - 1, 0)
        } else {
            table::region(self.count - self.v4_lines - 1, self.v4_lines)
        }
    }

    fn line(&self, n: u32) -> *mut Line {
        assert!(n < self.count, "line {n} of a table of {}", self.count);
        // SAFETY: `n` is a line of the mapping (checked above).
        unsafe { self.lines.ptr.cast::<Line>().add(n as usize) }
    }

    fn born_of(&self, n: u32) -> *mut Born {
        assert!(n < self.count, "line {n} of a table of {}", self.count);
        // SAFETY: as in `line`.
        unsafe { self.born.ptr.cast::<Born>().add(n as usize) }
    }

    /// Every slot that holds a key, with its state (a slot being claimed is
    /// skipped).
    pub(super) fn held(&self) -> impl Iterator<Item = Held> + '_ {
        (0..self.count).flat_map(move |n| {
            let line = self.line(n);
            let born = self.born_of(n);
            (0..table::WAYS as u32).filter_map(move |i| {
                // SAFETY: a line of the mapping.
                let (kw, tw) = unsafe { table::words_of(line, i) };
                let (k, t) = (HostCells::load(kw), HostCells::load(tw));
                if k == 0 || t == table::LOCKED {
                    return None;
                }
                // SAFETY: the birth stamp of the same slot.
                let b = unsafe { (*born)[i as usize] };
                Some(Held {
                    line: n,
                    slot: i,
                    word: k,
                    state: common::SourceState {
                        gcra: common::gcra::State { tat: t },
                        born: b,
                    },
                })
            })
        })
    }

    /// One pass over the table at `now_ns`: slots holding an IPv4 key, an
    /// IPv6 key, and of those the ones whose bucket is not full (active). A
    /// slot being claimed is not counted. Reads two words a slot, nothing
    /// else: `status` asks for it on the daemon's loop.
    pub(super) fn census(&self, now_ns: u64) -> Census {
        let mut c = Census::default();
        let lines = self.lines.ptr.cast::<Line>();
        for n in 0..self.count {
            // SAFETY: `n` is a line of the mapping.
            let line = unsafe { lines.add(n as usize) };
            let (mut held, mut active) = (0, 0);
            for i in 0..table::WAYS as u32 {
                // SAFETY: a line of the mapping, `i < WAYS`.
                let (kw, tw) = unsafe { table::words_of(line, i) };
                let (k, t) = (HostCells::load(kw), HostCells::load(tw));
                if k != 0 && t != table::LOCKED {
                    held += 1;
                    active += u64::from(!table::reads_full(t, now_ns));
                }
            }
            if n < self.v4_lines {
                c.v4 += held;
            } else {
                c.v6 += held;
            }
            c.active += active;
        }
        c
    }

    /// The slot of `key` in the table, hashed with `seed`: (line, slot).
    fn find(&self, key: &FlowKey, seed: u64) -> Option<(u32, u32)> {
        let (kw, h) = word_and_hash(key, seed);
        let (a, b) = table::region_lines(h, self.region(key));
        for n in [a, b] {
            // SAFETY: a line of the mapping.
            if let Some(i) = unsafe { table::find_in::<HostCells>(self.line(n), kw) } {
                return Some((n, i));
            }
        }
        None
    }

    /// The state of `key`, if it holds a slot.
    pub(super) fn get(&self, key: &FlowKey, seed: u64) -> Option<common::SourceState> {
        let (n, i) = self.find(key, seed)?;
        // SAFETY: a line of the mapping.
        let (kw, tw) = unsafe { table::words_of(self.line(n), i) };
        let t = HostCells::load(tw);
        if !table::owned(t, HostCells::load(kw), word_and_hash(key, seed).0) {
            return None;
        }
        // SAFETY: the birth stamp of the same slot.
        let born = unsafe { (*self.born_of(n))[i as usize] };
        Some(common::SourceState {
            gcra: common::gcra::State { tat: t },
            born,
        })
    }

    /// Raises the state word of `key` to `to(current)` if that is more, with
    /// compare-and-swap; a key without a slot claims one holding `to(None)`.
    /// Whether the key holds what was asked.
    pub(super) fn raise(
        &self,
        key: &FlowKey,
        seed: u64,
        now_ns: u64,
        to: impl Fn(Option<u64>) -> u64,
    ) -> bool {
        let (kw, h) = word_and_hash(key, seed);
        for _ in 0..4 {
            if let Some((n, i)) = self.find(key, seed) {
                // SAFETY: a line of the mapping.
                let (kw_p, tw) = unsafe { table::words_of(self.line(n), i) };
                let seen = HostCells::load(tw);
                if !table::owned(seen, HostCells::load(kw_p), kw) {
                    continue;
                }
                let want = to(Some(seen));
                if want == seen || HostCells::cas(tw, seen, want).1 {
                    return true;
                }
                continue;
            }
            let (a, b) = table::region_lines(h, self.region(key));
            // SAFETY: two lines of the mapping and their birth stamps.
            let got = unsafe {
                table::claim::<HostCells>(
                    self.line(a),
                    self.line(b),
                    self.born_of(a),
                    self.born_of(b),
                    kw,
                    to(None),
                    now_ns,
                )
            };
            match got {
                Slot::At(..) => return true,
                Slot::Full => return false,
                Slot::Busy | Slot::Raced => {}
            }
        }
        false
    }

    /// Frees the slot held at `held` if it still holds the same key and its
    /// bucket reads as full at `now_ns` (the idle sweep). Whether it was.
    pub(super) fn free_idle(&self, held: &Held, now_ns: u64) -> bool {
        // SAFETY: a line of the mapping (checked by `line`).
        unsafe {
            table::sweep_slot::<HostCells>(self.line(held.line), held.slot, held.word, now_ns)
        }
    }
}

/// The key word and hash of a key, as the program makes them.
fn word_and_hash(key: &FlowKey, seed: u64) -> (u64, u64) {
    let w: Words = common::words(&key.addr);
    let fam = if common::is_v4_mapped(&key.addr) {
        common::family::V4
    } else {
        common::family::V6
    };
    (
        table::key_word_for(fam, &w, key.rule_id, seed),
        common::doorkeeper::hash_words(&w, key.rule_id, seed),
    )
}

/// An array of sets mapped into memory (`top`'s, [`common::top`], and the
/// fleet's counts, [`common::fleet_table`]): read without a system call per
/// set.
pub(super) struct Sets<T: aya::Pod> {
    pub(super) map: Array<MapData, T>,
    sets: Mapping,
    count: u32,
}

impl<T: aya::Pod> Sets<T> {
    pub(super) fn new(map: Array<MapData, T>, name: &'static str) -> Result<Self> {
        Ok(Self {
            sets: Mapping::of(map.map(), name)?,
            count: map.len(),
            map,
        })
    }

    /// Each set whose first `tags` words (its slots' tags) are not all 0,
    /// as it reads now, word by word (atomically each: the program writes
    /// them meanwhile; the readers check each slot's key against its tag).
    pub(super) fn each(&self, tags: usize) -> impl Iterator<Item = T> + '_ {
        const { assert!(size_of::<T>().is_multiple_of(8)) };
        let words = size_of::<T>() / 8;
        (0..self.count as usize).filter_map(move |n| {
            let first = self.sets.ptr.cast::<u64>().wrapping_add(n * words);
            if (0..tags.min(words)).all(|i| HostCells::load(first.wrapping_add(i)) == 0) {
                return None;
            }
            let mut set = std::mem::MaybeUninit::<T>::uninit();
            let out = set.as_mut_ptr().cast::<u64>();
            for i in 0..words {
                // SAFETY: word `i` of set `n` of the mapping, and of `set`.
                unsafe { out.add(i).write(HostCells::load(first.wrapping_add(i))) };
            }
            // SAFETY: every word written; a `Pod` is any bytes.
            Some(unsafe { set.assume_init() })
        })
    }
}
