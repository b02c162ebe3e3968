//! The drop log's daemon side: a task reads the program's ring buffer as
//! records arrive ([`spawn_reader`]) into a buffer of the last [`KEPT`]
//! ([`LogBuffer`]), each with a sequence number and its wall time; `ratelimit
//! log` asks the loop for the entries after a cursor, and the loop names each
//! record's rule and reason ([`entry_of`]) with the rules it enforces.
//!
//! Enters: [`DropRecord`]s from the kernel. Leaves: [`DropEntry`]s. The loop
//! calls [`LogBuffer::after`] and [`entry_of`]; the reader is spawned once
//! the daemon serves.

use std::{
    collections::{BTreeMap, VecDeque},
    net::{IpAddr, Ipv6Addr},
    sync::{Arc, Mutex},
};

use aya::maps::{MapData, RingBuf};
use ratelimit_common::{DropRecord, NO_RULE, Reason, drop_log_flags};
use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::{
    model::describe::rfc3339_ms, model::matching::proto_name, protocol::answer::DropEntry,
};

/// Entries the daemon keeps: the last this many (about 100 bytes each).
pub const KEPT: usize = 4096;

/// A record as it came, with its place in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Its sequence number, from 0 in this daemon's life.
    pub seq: u64,
    /// When it was dropped, Unix ms.
    pub wall_ms: u64,
    /// The record.
    pub record: DropRecord,
}

/// The last [`KEPT`] records, oldest first.
#[derive(Debug, Default)]
pub struct LogBuffer {
    entries: VecDeque<Logged>,
    next_seq: u64,
}

/// The buffer the reader fills and the loop reads.
pub type SharedLog = Arc<Mutex<LogBuffer>>;

/// What [`LogBuffer::after`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    /// The entries, oldest first.
    pub entries: Vec<Logged>,
    /// The cursor for the next request.
    pub next: u64,
    /// Entries after the cursor that are no longer kept.
    pub missed: u64,
}

impl LogBuffer {
    /// Adds a record dropped at `wall_ms`; the oldest goes past [`KEPT`].
    pub fn push(&mut self, wall_ms: u64, record: DropRecord) {
        if self.entries.len() == KEPT {
            self.entries.pop_front();
        }
        self.entries.push_back(Logged {
            seq: self.next_seq,
            wall_ms,
            record,
        });
        self.next_seq += 1;
    }

    /// Up to `n` entries from sequence number `after` on (the oldest of
    /// them first); without a cursor, the last `n`.
    pub fn after(&self, after: Option<u64>, n: usize) -> Found {
        let first_kept = self.next_seq - self.entries.len() as u64;
        let (from, missed) = match after {
            None => (self.next_seq.saturating_sub(n as u64).max(first_kept), 0),
            Some(c) => (c.max(first_kept), first_kept.saturating_sub(c)),
        };
        let start = (from - first_kept) as usize;
        let entries: Vec<Logged> = self.entries.iter().skip(start).take(n).copied().collect();
        let next = entries
            .last()
            .map_or(from.min(self.next_seq), |l| l.seq + 1);
        Found {
            entries,
            next,
            missed,
        }
    }
}

/// A rule's name by its slot (see [`ratelimit_common::Rule::slot`]), with its
/// id: a record whose id differs was judged by a rule removed since.
pub type RuleNames = BTreeMap<u32, (u32, String)>;

/// The entry `l` shows, its rule named by `names`.
pub fn entry_of(l: &Logged, names: &RuleNames) -> DropEntry {
    let r = &l.record;
    let reason = Reason::ALL
        .get(usize::from(r.reason))
        .map_or_else(|| format!("reason {}", r.reason), |x| x.name().to_string());
    let rule = if r.rule_slot == NO_RULE {
        // The rule-table entries without counters are the shared list
        // policies (a list of a daemon that kept none of its own) and the
        // unjudged-frame policies'.
        match Reason::ALL.get(usize::from(r.reason)) {
            Some(Reason::Denied) => "list".to_string(),
            _ => "-".to_string(),
        }
    } else {
        match names.get(&r.rule_slot) {
            Some((id, name)) if *id == r.rule_id => name.clone(),
            _ => "(removed rule)".to_string(),
        }
    };
    let source = (r.family != 0).then(|| {
        // An IPv4-mapped IPv6 source is judged as IPv4: shown so.
        let a = Ipv6Addr::from(r.source_addr());
        a.to_ipv4_mapped()
            .map_or(IpAddr::V6(a), IpAddr::V4)
            .to_string()
    });
    let has = |f: u8| r.flags & f != 0;
    DropEntry {
        seq: l.seq,
        time: rfc3339_ms(l.wall_ms),
        time_ms: l.wall_ms,
        source,
        rule,
        reason,
        dry_run: has(drop_log_flags::DRY_RUN),
        proto: has(drop_log_flags::PROTO)
            .then(|| proto_name(r.proto).trim_start_matches("proto ").to_string()),
        dport: has(drop_log_flags::PORT).then_some(r.dport),
        len: r.len,
    }
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC, ns: what turns the program's time into
/// wall time.
fn wall_offset_ns() -> i128 {
    let read = |clock| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(clock, &mut t) };
        i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_MONOTONIC)
}

