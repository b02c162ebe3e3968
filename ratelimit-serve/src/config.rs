//! `ratelimit serve --config FILE`: the TOML file of tenants, domains and
//! limits, read into a [`Policy`] with every error at its line
//! (`FILE:LINE: domain[0].limit[1].rate: ...`), as the daemon's config is.
//!
//! ```toml
//! [[tenant]]
//! name = "checkout"
//! tokens = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! # token-file = "checkout.token"   # the tokens themselves, one a line
//! # inline-limits = true            # may name a limit's numbers in a request
//! # anonymous = true                # the tenant of callers without a token
//!
//! [[domain]]
//! name = "checkout"
//! tenants = ["checkout"]
//! failure-mode = "allow"            # what a 503 advises: allow or deny
//!
//! [[domain.limit]]
//! name = "per-user"
//! descriptor = [{ key = "user" }]   # a key with no value: each value its own
//! rate = "100/s"
//! burst = 20
//! # algorithm = "fixed-window"      # or sliding-window; gcra by default
//! # shadow = true                   # decide and count, never deny
//! # lease = 50                      # a hot key's units taken 50 at a time
//! ```

use std::{
    collections::{HashMap, HashSet},
    path::Path,
};

use serde::Deserialize;

use super::{
    auth,
    policy::{Domain, FailureMode, LimitDef, Policy, Tenant},
};
use ratelimit_host::config_file::{
    ConfigErrors, Problem, line_at, line_of, parse_toml, read_text, whole_file,
};

