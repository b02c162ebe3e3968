//! The daemon's answers, one struct per answer: built by the daemon's
//! handlers and by its read-only path (a program read from its pins with no
//! daemon, [`crate::daemon::offline`]), read by the CLI's printers and printed
//! as they are by `--json`.
//!
//! - [`rules`]: `list` ([`Rules`]) and the rules within every change;
//! - [`changes`]: what a change changed ([`Changed`], [`ListLoaded`]);
//! - [`status`]: `status` ([`Status`]);
//! - [`explain`]: `explain` ([`Explained`]) and `get` ([`States`]);
//! - [`stats`]: `stats` ([`Stats`]);
//! - [`droplog`]: `log` ([`DropLog`]);
//! - [`top`]: `top` ([`Top`]), its readings ([`Drops`]), and the fleet's
//!   ([`FleetRules`], [`FleetTop`]).
//!
//! `--json` prints an answer's fields sorted by name, as a JSON object's.

pub mod changes;
pub mod droplog;
pub mod explain;
pub mod rules;
pub mod stats;
pub mod status;
pub mod top;

use serde::{Deserialize, Serialize};

pub use changes::{Change, Changed, ListChange, ListLoaded, Loaded, ModeChange};
pub use droplog::{DropEntry, DropLog, DropLogStatus};
pub use explain::{Beaten, Explained, JudgeKind, Judged, KeyState, States};
pub use rules::{ActionView, DefaultView, ListView, RuleView, Rules};
pub use stats::{ReasonCount, Stats};
pub use status::{Interface, Running, Status, TableStatus};
pub use top::{Drops, FleetRules, FleetTop, Top, TopRow};

/// Marks an answer read from a program's pins with no daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offline {
    /// Always false: no daemon answered.
    pub daemon: bool,
    /// `kernel` when the rules are the kernel's (the saved record is missing
    /// or differs): where each came from, when each ends, is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_from: Option<RulesFrom>,
}

/// Where rules read with no daemon came from, when not the saved record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RulesFrom {
    /// The kernel's maps.
    Kernel,
}

/// Any answer, as a handler returns it: each request has one of these (see
/// [`crate::protocol::Request`]), and the CLI reads the answer of the request
/// it sent.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// `list`.
    Rules(Box<Rules>),
    /// A change, a reload.
    Changed(Box<Changed>),
    /// `deny --from`, `allow --from`.
    ListLoaded(Box<ListLoaded>),
    /// `status`.
    Status(Box<Status>),
    /// `stats`.
    Stats(Box<Stats>),
    /// A reading of the drop counters.
    Drops(Box<Drops>),
    /// `top`.
    Top(Box<Top>),
    /// The fleet-wide rules.
    FleetRules(Box<FleetRules>),
    /// `top --fleet`.
    FleetTop(Box<FleetTop>),
    /// `explain`.
    Explained(Box<Explained>),
    /// `get`.
    States(Box<States>),
    /// `log`.
    DropLog(Box<DropLog>),
}

/// Each answer type into [`Answer`] and back: `try_from` gives the answer
/// back when it is another one.
macro_rules! answers {
    ($($variant:ident),*) => {$(
        impl From<$variant> for Answer {
            fn from(a: $variant) -> Self {
                Answer::$variant(Box::new(a))
            }
        }

        impl TryFrom<Answer> for $variant {
            type Error = Answer;

            fn try_from(a: Answer) -> Result<Self, Answer> {
                match a {
                    Answer::$variant(a) => Ok(*a),
                    other => Err(other),
                }
            }
        }
    )*};
}

