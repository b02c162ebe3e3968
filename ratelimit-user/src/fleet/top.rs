//! `ratelimit top --fleet`: the fleet's use of each key of the fleet-wide
//! rules, this minute and the last (on Redis's clock), from the tallies the
//! syncs keep in Redis (one per key group and minute).

use std::collections::HashMap;

use ratelimit_redis::Store;
use serde::{Deserialize, Serialize};

use super::PREFIX;

/// A fleet-wide rule's use of its keys, all daemons together, from Redis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleUse {
    /// The rule: `default` or its selector.
    pub rule: String,
    /// Units admitted this minute, by the keys shown.
    pub this_minute: u64,
    /// Units admitted last minute, by the keys shown.
    pub last_minute: u64,
    /// The keys that admitted the most, this minute and the last together.
    pub keys: Vec<KeyUse>,
}

/// One key's use across the fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyUse {
    /// `ADDRESS/BITS` (its rule is the [`RuleUse`]'s).
    pub key: String,
    /// Units admitted this minute.
    pub this_minute: u64,
    /// Units admitted last minute.
    pub last_minute: u64,
}

/// The fleet's use of each key of `rules` (by name) in this minute and the
/// last, busiest first, at most `n` per rule: what `top --fleet` shows.
pub async fn top(url: &str, rules: &[String], n: usize) -> Result<Vec<RuleUse>, String> {
    let store = Store::connect(url)
        .await
        .map_err(|e| format!("the fleet's Redis {url}: {e}"))?;
    let now = store
        .fleet_tallies(PREFIX, 0)
        .await
        .map_err(|e| e.to_string())?;
    let before = store
        .fleet_tallies(PREFIX, 1)
        .await
        .map_err(|e| e.to_string())?;
    // rule -> key -> (this minute, last minute)
    let mut by: HashMap<&str, HashMap<String, (u64, u64)>> = HashMap::new();
    for (minute, tally) in [(0, now), (1, before)] {
        for (name, units) in tally {
            let Some((rule, key)) = name.split_once('|') else {
                continue;
            };
            let Some(rule) = rules.iter().find(|r| r.as_str() == rule) else {
                continue;
            };
            let e = by
                .entry(rule.as_str())
                .or_default()
                .entry(key.to_string())
                .or_default();
            if minute == 0 {
                e.0 += units;
            } else {
                e.1 += units;
            }
        }
    }
    Ok(rules
        .iter()
        .map(|rule| {
            let mut keys: Vec<(String, (u64, u64))> = by
                .remove(rule.as_str())
                .unwrap_or_default()
                .into_iter()
                .collect();
            keys.sort_by(|a, b| (b.1.0 + b.1.1).cmp(&(a.1.0 + a.1.1)).then(a.0.cmp(&b.0)));
            keys.truncate(n);
            RuleUse {
                rule: rule.clone(),
                this_minute: keys.iter().map(|k| k.1.0).sum(),
                last_minute: keys.iter().map(|k| k.1.1).sum(),
                keys: keys
                    .into_iter()
                    .map(|(key, (this_minute, last_minute))| KeyUse {
                        key,
                        this_minute,
                        last_minute,
                    })
                    .collect(),
            }
        })
        .collect())
}
