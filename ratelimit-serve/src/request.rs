//! What an HTTP request asks, read from its JSON with each error naming its
//! field (`acquire[2].limit.rate`), and resolved against the config (or the
//! open mode) into the key and limit it is counted under. Called by
//! [`super::api`]; the limits of the config file are read with
//! [`limit_from`] too.
//!
//! An acquire names what is limited in one of three forms:
//! - `{"key": "user:42", "limit": {"rate": "100/s", "burst": 20}}`: the
//!   numbers (the open mode; with `--config`, tenants with `inline-limits`);
//! - `{"limit": "per-user", "key": "42"}`: a limit of the config by name,
//!   the key the value of its descriptor's entry without one;
//! - `{"domain": "checkout", "descriptor": [{"key": "user", "value": "42"}]}`:
//!   Envoy's descriptor, found as Envoy's ratelimit service finds it.

use std::time::Duration;

use ratelimit_redis::Limit;
use serde_json::{Map, Value};

use super::policy::{self, FailureMode, Policy, Tenant};
use ratelimit_host::rate::{Unit, parse_rate};

use crate::error::{Error, Result};

/// Longest key, descriptor key or value accepted, bytes.
pub const MAX_KEY: usize = 512;
/// Most entries in a descriptor.
pub(super) const MAX_ENTRIES: usize = 16;
/// Most keys in one acquire request.
pub(super) const MAX_ITEMS: usize = ratelimit_redis::MAX_BATCH;

/// What one acquire names, before it is resolved.
#[derive(Debug)]
pub(super) enum Form {
    /// A key and a limit's numbers.
    Inline { key: String, limit: Limit },
    /// A limit of the config by name, and the value of its open entry.
    Named { name: String, key: Option<String> },
    /// Envoy's domain and descriptor.
    Descriptor {
        domain: String,
        entries: Vec<(String, String)>,
    },
}

/// One key of an acquire.
#[derive(Debug)]
pub(super) struct Item {
    pub form: Form,
    /// Units asked for.
    pub amount: u64,
    /// Whether to hand out a grant (`"grant": false`: the caller never
    /// refills, and Redis keeps no record).
    pub grant: bool,
}

/// What an item is counted under.
#[derive(Debug)]
pub(super) struct Target {
    /// The text inside the Redis key's hash tag.
    pub content: String,
    pub limit: Limit,
    /// The limit's name when it is a shadow limit (decided and counted,
    /// never denied).
    pub shadow: Option<String>,
    /// What a 503 advises, when the config says.
    pub failure_mode: Option<FailureMode>,
    /// Units a hot key takes from Redis at a time (the config's `lease`).
    pub lease: Option<u64>,
}

/// A request that cannot be served as asked: the status (400 or 403), the
/// field and why.
#[derive(Debug)]
pub(super) struct Refusal {
    pub status: u16,
    pub field: String,
    pub message: String,
}

impl Refusal {
    fn bad(e: Error) -> Self {
        let status = e.http_status();
        let (field, message) = match e {
            Error::Invalid { field, message } => (field, message),
            other => (String::new(), other.to_string()),
        };
        Self {
            status,
            field,
            message,
        }
    }

    fn forbidden(field: &str, message: String) -> Self {
        Self {
            status: 403,
            field: field.to_string(),
            message,
        }
    }

    /// The same refusal, its field inside `at` (`acquire[2]`).
    pub(super) fn within(mut self, at: &str) -> Self {
        self.field = if self.field.is_empty() {
            at.to_string()
        } else {
            format!("{at}.{}", self.field)
        };
        self
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Self::bad(e)
    }
}

/// The body as a JSON object.
pub(super) fn parse_body(body: &[u8]) -> Result<Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::invalid("body", "must be a JSON object")),
        Err(e) => Err(Error::invalid("body", format!("not JSON: {e}"))),
    }
}

/// Refuses a key of `m` not in `known`.
pub(super) fn only(m: &Map<String, Value>, path: &str, known: &[&str]) -> Result<()> {
    match m.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(Error::invalid(
            format!("{path}{k}"),
            format!("unknown field; expected {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn text(v: &Value, field: &str, what: &str) -> Result<String> {
    match v {
        Value::String(k) if !k.is_empty() && k.len() <= MAX_KEY => Ok(k.clone()),
        Value::String(_) => Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_KEY} bytes"),
        )),
        _ => Err(Error::invalid(
            field,
            format!("must be a string, like {what}"),
        )),
    }
}