use crate::error::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawServe {
    #[serde(default)]
    tenant: Vec<RawTenant>,
    #[serde(default)]
    domain: Vec<RawDomain>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawTenant {
    name: String,
    #[serde(default)]
    tokens: Vec<String>,
    token_file: Option<String>,
    #[serde(default)]
    inline_limits: bool,
    #[serde(default)]
    anonymous: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawDomain {
    name: String,
    #[serde(default)]
    tenants: Vec<String>,
    failure_mode: Option<String>,
    #[serde(default)]
    limit: Vec<RawLimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawLimit {
    name: Option<String>,
    descriptor: Vec<RawEntry>,
    rate: String,
    burst: Option<u64>,
    algorithm: Option<String>,
    #[serde(default)]
    shadow: bool,
    lease: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawEntry {
    key: String,
    value: Option<String>,
}

/// The keys each table of the file takes, as serde reads them: the table as
/// `ratelimit-serve.toml(5)` names it (`""` for the top level), and its keys.
/// For the page's test (in `ratelimit-user`, which writes the page): a key
/// added here and not there fails it.
pub fn tables() -> Vec<(&'static str, Vec<&'static str>)> {
    use ratelimit_host::config_file::fields;
    vec![
        ("", fields::<RawServe>()),
        ("[[tenant]]", fields::<RawTenant>()),
        ("[[domain]]", fields::<RawDomain>()),
        ("[[domain.limit]]", fields::<RawLimit>()),
        ("descriptor", fields::<RawEntry>()),
    ]
}

/// Reads and validates `path`: the policy, or every error found.
pub fn read(path: &Path) -> Result<Policy, ConfigErrors> {
    let text = read_text(path)?;
    let doc = parse_toml(path, &text)?;
    let raw: RawServe = toml_edit::de::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| line_at(&text, s.start));
        whole_file(path, line, e.message().to_string())
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut errors = Vec::new();
    let policy = validate(raw, dir, &mut errors);
    if errors.is_empty() {
        return Ok(policy);
    }
    let problems = errors
        .into_iter()
        .map(|e| match e {
            Error::Invalid { field, message } => Problem {
                line: line_of(&text, &doc, &field),
                field,
                message,
            },
            other => Problem {
                line: None,
                field: String::new(),
                message: other.to_string(),
            },
        })
        .collect();
    Err(ConfigErrors::of(path, problems))
}

fn name_ok(at: &str, name: &str, errors: &mut Vec<Error>) -> bool {
    let ok = !name.is_empty() && name.len() <= 128 && !name.chars().any(char::is_control);
    if !ok {
        errors.push(Error::invalid(
            at,
            "must be 1 to 128 characters, none of them a control character",
        ));
    }
    ok
}

fn validate(raw: RawServe, dir: &Path, errors: &mut Vec<Error>) -> Policy {
    let mut policy = Policy::default();
    let tenant_index = add_tenants(&mut policy, raw.tenant, dir, errors);
    for (i, d) in raw.domain.into_iter().enumerate() {
        add_domain(
            &mut policy,
            &tenant_index,
            &format!("domain[{i}]"),
            d,
            errors,
        );
    }
    if policy.tenants.is_empty() {
        errors.push(Error::invalid(
            "tenant",
            "no [[tenant]]: with --config every caller is a tenant (leave --config out for the open mode)",
        ));
    }
    policy
}

/// The `[[tenant]]` tables into `policy` (tenants, their tokens, the
/// anonymous one); each valid tenant's index by name.
fn add_tenants(
    policy: &mut Policy,
    tenants: Vec<RawTenant>,
    dir: &Path,
    errors: &mut Vec<Error>,
) -> HashMap<String, usize> {
    let mut tenant_index = HashMap::new();
    for (i, t) in tenants.into_iter().enumerate() {
        let at = format!("tenant[{i}]");
        if !name_ok(&format!("{at}.name"), &t.name, errors) {
            continue;
        }
        if tenant_index
            .insert(t.name.clone(), policy.tenants.len())
            .is_some()
        {
            errors.push(Error::invalid(
                format!("{at}.name"),
                format!("tenant {:?} is named twice", t.name),
            ));
            continue;
        }
        let me = policy.tenants.len();
        for (field, d) in tenant_tokens(&at, &t, dir, errors) {
            if let Some(other) = policy.tokens.insert(d, me)
                && other != me
            {
                errors.push(Error::invalid(
                    field,
                    format!(
                        "tenant {:?} has this token too: a token names one tenant",
                        policy.tenants[other].name
                    ),
                ));
            }
        }
        if t.anonymous {
            if let Some(other) = policy.anonymous {
                errors.push(Error::invalid(
                    format!("{at}.anonymous"),
                    format!(
                        "tenant {:?} already takes the callers without a token",
                        policy.tenants[other].name
                    ),
                ));
            } else {
                policy.anonymous = Some(me);
            }
        } else if t.tokens.is_empty() && t.token_file.is_none() {
            errors.push(Error::invalid(
                &at,
                "has no token: give tokens = [\"sha256:...\"] or a token-file (or anonymous = true for callers without one)",
            ));
        }
        policy.tenants.push(Tenant {
            name: t.name,
            inline: t.inline_limits,
            domains: HashSet::new(),
        });
    }
    tenant_index
}

/// A tenant's token digests (`tokens` and its `token-file`), each with the
/// field it came from.
fn tenant_tokens(
    at: &str,
    t: &RawTenant,
    dir: &Path,
    errors: &mut Vec<Error>,
) -> Vec<(String, [u8; 32])> {
    let mut digests = Vec::new();
    for (j, d) in t.tokens.iter().enumerate() {
        match auth::parse_digest(d) {
            Some(d) => digests.push((format!("{at}.tokens[{j}]"), d)),
            None => errors.push(Error::invalid(
                format!("{at}.tokens[{j}]"),
                "must be \"sha256:\" and the 64 hex digits of the token's SHA-256 (printf %s \"$TOKEN\" | sha256sum), or put the token in a token-file",
            )),
        }
    }
    let Some(file) = &t.token_file else {
        return digests;
    };
    let field = format!("{at}.token-file");
    let p = dir.join(file);
    let text = match ratelimit_host::input::read(
        &p,
        ratelimit_host::input::Kind::List,
        "the token file",
    ) {
        Ok(text) => text,
        Err(e) => {
            errors.push(Error::invalid(&field, format!("{}: {e}", p.display())));
            return digests;
        }
    };
    let tokens: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    if tokens.is_empty() {
        errors.push(Error::invalid(
            &field,
            format!("{} holds no token (one a line)", p.display()),
        ));
    }
    for tok in tokens {
        if tok.chars().count() < auth::MIN_TOKEN {
            errors.push(Error::invalid(
                &field,
                format!(
                    "{}: a token shorter than {} characters; make one with `head -c 24 /dev/urandom | base64`",
                    p.display(),
                    auth::MIN_TOKEN
                ),
            ));
        } else {
            digests.push((field.clone(), auth::digest(tok)));
        }
    }
    digests
}

/// One `[[domain]]` (`at`) into `policy`: its failure mode, the tenants
/// that may use it, its limits.
fn add_domain(
    policy: &mut Policy,
    tenant_index: &HashMap<String, usize>,
    at: &str,
    d: RawDomain,
    errors: &mut Vec<Error>,
) {
    if !name_ok(&format!("{at}.name"), &d.name, errors) {
        return;
    }
    if policy.domains.contains_key(&d.name) {
        errors.push(Error::invalid(
            format!("{at}.name"),
            format!("domain {:?} is named twice", d.name),
        ));
        return;
    }
    let failure_mode = match d.failure_mode.as_deref() {
        None => None,
        Some("allow") => Some(FailureMode::Allow),
        Some("deny") => Some(FailureMode::Deny),
        Some(other) => {
            errors.push(Error::invalid(
                format!("{at}.failure-mode"),
                format!("{other:?}: must be \"allow\" (fail open) or \"deny\" (fail closed)"),
            ));
            None
        }
    };
    if d.tenants.is_empty() {
        errors.push(Error::invalid(
            format!("{at}.tenants"),
            "names no tenant: no one could use the domain",
        ));
    }
    for (j, t) in d.tenants.iter().enumerate() {
        match tenant_index.get(t) {
            Some(&k) => {
                policy.tenants[k].domains.insert(d.name.clone());
            }
            None => errors.push(Error::invalid(
                format!("{at}.tenants[{j}]"),
                format!("no [[tenant]] is named {t:?}"),
            )),
        }
    }
    let mut domain = Domain::new(&d.name, failure_mode);
    for (j, l) in d.limit.into_iter().enumerate() {
        add_limit(policy, &mut domain, &format!("{at}.limit[{j}]"), l, errors);
    }
    policy.domains.insert(d.name, domain);
}

/// One `[[domain.limit]]` (`at`) into `domain`, its name into `policy`.
fn add_limit(
    policy: &mut Policy,
    domain: &mut Domain,
    at: &str,
    l: RawLimit,
    errors: &mut Vec<Error>,
) {
    if l.descriptor.is_empty() {
        errors.push(Error::invalid(
            format!("{at}.descriptor"),
            "is empty; write the entries a request's descriptor has, like [{ key = \"user\" }]",
        ));
        return;
    }
    if l.descriptor.len() > super::request::MAX_ENTRIES {
        errors.push(Error::invalid(
            format!("{at}.descriptor"),
            format!("has more than {} entries", super::request::MAX_ENTRIES),
        ));
        return;
    }
    let limit = match super::request::limit_from(at, &l.rate, l.burst, l.algorithm.as_deref()) {
        Ok(limit) => limit,
        Err(e) => {
            errors.push(e);
            return;
        }
    };
    if let Some(n) = l.lease {
        let why = if !matches!(limit, ratelimit_redis::Limit::Gcra { .. }) {
            Some(
                "leases a gcra limit only (the default algorithm); remove it or the algorithm"
                    .to_string(),
            )
        } else if n == 0 || n > limit.capacity() {
            Some(format!(
                "must be from 1 to the limit's burst ({}): the units a hot key takes from Redis at a time",
                limit.capacity()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            errors.push(Error::invalid(format!("{at}.lease"), why));
            return;
        }
    }
    let path: Vec<(String, Option<String>)> =
        l.descriptor.into_iter().map(|e| (e.key, e.value)).collect();
    let name = l.name.unwrap_or_else(|| {
        let mut n = domain.name.clone();
        for (k, v) in &path {
            n.push('/');
            n.push_str(k);
            if let Some(v) = v {
                n.push('=');
                n.push_str(v);
            }
        }
        n
    });
    if !name_ok(&format!("{at}.name"), &name, errors) {
        return;
    }
    if policy.named.contains_key(&name) {
        errors.push(Error::invalid(
            format!("{at}.name"),
            format!("a limit named {name:?} is there already: names are the file's"),
        ));
        return;
    }
    let index = domain.limits.len();
    let def = LimitDef {
        name: name.clone(),
        domain: domain.name.clone(),
        path,
        limit,
        shadow: l.shadow,
        lease: l.lease,
    };
    if domain.add(def) {
        policy.named.insert(name, (domain.name.clone(), index));
    } else {
        errors.push(Error::invalid(
            format!("{at}.descriptor"),
            "another limit of the domain has this descriptor",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own holding the file, removed on drop.
    struct File(std::path::PathBuf);

    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn file(text: &str) -> (File, std::path::PathBuf) {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rl-serve-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("serve.toml");
        std::fs::write(&p, text).unwrap();
        (File(dir), p)
    }

    const TOKEN: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn a_good_file_reads() {
        let (_d, p) = file(&format!(
            r#"
[[tenant]]
name = "shop"
tokens = ["{TOKEN}"]

[[domain]]
name = "checkout"
tenants = ["shop"]
failure-mode = "allow"

[[domain.limit]]
name = "per-user"
descriptor = [{{ key = "user" }}]
rate = "100/s"
burst = 20

[[domain.limit]]
descriptor = [{{ key = "user", value = "42" }}]
rate = "10/min"
algorithm = "fixed-window"
shadow = true
"#
        ));
        let p = read(&p).unwrap_or_else(|e| panic!("{e}"));
        let t = p.tenant(Some("abc")).unwrap();
        assert_eq!(t.name, "shop");
        assert_eq!(
            p.tenant(None).err(),
            Some(super::super::policy::Denied::Missing)
        );
        assert!(p.limit_named(t, "per-user").is_ok());
        let vip = p.limit_named(t, "checkout/user=42").unwrap();
        assert!(vip.shadow);
        assert_eq!(p.domains["checkout"].failure_mode, Some(FailureMode::Allow));
    }

    #[test]
    fn a_lease_is_of_a_gcra_limit_within_its_burst() {
        let limit = |extra: &str| {
            format!(
                "[[tenant]]\nname = \"shop\"\ntokens = [\"{TOKEN}\"]\n\n[[domain]]\nname = \"d\"\ntenants = [\"shop\"]\n\n[[domain.limit]]\nname = \"hot\"\ndescriptor = [{{ key = \"user\" }}]\nrate = \"100/s\"\n{extra}\n"
            )
        };
        let (_d, p) = file(&limit("burst = 20\nlease = 20"));
        let p = read(&p).unwrap_or_else(|e| panic!("{e}"));
        let t = p.tenant(Some("abc")).unwrap();
        assert_eq!(p.limit_named(t, "hot").unwrap().lease, Some(20));
        for (extra, says) in [
            (
                "burst = 20\nlease = 0",
                "must be from 1 to the limit's burst (20)",
            ),
            (
                "burst = 20\nlease = 21",
                "must be from 1 to the limit's burst (20)",
            ),
            (
                "algorithm = \"fixed-window\"\nlease = 5",
                "leases a gcra limit only",
            ),
        ] {
            let (_d, p) = file(&limit(extra));
            let e = read(&p).unwrap_err().to_string();
            assert!(
                e.contains("domain[0].limit[0].lease: ") && e.contains(says),
                "{extra}: {e}"
            );
        }
    }

    #[test]
    fn the_example_reads() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/serve.toml"
        ));
        let p = read(path).unwrap_or_else(|e| panic!("{e}"));
        let t = p.tenant(Some("checkout-token-0123456789")).unwrap();
        assert_eq!(t.name, "checkout");
        let t = p.tenant(Some("edge-token-0123456789")).unwrap();
        assert!(t.inline);
        assert!(p.limit_named(t, "per-user-path").unwrap().shadow);
    }

    #[test]
    fn each_error_is_at_its_line() {
        let (_d, p) = file(
            r#"[[tenant]]
name = "shop"

[[domain]]
name = "checkout"
tenants = ["shop", "nobody"]
failure-mode = "maybe"

[[domain.limit]]
descriptor = [{ key = "user" }]
rate = "fast"
"#,
        );
        let e = read(&p).unwrap_err();
        let lines: Vec<String> = e.lines().collect();
        let text = lines.join("\n");
        assert!(
            text.contains("serve.toml:1: tenant[0]: has no token"),
            "{text}"
        );
        assert!(
            text.contains("serve.toml:6: domain[0].tenants[1]: no [[tenant]]"),
            "{text}"
        );
        assert!(
            text.contains("serve.toml:7: domain[0].failure-mode:"),
            "{text}"
        );
        assert!(
            text.contains("serve.toml:11: domain[0].limit[0].rate: invalid rate"),
            "{text}"
        );
        // An unknown key: serde's, at its line.
        let (_d, p) = file("[[tenant]]\nname = \"a\"\ntokenz = []\n");
        let e = read(&p).unwrap_err();
        let text: Vec<String> = e.lines().collect();
        assert!(
            text[0].contains("serve.toml:3:") && text[0].contains("tokenz"),
            "{text:?}"
        );
    }
}
