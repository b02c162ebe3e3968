//! What the program counts and keeps, read (and for the fleet and the
//! CLI's resets, written) by the daemon: per-rule counters, events, the drop
//! log's counts and ring, the counters by reason, the tracked sources and
//! their states, the drops per source, the fleet's maps.

use aya::maps::{Map, MapData, RingBuf};
use ratelimit_common::{
    self as common, Counter, EVENT_COUNT, Event, FlowKey, MAP_EVENTS, MAP_STATS, REASON_COUNT,
    Reason, gcra,
};

use super::{DropLogCounts, Maps, count_entries, dup_map, map_err, table};
use crate::error::{Error, Result};

impl Maps {
    /// The counters of the rule in `slot`, summed over CPUs, by
    /// [`common::RuleCounter`].
    pub fn rule_counters(&self, slot: u32) -> Result<[Counter; common::RuleCounter::ALL.len()]> {
        let mut out = [Counter::default(); common::RuleCounter::ALL.len()];
        for (i, c) in common::RuleCounter::ALL.iter().enumerate() {
            let per_cpu = self
                .rule_stats
                .get(&(slot * common::RULE_COUNTERS + *c as u32), 0)
                .map_err(map_err("reading", common::MAP_RULE_STATS))?;
            for v in per_cpu.iter() {
                out[i].packets += v.packets;
                out[i].bytes += v.bytes;
            }
        }
        Ok(out)
    }

    /// Counters of [`Event`]s, summed over CPUs.
    pub fn events(&self) -> Result<[u64; EVENT_COUNT as usize]> {
        let mut out = [0; EVENT_COUNT as usize];
        for e in Event::ALL {
            let per_cpu = self
                .events
                .get(&(e as u32), 0)
                .map_err(map_err("reading", MAP_EVENTS))?;
            out[e as usize] = per_cpu.iter().sum();
        }
        Ok(out)
    }

    /// The drop log's counts, all CPUs together: records written, drops
    /// skipped over the budget, records lost to a full ring.
    pub fn drop_log_counts(&self) -> Result<DropLogCounts> {
        let per_cpu = self
            .drop_log_budget
            .get(&0, 0)
            .map_err(map_err("reading", common::MAP_DROP_LOG_BUDGET))?;
        Ok(DropLogCounts::sum(per_cpu.iter()))
    }

    /// A reader of the drop log's ring buffer, on a descriptor of its own
    /// (the one [`Maps`] holds stays for pinning). One reader per daemon:
    /// what it takes, nobody else sees.
    pub fn drop_log_reader(&self) -> Result<RingBuf<MapData>> {
        let name = common::MAP_DROP_LOG;
        let data = dup_map(self.drop_log.fd(), name)?;
        RingBuf::try_from(Map::RingBuf(data)).map_err(map_err("reading", name))
    }

    /// How many keys have a state now: (gcra's IPv4 and IPv6 maps together, the
    /// wide-state map), counted with batched reads (a few syscalls per million
    /// keys).
    pub fn tracked(&self) -> Result<(usize, usize)> {
        let (v4, v6, wide) = self.tracked_by_map()?;
        Ok((v4 + v6, wide))
    }

    /// Keys with a state: (IPv4 gcra, IPv6 gcra, wide). A gcra key holds
    /// its slot of the table until another key needs it: those counted are
    /// the slots held, idle or not (see [`Maps::table_census`]).
    pub fn tracked_by_map(&self) -> Result<(usize, usize, usize)> {
        let c = self.table_census();
        Ok((c.v4 as usize, c.v6 as usize, self.wide_count()?))
    }

    /// Keys with a wide state, counted with batched reads.
    pub fn wide_count(&self) -> Result<usize> {
        use aya::maps::IterableMap as _;
        count_entries(self.wide.map(), common::MAP_WIDE)
    }