/// `key`: what is limited.
pub(super) fn key_of(m: &Map<String, Value>) -> Result<String> {
    match m.get("key") {
        Some(v) => text(v, "key", "\"user:42\""),
        None => Err(Error::invalid(
            "key",
            "missing; name what is limited, like \"user:42\"",
        )),
    }
}

/// `amount`: at least 1; 1 when left out.
pub(super) fn amount_of(m: &Map<String, Value>) -> Result<u64> {
    match m.get("amount") {
        None => Ok(1),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(n),
            _ => Err(Error::invalid(
                "amount",
                "must be a whole number of at least 1",
            )),
        },
    }
}

/// One acquire's form and amount.
pub(super) fn item_of(m: &Map<String, Value>) -> Result<Item> {
    only(
        m,
        "",
        &["key", "amount", "limit", "domain", "descriptor", "grant"],
    )?;
    let amount = amount_of(m)?;
    let grant = match m.get("grant") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Error::invalid(
                "grant",
                "must be true or false (false: no grant, for a caller that never refills)",
            ));
        }
    };
    if let Some(d) = m.get("descriptor") {
        for k in ["key", "limit"] {
            if m.contains_key(k) {
                return Err(Error::invalid(
                    k,
                    "a descriptor names what is limited: leave key and limit out",
                ));
            }
        }
        let domain = match m.get("domain") {
            Some(v) => text(v, "domain", "\"checkout\"")?,
            None => {
                return Err(Error::invalid(
                    "domain",
                    "missing; a descriptor is looked up in a domain, like \"checkout\"",
                ));
            }
        };
        return Ok(Item {
            form: Form::Descriptor {
                domain,
                entries: entries_of(d)?,
            },
            amount,
            grant,
        });
    }
    if m.contains_key("domain") {
        return Err(Error::invalid(
            "descriptor",
            "missing; a domain comes with a descriptor, like [{\"key\": \"user\", \"value\": \"42\"}]",
        ));
    }
    let form = match m.get("limit") {
        Some(Value::String(name)) => Form::Named {
            name: name.clone(),
            key: m.get("key").map(|v| text(v, "key", "\"42\"")).transpose()?,
        },
        Some(v) => {
            let key = key_of(m)?;
            Form::Inline {
                key,
                limit: limit_of(v)?,
            }
        }
        None => {
            return Err(Error::invalid(
                "limit",
                "missing; name a limit of the config, like \"per-user\", or give its numbers, like {\"rate\": \"100/s\", \"burst\": 20}",
            ));
        }
    };
    Ok(Item {
        form,
        amount,
        grant,
    })
}

fn entries_of(v: &Value) -> Result<Vec<(String, String)>> {
    let Value::Array(a) = v else {
        return Err(Error::invalid(
            "descriptor",
            "must be a list like [{\"key\": \"user\", \"value\": \"42\"}]",
        ));
    };
    if a.is_empty() || a.len() > MAX_ENTRIES {
        return Err(Error::invalid(
            "descriptor",
            format!("must hold 1 to {MAX_ENTRIES} entries"),
        ));
    }
    a.iter()
        .enumerate()
        .map(|(i, e)| {
            let at = format!("descriptor[{i}]");
            let Value::Object(m) = e else {
                return Err(Error::invalid(
                    &at,
                    "must be an object like {\"key\": \"user\", \"value\": \"42\"}",
                ));
            };
            only(m, &format!("{at}."), &["key", "value"])?;
            let get = |k: &str| match m.get(k) {
                Some(v) => text(v, &format!("{at}.{k}"), "\"user\""),
                None => Err(Error::invalid(format!("{at}.{k}"), "missing")),
            };
            Ok((get("key")?, get("value")?))
        })
        .collect()
}