/// Reads `ring` as records arrive into `log`, for the daemon's life.
pub fn spawn_reader(ring: RingBuf<MapData>, log: SharedLog) {
    // SAFETY: the fd is the ring buffer's map, owned by the `RingBuf`, which
    // the AsyncFd owns for as long as it is registered.
    let mut fd = match unsafe {
        AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
    } {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "cannot poll the drop log's ring buffer: `ratelimit log` will stay empty");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.readable_mut().await else {
                return;
            };
            let offset = wall_offset_ns();
            let ring = guard.get_inner_mut();
            let mut batch = Vec::new();
            while let Some(item) = ring.next() {
                if let Some(r) = DropRecord::decode(&item) {
                    batch.push(r);
                }
            }
            if !batch.is_empty() {
                let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                for r in batch {
                    let wall = (i128::from(r.time_ns) + offset).max(0) / 1_000_000;
                    log.push(wall as u64, r);
                }
            }
            guard.clear_ready();
        }
    });
}

#[cfg(test)]
mod tests {
    use ratelimit_common::{family, map_v4, words};

    use super::*;

    fn record(i: u32) -> DropRecord {
        DropRecord {
            time_ns: u64::from(i),
            len: i,
            ..DropRecord::default()
        }
    }

    #[test]
    fn keeps_the_last_and_says_what_was_missed() {
        let mut b = LogBuffer::default();
        assert_eq!(
            b.after(None, 10),
            Found {
                entries: vec![],
                next: 0,
                missed: 0
            }
        );
        for i in 0..(KEPT as u32 + 10) {
            b.push(1000, record(i));
        }
        // The last 3.
        let f = b.after(None, 3);
        assert_eq!(
            f.entries.iter().map(|l| l.seq).collect::<Vec<_>>(),
            [KEPT as u64 + 7, KEPT as u64 + 8, KEPT as u64 + 9]
        );
        assert_eq!((f.next, f.missed), (KEPT as u64 + 10, 0));
        // From a cursor the buffer has gone past: the oldest kept, and the
        // count of those gone.
        let f = b.after(Some(4), 2);
        assert_eq!(f.entries[0].seq, 10);
        assert_eq!((f.next, f.missed), (12, 6));
        // A cursor at the end: nothing new, the same cursor.
        let f = b.after(Some(KEPT as u64 + 10), 5);
        assert!(f.entries.is_empty());
        assert_eq!((f.next, f.missed), (KEPT as u64 + 10, 0));
        b.push(1000, record(0));
        assert_eq!(b.after(Some(f.next), 5).entries.len(), 1);
    }

    #[test]
    fn names_rule_reason_source_and_transport() {
        let names: RuleNames = [
            (0, (0, "default".to_string())),
            (2, (7, "198.18.0.0/24 udp dport 53".to_string())),
        ]
        .into();
        let l = Logged {
            seq: 5,
            wall_ms: 1_700_000_000_123,
            record: DropRecord {
                time_ns: 1,
                source: words(&map_v4([198, 18, 0, 9])),
                rule_id: 7,
                rule_slot: 2,
                len: 60,
                dport: 53,
                proto: 17,
                reason: Reason::Limited as u8,
                family: family::V4,
                flags: drop_log_flags::PROTO | drop_log_flags::PORT,
                _pad: [0; 6],
            },
        };
        let e = entry_of(&l, &names);
        assert_eq!(e.source.as_deref(), Some("198.18.0.9"));
        assert_eq!(e.rule, "198.18.0.0/24 udp dport 53");
        assert_eq!(e.reason, "limited");
        assert_eq!(e.proto.as_deref(), Some("udp"));
        assert_eq!(e.dport, Some(53));
        assert_eq!(e.time, "2023-11-14T22:13:20.123Z");
        assert!(!e.dry_run);

        // A rule gone since (its slot given to another), a would-drop, no
        // port, another protocol, IPv6.
        let mut r = l.record;
        r.rule_id = 3;
        r.flags = drop_log_flags::PROTO | drop_log_flags::DRY_RUN;
        r.proto = 47;
        r.family = family::V6;
        r.source = words(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        let e = entry_of(&Logged { record: r, ..l }, &names);
        assert_eq!(e.rule, "(removed rule)");
        assert!(e.dry_run);
        assert_eq!(e.proto.as_deref(), Some("47"));
        assert_eq!(e.dport, None);
        assert_eq!(e.source.as_deref(), Some("2001:db8::1"));

        // A list's entry; a frame without a header to read.
        r.rule_slot = NO_RULE;
        r.reason = Reason::Denied as u8;
        assert_eq!(entry_of(&Logged { record: r, ..l }, &names).rule, "list");
        r.reason = Reason::Malformed as u8;
        r.family = 0;
        r.flags = 0;
        let e = entry_of(&Logged { record: r, ..l }, &names);
        assert_eq!((e.rule.as_str(), e.source, e.proto), ("-", None, None));
        assert_eq!(e.reason, "malformed");
    }
}
