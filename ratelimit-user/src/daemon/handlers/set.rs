//! `ratelimit set`: a limit on the default rule or a selector's rule. What
//! was given ([`LimitPatch`]) is laid over the limit the rule has, and the
//! whole is validated as a config's limit is; its errors name the options
//! the user typed ([`flags`]).

use super::until;
use crate::{
    config::{RawBurst, RawLevel, RawLimit},
    daemon::Daemon,
    error::{Error, Result},
    model::{
        rate::Unit,
        rules::{Action, Algo},
    },
    protocol::{
        LimitPatch, SetTarget,
        answer::Changed,
        flags::{self, SET},
    },
};

impl Daemon {
    /// Sets a limit on `target`: what was given changes, the rest of its
    /// limit stays.
    pub(super) fn set(
        &mut self,
        target: SetTarget,
        given: &LimitPatch,
        for_ms: Option<u64>,
        force: bool,
    ) -> Result<Changed> {
        let until = until(for_ms)?;
        let set = self.rules.effective();
        match target {
            SetTarget::Default => {
                if until.is_some() {
                    return Err(Error::invalid(
                        "--for",
                        "the default rule is set for good; a temporary limit needs a CIDR, e.g. `ratelimit set 0.0.0.0/0 --rate 100/s --for 10m`",
                    ));
                }
                let action = validated(Some(&set.default), given, None)?;
                check_byte_bursts(&action, Some(&set.default), force)?;
                self.change(|r| {
                    r.live.default = Some(action);
                    Ok(())
                })
            }
            SetTarget::Rule(selector) => {
                // A change for good builds on the rule that lasts, not on a
                // temporary one (which it ends).
                let current = match until {
                    Some(_) => set.rules.get(&selector).copied(),
                    None => self.rules.lasting(&selector),
                };
                let family_v4 = Some(selector.source.addr.is_ipv4());
                let action = validated(current.as_ref(), given, family_v4)?;
                check_byte_bursts(&action, current.as_ref(), force)?;
                self.change(|r| {
                    r.set_live(selector, Some(action), until);
                    Ok(())
                })
            }
        }
    }
}

/// The limit `given` makes of `current`, validated for a rule of `family_v4`
/// (`None`: the default rule), its errors naming `set`'s options.
fn validated(
    current: Option<&Action>,
    given: &LimitPatch,
    family_v4: Option<bool>,
) -> Result<Action> {
    merged(current, raw(given))
        .validate(SET, family_v4)
        .map_err(flags::flagged)
}

/// What was given in the config's form, for the config's validation: rates
/// and durations in exact forms that read back the same.
fn raw(given: &LimitPatch) -> RawLimit {
    let ns = |v: Option<u64>| v.map(|ns| format!("{ns}ns"));
    let text = |b: &Option<String>| b.clone().map(RawBurst::Text);
    RawLimit {
        action: Some("limit".into()),
        rate: given.rate.map(|r| r.exact()),
        burst: text(&given.burst),
        per_v4: None,
        per_v6: None,
        per: given.per,
        dry_run: given.dry_run,
        algorithm: given.algorithm.clone(),
        limit: given.limit,
        window: ns(given.window_ns),
        refill_every: ns(given.refill_every_ns),
        refill_amount: given.refill_amount,
        capacity: given.capacity,
        quota: given.quota,
        period: ns(given.period_ns),
        rate_cap: given.rate_cap,
        new_sources: given.new_sources.map(|n| n.text()),
        new_sources_burst: text(&given.new_sources_burst),
        aggregate: given.aggregate.map(|r| r.exact()),
        aggregate_burst: text(&given.aggregate_burst),
        aggregate_reserve: text(&given.aggregate_reserve),
        fleet: given.fleet,
        host_connections: given.host_connections,
        levels: given.levels.as_ref().map(|levels| {
            levels
                .iter()
                .map(|l| RawLevel {
                    rate: l.rate.exact(),
                    burst: text(&l.burst),
                    per: Some(l.per),
                    per_v4: None,
                    per_v6: None,
                })
                .collect()
        }),
    }
}

/// What `set` makes of a rule that is already a limit: what was given
/// changes, the rest stays. A burst that was one second's worth of the old
/// rate follows a new rate; a new algorithm takes none of the old one's
/// parameters; a new `--per` replaces both families' key prefixes.
fn merged(current: Option<&Action>, given: RawLimit) -> RawLimit {
    let Some(Action::Limit(l)) = current else {
        return given;
    };
    let mut base = RawLimit::from(&Action::Limit(*l));
    if given
        .algorithm
        .as_deref()
        .is_some_and(|a| a != l.algo.name())
    {
        base.rate = None;
        base.burst = None;
        base.limit = None;
        base.window = None;
        base.refill_every = None;
        base.refill_amount = None;
        base.capacity = None;
        base.quota = None;
        base.period = None;
        base.rate_cap = None;
        base.levels = None;
    }
    if given.rate.is_some() && l.burst == l.rate.default_burst() {
        base.burst = None;
    }
    if given.aggregate.is_some()
        && l.aggregate
            .is_some_and(|a| a.burst == a.rate.default_burst())
    {
        base.aggregate_burst = None;
    }
    if given.new_sources.is_some() {
        base.new_sources_burst = None;
    }
    if given.per.is_some() || given.per_v4.is_some() || given.per_v6.is_some() {
        base.per_v4 = None;
        base.per_v6 = None;
    }
    // Every field named (the destructuring has no `..`): one the config
    // grows is merged here or the build fails.
    macro_rules! given_wins {
        ($($field:ident),* $(,)?) => {
            let RawLimit { $($field),* } = given;
            $(
                if $field.is_some() {
                    base.$field = $field;
                }
            )*
        };
    }
    given_wins!(
        action,
        rate,
        burst,
        per_v4,
        per_v6,
        per,
        dry_run,
        algorithm,
        limit,
        window,
        refill_every,
        refill_amount,
        capacity,
        quota,
        period,
        rate_cap,
        new_sources,
        new_sources_burst,
        aggregate,
        aggregate_burst,
        aggregate_reserve,
        fleet,
        host_connections,
        levels
    );
    base
}

