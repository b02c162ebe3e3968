//! The service's limits and callers, validated from `--config` ([`super::config`]):
//! tenants (who calls, by bearer token), domains (Envoy's: a namespace of
//! limits that some tenants may use), and each domain's limits, found by
//! descriptor as Envoy's ratelimit service finds them. Also how a request's
//! key becomes the text inside a Redis key's hash tag, and whose that text is.
//!
//! What enters: the validated config. What leaves: for a request, the limit
//! and the key it is counted under, or why not. Read by [`super::api`] and
//! [`super::grpc`] for each request; nothing here touches Redis.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use ratelimit_redis::Limit;

/// What a 503 tells the caller to do while Redis cannot decide (a domain's
/// `failure-mode`); without one the caller chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    /// Let the request through (fail open).
    Allow,
    /// Refuse it (fail closed).
    Deny,
}

impl FailureMode {
    /// As the answers and the config write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// One limit of a domain.
#[derive(Debug)]
pub struct LimitDef {
    /// Its name: the one the config gives, else `DOMAIN/KEY=VALUE/KEY` (its
    /// descriptor, `*`-less: a key without a value matches every value).
    pub name: String,
    /// Its domain.
    pub domain: String,
    /// The descriptor's entries: a key, and the value it must have (`None`:
    /// any, each value counted on its own, as Envoy does).
    pub path: Vec<(String, Option<String>)>,
    /// The numbers.
    pub limit: Limit,
    /// Decided and counted, never denied.
    pub shadow: bool,
    /// Units a hot key takes from Redis at a time, decided here from them
    /// ([`crate::lease`]); `None`: every acquire is decided in Redis.
    pub lease: Option<u64>,
}

/// A domain: its limits, as a tree walked entry by entry.
#[derive(Debug, Default)]
pub struct Domain {
    /// Its name.
    pub name: String,
    /// What a 503 for its keys advises.
    pub failure_mode: Option<FailureMode>,
    /// Its limits, in the config's order.
    pub limits: Vec<Arc<LimitDef>>,
    tree: Node,
}

#[derive(Debug, Default)]
struct Node {
    exact: HashMap<(String, String), Node>,
    any: HashMap<String, Node>,
    limit: Option<usize>,
}

impl Domain {
    /// A new domain.
    pub fn new(name: &str, failure_mode: Option<FailureMode>) -> Self {
        Self {
            name: name.to_string(),
            failure_mode,
            ..Self::default()
        }
    }

    /// Adds a limit; `false` if one with the same descriptor is there.
    pub fn add(&mut self, def: LimitDef) -> bool {
        let mut node = &mut self.tree;
        for (key, value) in &def.path {
            node = match value {
                Some(v) => node.exact.entry((key.clone(), v.clone())).or_default(),
                None => node.any.entry(key.clone()).or_default(),
            };
        }
        if node.limit.is_some() {
            return false;
        }
        node.limit = Some(self.limits.len());
        self.limits.push(Arc::new(def));
        true
    }

    /// The limit of a request's descriptor, as Envoy's ratelimit service
    /// finds it: entry by entry, a node for the entry's key and value first,
    /// else one for its key alone; the limit of the node the last entry
    /// reaches. `None`: no limit (the request is not limited).
    pub fn find(&self, entries: &[(String, String)]) -> Option<&Arc<LimitDef>> {
        let mut node = &self.tree;
        for (key, value) in entries {
            node = node
                .exact
                .get(&(key.clone(), value.clone()))
                .or_else(|| node.any.get(key))?;
        }
        node.limit.map(|i| &self.limits[i])
    }
}

/// A caller.
#[derive(Debug)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// May name a limit's numbers in a request (its keys then are its own,
    /// apart from every domain's).
    pub inline: bool,
    /// The domains it may use.
    pub domains: HashSet<String>,
}

/// Why a caller was not let in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No token, and no tenant takes callers without one.
    Missing,
    /// A token no tenant has.
    Unknown,
}

/// The whole validated config.
#[derive(Debug, Default)]
pub struct Policy {
    /// The tenants.
    pub tenants: Vec<Tenant>,
    /// SHA-256 of each token → its tenant.
    pub tokens: HashMap<[u8; 32], usize>,
    /// The tenant of callers without a token, if any.
    pub anonymous: Option<usize>,
    /// The domains by name.
    pub domains: HashMap<String, Domain>,
    /// Every limit by name: (domain, index in it).
    pub named: HashMap<String, (String, usize)>,
}

impl Policy {
    /// The tenant whose bearer token is `token` (`None`: none was sent).
    pub fn tenant(&self, token: Option<&str>) -> Result<&Tenant, Denied> {
        let i = match token {
            None => self.anonymous.ok_or(Denied::Missing)?,
            Some(t) => *self
                .tokens
                .get(&super::auth::digest(t))
                .ok_or(Denied::Unknown)?,
        };
        Ok(&self.tenants[i])
    }

    /// The domain `name` if `tenant` may use it.
    pub fn domain_for(&self, tenant: &Tenant, name: &str) -> Result<&Domain, String> {
        match self.domains.get(name) {
            Some(d) if tenant.domains.contains(name) => Ok(d),
            Some(_) => Err(format!(
                "tenant {:?} may not use domain {name:?}",
                tenant.name
            )),
            None => Err(format!(
                "no domain {name:?}; tenant {:?} may use {}",
                tenant.name,
                listed(tenant.domains.iter())
            )),
        }
    }