    /// Zeroes every counter (tests).
    pub fn clear_counters(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Io {
            what: "counting CPUs".into(),
            source: e,
        })?;
        for reason in Reason::ALL {
            let zero = aya::maps::PerCpuValues::try_from(vec![Counter::default(); cpus])
                .map_err(Error::io("building per-CPU values"))?;
            self.stats
                .set(reason as u32, zero, 0)
                .map_err(map_err("writing", MAP_STATS))?;
        }
        Ok(())
    }

    /// Counters by reason, summed over CPUs.
    pub fn counters(&self) -> Result<[Counter; REASON_COUNT as usize]> {
        let mut out = [Counter::default(); REASON_COUNT as usize];
        for reason in Reason::ALL {
            let per_cpu = self
                .stats
                .get(&(reason as u32), 0)
                .map_err(map_err("reading", MAP_STATS))?;
            for c in per_cpu.iter() {
                out[reason as usize].packets += c.packets;
                out[reason as usize].bytes += c.bytes;
            }
        }
        Ok(out)
    }

    /// What the state table holds now, in one pass.
    pub fn table_census(&self) -> table::Census {
        self.state_table.census(crate::kernel::monotonic_ns())
    }

    /// Slots in the state table.
    pub fn table_slots(&self) -> u64 {
        self.state_table.slots()
    }

    /// Every slot of the state table that holds a gcra key, with its state.
    pub fn held_states(&self) -> impl Iterator<Item = table::Held> + '_ {
        self.state_table.held()
    }

    /// Drop counts by source address, or by key of a rule's key level.
    /// A key may come twice (two CPUs took a slot for it at once): add them.
    pub fn drops(&self) -> Vec<(common::DropKey, u64)> {
        let seed = self.seed();
        self.drops
            .each(common::top::WAYS)
            .flat_map(|set| common::top::held(&set, seed).collect::<Vec<_>>())
            .collect()
    }

    /// The state of one gcra key, if tracked.
    pub fn state(&self, key: &FlowKey) -> Option<gcra::State> {
        self.source_state(key).map(|s| s.gcra)
    }

    /// The state of one gcra key with when it was created, if tracked.
    pub fn source_state(&self, key: &FlowKey) -> Option<common::SourceState> {
        self.state_table.get(key, self.seed())
    }

    /// Every key of a fleet-wide rule with what it was admitted. A key
    /// counted in two slots at once (never, but for a slot taken while
    /// another CPU took one too) comes once, with the counts of the slot
    /// born first.
    pub fn fleet_used(&self) -> Vec<(FlowKey, common::FleetUsed)> {
        let seed = self.seed();
        let mut keys: std::collections::HashMap<FlowKey, common::FleetUsed> = Default::default();
        for set in self.fleet_used.each(common::fleet_table::WAYS) {
            for (key, used) in common::fleet_table::held(&set, seed) {
                keys.entry(key)
                    .and_modify(|u| {
                        if used.born < u.born {
                            *u = used;
                        }
                    })
                    .or_insert(used);
            }
        }
        keys.into_iter().collect()
    }

    /// The report cursor of every key the daemon accounted for.
    pub fn fleet_cursors(&self) -> Vec<(FlowKey, common::FleetCursor)> {
        self.fleet_reported.iter().filter_map(|e| e.ok()).collect()
    }

    /// Writes report cursors (`Some`) and removes those of keys the program
    /// no longer counts (`None`). A cursor that cannot be written is one
    /// sync of this key that a restarted daemon reports again (at most one
    /// bucket: see the fleet's module): it is logged by the caller's count.
    pub fn write_fleet_cursors(
        &mut self,
        cursors: &[(FlowKey, Option<common::FleetCursor>)],
    ) -> usize {
        let mut failed = 0;
        for (key, cursor) in cursors {
            let ok = match cursor {
                Some(c) => self.fleet_reported.insert(key, c, 0).is_ok(),
                None => {
                    let _ = self.fleet_reported.remove(key);
                    true
                }
            };
            failed += usize::from(!ok);
        }
        failed
    }

    /// Writes the daemon's heartbeat for the program.
    pub fn write_fleet_beat(&mut self, beat: common::FleetBeat) -> Result<()> {
        self.fleet_beat
            .set(0, beat, 0)
            .map_err(map_err("writing", common::MAP_FLEET_BEAT))
    }

    /// Raises the gcra state of `key` (a key of a fleet-wide rule) to a debt
    /// of `debt_ns` now; never lowers it. A key without a state gets one.
    /// Not atomic with the program's compare-and-swap: a frame admitted
    /// between the read and the write is not in the written state (it is
    /// counted, and in the fleet's debt at the next sync).
    pub fn raise(&mut self, key: &FlowKey, params: &gcra::Params, debt_ns: u64) {
        let now = crate::kernel::monotonic_ns();
        let found = self.source_state(key);
        let current = found.map_or(0, |s| gcra::debt_ns(s.gcra.tat, params, now));
        let target = debt_ns;
        if target <= current {
            return;
        }
        // Raised with compare-and-swap, or a slot claimed, as the program
        // does; a key whose lines are full keeps no state here (its frames
        // are judged as a new source's until one frees).
        self.state_table.raise(key, self.seed(), now, |seen| {
            let want = gcra::with_debt(params, now, target);
            match seen {
                Some(s) if gcra::debt_ns(s, params, now) >= target => s,
                _ => want,
            }
        });
    }

    /// The wide state of one key, if tracked.
    pub fn wide_state(&self, key: &FlowKey) -> Option<common::WideState> {
        self.wide.get(key, 0).ok()
    }

    /// Deletes the wide state of `key` (tests).
    pub fn remove_wide_state(&mut self, key: &FlowKey) -> Result<()> {
        self.wide
            .remove(key)
            .map_err(map_err("removing", common::MAP_WIDE))
    }

    /// Frees the slot `held` ([`Maps::held_states`]) if it still holds the
    /// same key with a bucket that reads as full (the idle sweep): one the
    /// program charged since the sweep looked stays. Whether it was freed.
    pub fn free_idle(&self, held: &table::Held) -> bool {
        self.state_table
            .free_idle(held, crate::kernel::monotonic_ns())
    }
}