/// What `item` is counted under, for `tenant` (`None`: the open mode, no
/// config); `Ok(None)` when no limit applies (a descriptor no limit
/// matches, as Envoy's service answers).
pub(super) fn resolve(
    item: &Item,
    policy: Option<&Policy>,
    tenant: Option<&Tenant>,
) -> std::result::Result<Option<Target>, Refusal> {
    let (Some(policy), Some(tenant)) = (policy, tenant) else {
        return match &item.form {
            Form::Inline { key, limit } => Ok(Some(Target {
                content: key.clone(),
                limit: *limit,
                shadow: None,
                failure_mode: None,
                lease: None,
            })),
            Form::Named { .. } => Err(Refusal::bad(Error::invalid(
                "limit",
                "names a limit of a config, and this service runs without --config (the open mode): give the limit's numbers, like {\"rate\": \"100/s\", \"burst\": 20}",
            ))),
            Form::Descriptor { .. } => Err(Refusal::bad(Error::invalid(
                "descriptor",
                "is looked up in the limits of a config, and this service runs without --config (the open mode): give a key and the limit's numbers",
            ))),
        };
    };
    match &item.form {
        Form::Inline { key, limit } => {
            if !tenant.inline {
                return Err(Refusal::forbidden(
                    "limit",
                    format!(
                        "tenant {:?} may not name a limit's numbers (inline-limits is off): name one of the config's limits",
                        tenant.name
                    ),
                ));
            }
            Ok(Some(Target {
                content: policy::inline_key(&tenant.name, key),
                limit: *limit,
                shadow: None,
                failure_mode: None,
                lease: None,
            }))
        }
        Form::Named { name, key } => {
            let def = policy.limit_named(tenant, name).map_err(|message| {
                if policy.named.contains_key(name) {
                    Refusal::forbidden("limit", message)
                } else {
                    Refusal::bad(Error::invalid("limit", message))
                }
            })?;
            let open = def.path.iter().filter(|(_, v)| v.is_none()).count();
            let entries: Vec<(String, String)> = match (open, key) {
                (0, None) | (1, Some(_)) => def
                    .path
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.clone().or_else(|| key.clone()).unwrap_or_default(),
                        )
                    })
                    .collect(),
                (0, Some(_)) => {
                    return Err(Refusal::bad(Error::invalid(
                        "key",
                        format!(
                            "limit {name:?} counts one key (its descriptor has every value): leave key out"
                        ),
                    )));
                }
                (1, None) => {
                    return Err(Refusal::bad(Error::invalid(
                        "key",
                        format!(
                            "missing; limit {name:?} counts each value of its descriptor's {:?} apart: name the value",
                            def.path
                                .iter()
                                .find(|(_, v)| v.is_none())
                                .map(|(k, _)| k)
                                .unwrap_or(&String::new())
                        ),
                    )));
                }
                _ => {
                    return Err(Refusal::bad(Error::invalid(
                        "limit",
                        format!(
                            "limit {name:?} has {open} entries without a value: name it by its domain and descriptor"
                        ),
                    )));
                }
            };
            let domain = &policy.domains[&def.domain];
            Ok(Some(Target {
                content: policy::descriptor_key(&def.domain, &entries),
                limit: def.limit,
                shadow: def.shadow.then(|| def.name.clone()),
                failure_mode: domain.failure_mode,
                lease: def.lease,
            }))
        }
        Form::Descriptor { domain, entries } => {
            let d = policy.domain_for(tenant, domain).map_err(|message| {
                if policy.domains.contains_key(domain) {
                    Refusal::forbidden("domain", message)
                } else {
                    Refusal::bad(Error::invalid("domain", message))
                }
            })?;
            Ok(d.find(entries).map(|def| Target {
                content: policy::descriptor_key(domain, entries),
                limit: def.limit,
                shadow: def.shadow.then(|| def.name.clone()),
                failure_mode: d.failure_mode,
                lease: def.lease,
            }))
        }
    }
}

/// A limit from its parts as written: `rate` (`"100/s"`; for windows the
/// period is the window), `burst` (gcra only; one second's worth when left
/// out) and `algorithm` (gcra, fixed-window, sliding-window). Errors name
/// `at.rate`, `at.burst`, `at.algorithm`.
pub(super) fn limit_from(
    at: &str,
    rate_text: &str,
    burst: Option<u64>,
    algorithm: Option<&str>,
) -> Result<Limit> {
    let field = |name: &str| format!("{at}.{name}");
    let rate = parse_rate(&field("rate"), rate_text)?;
    if rate.unit != Unit::Packets {
        return Err(Error::invalid(
            field("rate"),
            "must count requests or units, like \"100/s\", not bytes",
        ));
    }
    let per = Duration::from_nanos(rate.period_ns);
    let param = |e: ratelimit_common::ParamError| {
        let name = match e.param {
            "count" | "per" | "window" | "limit" => field("rate"),
            "burst" => field("burst"),
            _ => at.to_string(),
        };
        Error::invalid(name, e.accepted)
    };
    match algorithm.unwrap_or("gcra") {
        "gcra" => {
            let burst = burst.unwrap_or_else(|| rate.default_burst());
            Limit::gcra(rate.tokens, per, burst).map_err(param)
        }
        algorithm @ ("fixed-window" | "sliding-window") => {
            if burst.is_some() {
                return Err(Error::invalid(
                    field("burst"),
                    "windows have no burst: the rate's count is the window's limit",
                ));
            }
            // The window is the period as written ("30/min": 30 per minute),
            // not the reduced fraction ("1/2s"), and its count is whole.
            let (window_ns, limit) = ratelimit_host::rate::parse_window(&field("rate"), rate_text)?;
            let window = Duration::from_nanos(window_ns);
            if algorithm == "fixed-window" {
                Limit::fixed_window(window, limit).map_err(param)
            } else {
                Limit::sliding_window(window, limit).map_err(param)
            }
        }
        _ => Err(Error::invalid(
            field("algorithm"),
            "must be gcra, fixed-window or sliding-window",
        )),
    }
}