answers!(
    Rules, Changed, ListLoaded, Status, Stats, Drops, Top, FleetRules, FleetTop, Explained, States,
    DropLog
);

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;

    use super::*;
    use crate::model::{
        lists::ListAction,
        matching::Selector,
        rules::{Action, Mode, RuleSet},
    };

    /// Through the wire as the daemon writes it and the CLI reads it.
    fn round_trip<A: Serialize + DeserializeOwned + Into<Answer> + Clone>(a: &A) -> A {
        let line = serde_json::to_string(&crate::protocol::Response::ok(&a.clone().into()))
            .expect("serializes");
        let response: crate::protocol::Response = serde_json::from_str(&line).expect("reads");
        response
            .into_answer()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    fn rules(offline: Option<Offline>) -> Rules {
        let set = RuleSet::default();
        Rules {
            default: DefaultView {
                action: ActionView::of(&set.default, None),
                counters: Some([("passed".to_string(), rules::Count::default())].into()),
            },
            dry_run: false,
            mode: Mode::Normal,
            unjudged: set.unjudged,
            fragments: set.fragments,
            malformed: set.malformed,
            clock: "precise".into(),
            new_states: set.new_states.to_string(),
            rules: Vec::new(),
            lists: Vec::new(),
            live_changes: 0,
            pins: offline.map(|_| "/sys/fs/bpf/ratelimit".into()),
            offline,
        }
    }

    #[test]
    fn every_change_reads_back_as_itself() {
        let s = Selector::parse("CIDR", "198.18.0.0/15 tcp syn").unwrap();
        let deny = RuleView::of(&s, &Action::Deny { dry_run: false }, Some(60_000), 0);
        let list = ListChange {
            action: ListAction::Allow,
            entries: 3,
            source: "stdin".into(),
            expires_at: None,
            expires_in_s: None,
        };
        let changed = Changed {
            rules: rules(None),
            changes: vec![
                Change::default_rule(
                    ActionView::of(&RuleSet::default().default, None),
                    ActionView::of(&Action::Allow, None),
                ),
                Change::Mode {
                    mode: ModeChange {
                        before: Mode::Normal,
                        after: Mode::AllowlistOnly,
                    },
                },
                Change::Rule {
                    cidr: s.to_string(),
                    before: None,
                    after: Some(Box::new(deny.clone())),
                },
                Change::Rule {
                    cidr: s.to_string(),
                    before: Some(Box::new(deny)),
                    after: None,
                },
                Change::List {
                    list: "bans".into(),
                    before: Some(list.clone()),
                    after: Some(list),
                },
            ],
        };
        assert_eq!(round_trip(&changed), changed);
    }

    #[test]
    fn an_answer_from_the_pins_keeps_its_marks() {
        let offline = Some(Offline {
            daemon: false,
            rules_from: Some(RulesFrom::Kernel),
        });
        for r in [rules(None), rules(offline)] {
            let back = round_trip(&r);
            assert_eq!(back, r);
            let written = serde_json::to_value(&back).unwrap();
            let object = written.as_object().expect("an object");
            assert_eq!(
                object.contains_key("daemon"),
                r.offline.is_some(),
                "{written}"
            );
        }
    }

    #[test]
    fn a_status_reads_back_with_or_without_a_daemon() {
        let running = Running {
            attach: crate::kernel::Attached::Generic,
            adopted: true,
            took_over_link: false,
            uptime_s: 10,
            clock: crate::model::rules::Clock::Coarse,
            list_entries: 4,
            list_capacity: 100,
            state_map_full: false,
            state_table: Default::default(),
            states_created: 7,
            new_states_capped: 0,
            evicted_estimate: 1,
            doorkeeper_slots: 1024,
            keep_attached: false,
            fleet: Some(crate::fleet::Status {
                redis: "redis://127.0.0.1:6379".into(),
                redis_up: true,
                fallback: Some(crate::fleet::Fallback::Share),
                redis_ms: 0.5,
                ..Default::default()
            }),
            crowdsec: Some(crate::crowdsec::Status {
                lapi: "http://127.0.0.1:8080".into(),
                lapi_up: true,
                decisions: 2,
                origins: vec![crate::crowdsec::OriginStatus {
                    origin: "cscli".into(),
                    list: "crowdsec:cscli".into(),
                    entries: 2,
                    dropped_packets: 5,
                    dropped_bytes: 500,
                }],
                ..Default::default()
            }),
            drop_log: DropLogStatus {
                rate: "100/s".into(),
                written: 10,
                skipped: 990,
                lost: 0,
            },
            drift_repaired: 3,
        };
        let status = |daemon: Option<Running>, offline: Option<Offline>| Status {
            iface: "eth0".into(),
            netns: 4026531840,
            netns_cookie: 1,
            interface: Interface::NotAttached,
            pid: daemon.as_ref().map(|_| 42),
            tracked_sources: 3,
            ipv4_sources: 2,
            ipv4_capacity: 10,
            ipv6_sources: 1,
            ipv6_capacity: 10,
            wide_sources: 0,
            wide_capacity: 10,
            rules_capacity: 10,
            rules: 1,
            lists: 1,
            dry_run: false,
            mode: crate::model::rules::Mode::AllowlistOnly,
            pins: "/sys/fs/bpf/ratelimit".into(),
            notes: vec!["a note".into()],
            orphaned_pins: vec![crate::kernel::pins::Orphan {
                dir: "/sys/fs/bpf/ratelimit/v8/ns4096".into(),
                layout: "v8".into(),
                bytes: 92_274_688,
            }],
            daemon,
            offline,
        };
        let up = status(Some(running), None);
        assert_eq!(round_trip(&up), up);
        let pins = status(
            None,
            Some(Offline {
                daemon: false,
                rules_from: None,
            }),
        );
        assert_eq!(round_trip(&pins), pins);
        // What a status read from the pins always said, with the mode and
        // the orphaned pins, and nothing more.
        let written = serde_json::to_value(&pins).unwrap();
        let keys: Vec<&str> = written
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "daemon",
                "dry_run",
                "iface",
                "interface",
                "ipv4_capacity",
                "ipv4_sources",
                "ipv6_capacity",
                "ipv6_sources",
                "lists",
                "mode",
                "netns",
                "netns_cookie",
                "notes",
                "orphaned_pins",
                "pid",
                "pins",
                "rules",
                "rules_capacity",
                "tracked_sources",
                "wide_capacity",
                "wide_sources"
            ]
        );
    }
}