    /// The limit named `name`, if `tenant` may use its domain.
    pub fn limit_named(&self, tenant: &Tenant, name: &str) -> Result<&Arc<LimitDef>, String> {
        let Some((domain, i)) = self.named.get(name) else {
            let mut names: Vec<&str> = self
                .named
                .iter()
                .filter(|(_, (d, _))| tenant.domains.contains(d))
                .map(|(n, _)| n.as_str())
                .collect();
            names.sort_unstable();
            return Err(format!(
                "no limit named {name:?}; tenant {:?} may use {}",
                tenant.name,
                listed(names.iter())
            ));
        };
        let d = self.domain_for(tenant, domain)?;
        Ok(&d.limits[*i])
    }

    /// Whether `tenant` may touch the key whose hash tag holds `content`
    /// (a grant's key: see [`descriptor_key`] and [`inline_key`]).
    pub fn owns(&self, tenant: &Tenant, content: &str) -> bool {
        if let Some(rest) = content.strip_prefix("d:") {
            let domain = rest.split('/').next().unwrap_or_default();
            tenant.domains.contains(&unescape(domain))
        } else if let Some(rest) = content.strip_prefix("t:") {
            let name = rest.split('/').next().unwrap_or_default();
            unescape(name) == tenant.name
        } else {
            false
        }
    }
}

fn listed<'a>(names: impl Iterator<Item = impl AsRef<str> + 'a>) -> String {
    let mut v: Vec<String> = names.map(|n| format!("{:?}", n.as_ref())).collect();
    v.sort_unstable();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// `%`, `/`, `=`, `{` and `}` as `%XX`: the separators of a key's text and
/// the hash tag's braces never appear inside a name or a value.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' | '/' | '=' | '{' | '}' => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        match rest
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            Some(b) => {
                out.push(b as char);
                rest = &rest[i + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The hash tag's text of a descriptor's key: `d:DOMAIN/KEY=VALUE/...`, the
/// same from HTTP and from gRPC, so both count in one bucket.
pub fn descriptor_key(domain: &str, entries: &[(String, String)]) -> String {
    let mut s = format!("d:{}", escape(domain));
    for (k, v) in entries {
        s.push('/');
        s.push_str(&escape(k));
        s.push('=');
        s.push_str(&escape(v));
    }
    s
}

/// The hash tag's text of a tenant's key with an inline limit:
/// `t:TENANT/KEY`.
pub fn inline_key(tenant: &str, key: &str) -> String {
    format!("t:{}/{}", escape(tenant), escape(key))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn def(name: &str, path: &[(&str, Option<&str>)]) -> LimitDef {
        LimitDef {
            name: name.into(),
            domain: "d".into(),
            path: path
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect(),
            limit: Limit::gcra(1, Duration::from_secs(1), 1).unwrap(),
            shadow: false,
            lease: None,
        }
    }

    fn e(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn descriptors_are_found_as_envoy_finds_them() {
        let mut d = Domain::new("d", None);
        assert!(d.add(def("per-user", &[("user", None)])));
        assert!(d.add(def("vip", &[("user", Some("42"))])));
        assert!(d.add(def("user-path", &[("user", None), ("path", None)])));
        assert!(!d.add(def("again", &[("user", None)])), "a duplicate");
        let name = |entries: &[(&str, &str)]| d.find(&e(entries)).map(|l| l.name.clone());
        assert_eq!(name(&[("user", "7")]).as_deref(), Some("per-user"));
        assert_eq!(name(&[("user", "42")]).as_deref(), Some("vip"));
        assert_eq!(
            name(&[("user", "7"), ("path", "/a")]).as_deref(),
            Some("user-path")
        );
        // Envoy walks without going back: the value's node is taken, and it
        // has no `path` below it.
        assert_eq!(name(&[("user", "42"), ("path", "/a")]), None);
        assert_eq!(name(&[("ip", "1")]), None);
        assert_eq!(name(&[]), None);
    }

    #[test]
    fn keys_are_unambiguous_and_owned() {
        assert_eq!(
            descriptor_key("shop", &e(&[("user", "a/b=c"), ("k", "{x}%")])),
            "d:shop/user=a%2Fb%3Dc/k=%7Bx%7D%25"
        );
        assert_eq!(inline_key("t/1", "k"), "t:t%2F1/k");
        assert_eq!(unescape("a%2Fb%3Dc%7Bx%7D%25"), "a/b=c{x}%");
        let policy = Policy::default();
        let tenant = Tenant {
            name: "t/1".into(),
            inline: true,
            domains: ["shop".to_string()].into(),
        };
        assert!(policy.owns(&tenant, &descriptor_key("shop", &e(&[("u", "1")]))));
        assert!(!policy.owns(&tenant, &descriptor_key("other", &e(&[("u", "1")]))));
        assert!(policy.owns(&tenant, &inline_key("t/1", "k")));
        assert!(!policy.owns(&tenant, &inline_key("t", "k")));
        assert!(!policy.owns(&tenant, "plain"));
    }
}