/// The smallest byte burst that admits a full-size Ethernet frame (1500
/// bytes of IP and a 14-byte header).
const FULL_FRAME: u64 = 1514;

/// The byte buckets of a limit too small for a full-size frame: (the flag
/// that sets it, its burst).
fn small_byte_bursts(a: Option<&Action>) -> Vec<(String, u64)> {
    let Some(Action::Limit(l)) = a else {
        return Vec::new();
    };
    let bytes = |u: Unit| u == Unit::Bytes;
    let mut small = Vec::new();
    if bytes(l.rate.unit) && l.algo == Algo::Gcra && l.burst < FULL_FRAME {
        small.push(("--burst".to_string(), l.burst));
    }
    // The rule's own level is the first --burst; its key levels the next.
    for (i, k) in l.levels.iter().flatten().enumerate() {
        if bytes(k.bucket.rate.unit) && k.bucket.burst < FULL_FRAME {
            small.push((flags::nth("--burst", i + 1), k.bucket.burst));
        }
    }
    if let Some(agg) = &l.aggregate
        && bytes(agg.rate.unit)
        && agg.burst < FULL_FRAME
    {
        small.push(("--aggregate-burst".to_string(), agg.burst));
    }
    small
}

/// Refuses a byte bucket too small for a full-size frame (such frames would
/// never pass), unless `force`, or it was so already (taken with `--force`
/// before: a change of something else does not ask again).
fn check_byte_bursts(a: &Action, previous: Option<&Action>, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let before = small_byte_bursts(previous);
    let small: Vec<_> = small_byte_bursts(Some(a))
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    match small.first() {
        None => Ok(()),
        Some((flag, burst)) => Err(Error::invalid(
            flag,
            format!(
                "{burst} bytes is less than one full-size Ethernet frame ({FULL_FRAME} bytes): such frames would never pass; give at least {FULL_FRAME} (leave --burst out for one second's worth), or add --force to take it as it is"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::rate::parse_rate,
        protocol::{LevelPatch, NewSourcesGiven},
    };

    fn limit(given: &LimitPatch, on: Option<&Action>) -> Result<Action> {
        validated(on, given, Some(true))
    }

    #[test]
    fn what_is_given_changes_and_the_rest_stays() {
        let first = LimitPatch {
            rate: Some(parse_rate("--rate", "100/s").unwrap()),
            burst: Some("500".into()),
            per: Some(24),
            new_sources: Some(NewSourcesGiven::Unlimited),
            ..Default::default()
        };
        let a = limit(&first, None).unwrap();
        let dry = LimitPatch {
            dry_run: Some(true),
            ..Default::default()
        };
        let Action::Limit(b) = limit(&dry, Some(&a)).unwrap() else {
            panic!("a limit")
        };
        let Action::Limit(a) = a else {
            panic!("a limit")
        };
        assert_eq!((b.rate, b.burst, b.per_v4), (a.rate, 500, 24));
        assert_eq!(b.new_sources, a.new_sources);
        assert!(b.dry_run && !a.dry_run);
    }

    #[test]
    fn a_burst_of_one_seconds_worth_follows_a_new_rate() {
        let at = |rate: &str| LimitPatch {
            rate: Some(parse_rate("--rate", rate).unwrap()),
            ..Default::default()
        };
        let a = limit(&at("100/s"), None).unwrap();
        let Action::Limit(b) = limit(&at("300/s"), Some(&a)).unwrap() else {
            panic!("a limit")
        };
        assert_eq!(b.burst, 300);
    }

    #[test]
    fn a_new_algorithm_takes_none_of_the_old_ones_parameters() {
        let gcra = limit(
            &LimitPatch {
                rate: Some(parse_rate("--rate", "100/s").unwrap()),
                ..Default::default()
            },
            None,
        )
        .unwrap();
        let window = LimitPatch {
            algorithm: Some("fixed-window".into()),
            limit: Some(10),
            window_ns: Some(60_000_000_000),
            ..Default::default()
        };
        let Action::Limit(l) = limit(&window, Some(&gcra)).unwrap() else {
            panic!("a limit")
        };
        assert_eq!(
            l.algo,
            Algo::FixedWindow {
                window_ns: 60_000_000_000,
                limit: 10
            }
        );
    }

    #[test]
    fn errors_name_the_options_typed() {
        let field = |given: &LimitPatch| match limit(given, None) {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let rate = |r: &str| Some(parse_rate("--rate", r).unwrap());
        assert_eq!(
            field(&LimitPatch {
                rate: rate("100/s"),
                per: Some(33),
                ..Default::default()
            }),
            "--per"
        );
        assert_eq!(
            field(&LimitPatch {
                rate: rate("100/s"),
                levels: Some(vec![LevelPatch {
                    rate: parse_rate("--rate", "1000/s").unwrap(),
                    burst: None,
                    per: 33,
                }]),
                ..Default::default()
            }),
            "--per (the second one)"
        );
        assert_eq!(
            field(&LimitPatch {
                rate: rate("100/s"),
                window_ns: Some(1_000_000_000),
                ..Default::default()
            }),
            "--window"
        );
        assert_eq!(
            field(&LimitPatch {
                rate: rate("100/s"),
                burst: Some("64KB".into()),
                ..Default::default()
            }),
            "--burst"
        );
    }
}