/// `limit`: `{"rate": "100/s", "burst": 20, "algorithm": "gcra"}`; for windows,
/// the rate's period is the window (`"100/min"` with `"fixed-window"`).
pub fn limit_of(v: &Value) -> Result<Limit> {
    let Value::Object(m) = v else {
        return Err(Error::invalid(
            "limit",
            "must be an object like {\"rate\": \"100/s\", \"burst\": 20}",
        ));
    };
    only(m, "limit.", &["rate", "burst", "algorithm"])?;
    let rate = match m.get("rate") {
        Some(Value::String(s)) => s,
        _ => {
            return Err(Error::invalid(
                "limit.rate",
                "missing or not a string; write a count per period like \"100/s\" or \"30/min\"",
            ));
        }
    };
    let algorithm = match m.get("algorithm") {
        None => None,
        Some(Value::String(a)) => Some(a.as_str()),
        Some(_) => return Err(Error::invalid("limit.algorithm", "must be a string")),
    };
    let burst = match m.get("burst") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(b) => Some(b),
            None => {
                return Err(Error::invalid(
                    "limit.burst",
                    "must be a whole number, like 20",
                ));
            }
        },
    };
    limit_from("limit", rate, burst, algorithm)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field(v: Value) -> String {
        match limit_of(&v) {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{v}: {other:?}"),
        }
    }

    #[test]
    fn limits_parse_and_bad_ones_name_their_field() {
        assert_eq!(
            limit_of(&json!({"rate": "100/s", "burst": 20})).unwrap(),
            // The same rate, reduced.
            Limit::gcra(1, Duration::from_millis(10), 20).unwrap()
        );
        assert_eq!(
            limit_of(&json!({"rate": "10k/hour", "algorithm": "fixed-window"})).unwrap(),
            Limit::fixed_window(Duration::from_secs(3600), 10_000).unwrap()
        );
        assert_eq!(
            limit_of(&json!({"rate": "30/min", "algorithm": "sliding-window"})).unwrap(),
            Limit::sliding_window(Duration::from_secs(60), 30).unwrap()
        );
        assert_eq!(field(json!({"rate": "fast"})), "limit.rate");
        assert_eq!(field(json!({"rate": "1Mbit/s"})), "limit.rate");
        assert_eq!(field(json!({"rate": "10/s", "burst": -1})), "limit.burst");
        assert_eq!(field(json!({"rate": "10/s", "burst": 0})), "limit.burst");
        assert_eq!(
            field(json!({"rate": "10/s", "algorithm": "magic"})),
            "limit.algorithm"
        );
        assert_eq!(field(json!({"rate": "10/s", "brust": 3})), "limit.brust");
        assert_eq!(field(json!("10/s")), "limit");
    }

    #[test]
    fn forms_are_told_apart() {
        let item = |v: Value| item_of(v.as_object().unwrap());
        assert!(matches!(
            item(json!({"key": "k", "limit": {"rate": "1/s"}}))
                .unwrap()
                .form,
            Form::Inline { .. }
        ));
        assert!(matches!(
            item(json!({"limit": "per-user", "key": "42", "amount": 3})).unwrap(),
            Item {
                form: Form::Named { .. },
                amount: 3,
                grant: true
            }
        ));
        let d =
            item(json!({"domain": "d", "descriptor": [{"key": "user", "value": "42"}]})).unwrap();
        assert!(matches!(d.form, Form::Descriptor { ref entries, .. } if entries.len() == 1));
        let field = |v: Value| match item(v) {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(json!({"key": "a"})), "limit");
        assert_eq!(field(json!({"domain": "d"})), "descriptor");
        assert_eq!(field(json!({"descriptor": []})), "domain");
        assert_eq!(
            field(json!({"domain": "d", "descriptor": []})),
            "descriptor"
        );
        assert_eq!(
            field(json!({"domain": "d", "descriptor": [{"key": "u"}]})),
            "descriptor[0].value"
        );
        assert_eq!(
            field(json!({"domain": "d", "descriptor": [{"key": "u", "value": "1"}], "key": "x"})),
            "key"
        );
    }
}
