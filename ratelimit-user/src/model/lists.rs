//! Blocklists and allowlists: named sets of source prefixes read from a file
//! (`ratelimit deny|allow --from FILE`, or `[[list]]` in the config file).
//!
//! What enters: the text of a file in one of the forms operators already have
//! (one CIDR or address per line, FireHOL `.netset`, `ipset save` output,
//! Spamhaus-style `; comment` lines). What leaves: a [`List`], its entries
//! parsed, host bits cleared, sorted and without duplicates, or an error
//! naming the file and line of the first bad line. Who calls it: the daemon
//! (a list sent by the CLI, a `[[list]]` of the config file) and the saved
//! record of live changes.
//!
//! In the kernel, a list entry is a trie entry like a rule's, pointing at one
//! of the two constant policy rules at the end of the rule table (a deny, an
//! allow): see `kernel::Maps::apply` for the precedence.

use std::{fmt, net::IpAddr, sync::Arc};

use crate::{
    error::{Error, Result},
    model::prefix::{PREFIX_FORMS, Prefix},
};

/// What a list does to its sources.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ListAction {
    /// Dropped (counted `denied`).
    Deny,
    /// Passed, never limited (counted `allowed`), in allowlist-only mode too.
    Allow,
}

impl ListAction {
    /// `deny` or `allow`.
    pub const fn name(self) -> &'static str {
        match self {
            ListAction::Deny => "deny",
            ListAction::Allow => "allow",
        }
    }

    /// Reads `deny` or `allow`; errors name `field`.
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        match s.trim() {
            "deny" => Ok(ListAction::Deny),
            "allow" => Ok(ListAction::Allow),
            other => Err(Error::invalid(
                field,
                format!("{other:?} is not a list action: give \"deny\" or \"allow\""),
            )),
        }
    }
}

impl fmt::Display for ListAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A named list, validated. Cheap to clone (the entries are shared).
#[derive(Clone, PartialEq, Eq)]
pub struct List {
    /// Deny or allow.
    pub action: ListAction,
    /// Where it was read from, as the user named it (a path, or `stdin`).
    pub source: String,
    /// The prefixes: host bits cleared, sorted, each once.
    pub entries: Arc<[Prefix]>,
    /// Whether its frames are counted as its own (its entries point at a
    /// policy rule of its own, with a counter slot, rather than at the
    /// shared one): every list read from a file or stdin, and the lists of
    /// CrowdSec's decisions (one per origin). A list costs a rule of
    /// `--max-rules` for it.
    pub counted: bool,
}

impl fmt::Debug for List {
    // 100 000 entries are not a debug line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("List")
            .field("action", &self.action)
            .field("source", &self.source)
            .field("entries", &self.entries.len())
            .field("counted", &self.counted)
            .finish()
    }
}

/// The forms a list's lines may take, for error messages.
pub const LINE_FORMS: &str = "one CIDR or address per line (198.18.0.0/15, 198.18.0.1, 2001:db8::/32), an ipset save line (`add NAME 198.18.0.0/24`; `create` lines are skipped), a comment after `#` or `;`, or a blank line";

/// How many bad lines an error quotes.
const BAD_LINES_SHOWN: usize = 3;

/// What [`parse`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The prefixes: host bits cleared, sorted, each once.
    pub entries: Vec<Prefix>,
    /// Lines that held an entry (duplicates included).
    pub lines: usize,
    /// Entries given more than once (same prefix after host bits are cleared).
    pub duplicates: usize,
}

/// Parses the text of a list file; `source` names it in errors
/// (`FILE:LINE: ...`), which name `field` (the option or TOML key that gave
/// the file). One bad line fails the whole file: the error quotes the first
/// few, with their line numbers, and counts the rest.
pub fn parse(field: &str, source: &str, text: &str) -> Result<Parsed> {
    let mut entries = Vec::new();
    let mut bad: Vec<String> = Vec::new();
    let mut bad_count = 0usize;
    for (i, raw) in text.lines().enumerate() {
        match parse_line(raw) {
            Ok(None) => {}
            Ok(Some(p)) => entries.push(p),
            Err(why) => {
                bad_count += 1;
                if bad.len() < BAD_LINES_SHOWN {
                    bad.push(format!("{source}:{}: {why}", i + 1));
                }
            }
        }
    }
    if bad_count > 0 {
        let more = bad_count - bad.len();
        let tail = if more > 0 {
            format!(" (and {more} more bad lines)")
        } else {
            String::new()
        };
        return Err(Error::invalid(
            field,
            format!(
                "{}{tail}; a list takes {LINE_FORMS}; nothing was applied",
                bad.join("; ")
            ),
        ));
    }
    let lines = entries.len();
    entries.sort_unstable();
    entries.dedup();
    Ok(Parsed {
        duplicates: lines - entries.len(),
        entries,
        lines,
    })
}

/// One line: `Ok(None)` for a blank line, a comment or an ipset `create`.
fn parse_line(raw: &str) -> std::result::Result<Option<Prefix>, String> {
    // `#` (FireHOL, ipset, hosts files) and `;` (Spamhaus DROP) start comments.
    let line = raw.split(['#', ';']).next().unwrap_or("").trim();
    if line.is_empty() {
        return Ok(None);
    }
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or("");
    let cidr = match first {
        "create" => return Ok(None),
        "add" => {
            // `add NAME ENTRY [timeout N] [comment "..."] ...`
            let (Some(_set), Some(entry)) = (words.next(), words.next()) else {
                return Err(format!("{line:?} is an ipset `add` without an entry"));
            };
            entry
        }
        _ if words.next().is_some() => {
            return Err(format!("{line:?} is not one CIDR or address"));
        }
        _ => first,
    };
    if cidr.contains(',') || cidr.contains('-') {
        return Err(format!(
            "{cidr:?} is not a CIDR (ipset ranges and port entries such as hash:net,port are not taken)"
        ));
    }
    Prefix::parse("entry", cidr)
        .map(Some)
        .map_err(|_| format!("{cidr:?} is not a CIDR or address (expected {PREFIX_FORMS})"))
}

/// The longest list name.
pub const MAX_NAME: usize = 64;

/// Checks a list name: 1 to [`MAX_NAME`] letters, digits, `.`, `_` or `-`
/// (it is shown in `list` and typed in `unset --list`).
pub fn check_name(field: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!(
                "{name:?} is not a list name: use 1 to {MAX_NAME} letters, digits, '.', '_' or '-', like firehol_level1"
            ),
        ))
    }
}

/// The default name of a list read from `path`: the file's stem
/// (`/etc/ratelimit/firehol_level1.netset` is `firehol_level1`).
pub fn default_name(path: &str) -> Option<String> {
    std::path::Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
}

impl List {
    /// A list of `action` from the text of `source` (errors name `field`).
    pub fn parse(
        field: &str,
        action: ListAction,
        source: &str,
        text: &str,
    ) -> Result<(Self, Parsed)> {
        let parsed = parse(field, source, text)?;
        Ok((
            List {
                action,
                source: source.to_string(),
                entries: parsed.entries.clone().into(),
                counted: true,
            },
            parsed,
        ))
    }

    /// Reads a list file from disk (a regular file, at most
    /// [`crate::host::input::LIST_MAX_BYTES`]); errors name `field` (a TOML key).
    pub fn read(field: &str, action: ListAction, path: &std::path::Path) -> Result<Self> {
        let what = format!("the list {}", path.display());
        let text = crate::host::input::read(path, crate::host::input::Kind::List, &what)
            .map_err(|e| Error::invalid(field, e))?;
        Ok(Self::parse(field, action, &path.display().to_string(), &text)?.0)
    }

    /// The entries as text, one per line (the saved record's form).
    pub fn text(&self) -> String {
        let mut s = String::with_capacity(self.entries.len() * 16);
        for p in self.entries.iter() {
            use fmt::Write as _;
            let _ = writeln!(s, "{p}");
        }
        s
    }
}

/// The prefixes of the allow lists, to find what they cover: an entry of a
/// deny list equal to or inside an allow list entry is left out (allow wins:
/// a source the operator allowed is never dropped by a bulk list).
#[derive(Debug)]
pub struct Allowed {
    /// By family (IPv4?) and prefix length.
    by_len: std::collections::BTreeMap<(bool, u8), std::collections::HashSet<IpAddr>>,
}

impl Allowed {
    /// The entries of every allow list in `lists`.
    pub fn of<'a>(lists: impl IntoIterator<Item = &'a List>) -> Self {
        let mut by_len: std::collections::BTreeMap<_, std::collections::HashSet<_>> =
            Default::default();
        for l in lists.into_iter().filter(|l| l.action == ListAction::Allow) {
            for p in l.entries.iter() {
                by_len
                    .entry((p.addr.is_ipv4(), p.len))
                    .or_default()
                    .insert(p.addr);
            }
        }
        Self { by_len }
    }

    /// Whether `p` is equal to or inside an allow list entry.
    pub fn covers(&self, p: &Prefix) -> bool {
        self.by_len
            .iter()
            .filter(|((v4, len), _)| *v4 == p.addr.is_ipv4() && *len <= p.len)
            .any(|((_, len), set)| set.contains(&masked(p.addr, *len)))
    }
}

/// `addr` with all but its first `len` bits cleared.
fn masked(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::from((u32::from(a) & mask).to_be_bytes())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::from((u128::from(a) & mask).to_be_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        Prefix::parse("t", s).unwrap()
    }

    fn err(text: &str) -> String {
        parse("--from", "bad.txt", text).unwrap_err().to_string()
    }

    #[test]
    fn plain_lines_bare_addresses_and_comments() {
        let got = parse(
            "--from",
            "l.txt",
            "# a blocklist\n\n198.18.0.0/24\n198.18.1.7\n  198.18.2.0/23   # trailing\n2001:db8::/48\n2001:db8:1::5\n",
        )
        .unwrap();
        assert_eq!(
            got.entries,
            vec![
                p("198.18.0.0/24"),
                p("198.18.1.7/32"),
                p("198.18.2.0/23"),
                p("2001:db8::/48"),
                p("2001:db8:1::5/128"),
            ]
        );
        assert_eq!((got.lines, got.duplicates), (5, 0));
    }

    #[test]
    fn firehol_netset() {
        let text = "#\n# firehol_level1\n#\n# ipv4 hash:net ipset\n#\n# Maintainer      : FireHOL\n#\n198.18.0.0/16\n198.19.4.0/22\n198.19.255.255\n";
        let got = parse("--from", "firehol_level1.netset", text).unwrap();
        assert_eq!(
            got.entries,
            vec![p("198.18.0.0/16"), p("198.19.4.0/22"), p("198.19.255.255")]
        );
    }

    #[test]
    fn ipset_save_takes_the_add_lines() {
        let text = "create bad hash:net family inet hashsize 1024 maxelem 65536\nadd bad 198.18.0.0/24\nadd bad 198.18.9.9 timeout 300\ncreate bad6 hash:net family inet6\nadd bad6 2001:db8:dead::/48 comment \"ssh\"\n";
        let got = parse("--from", "ipset.save", text).unwrap();
        assert_eq!(
            got.entries,
            vec![p("198.18.0.0/24"), p("198.18.9.9"), p("2001:db8:dead::/48")]
        );
    }

    #[test]
    fn spamhaus_semicolon_comments() {
        let got = parse(
            "--from",
            "drop.txt",
            "; Spamhaus DROP\n198.18.64.0/18 ; SBL1\n",
        )
        .unwrap();
        assert_eq!(got.entries, vec![p("198.18.64.0/18")]);
    }

    #[test]
    fn duplicates_are_counted_once() {
        // Host bits are cleared: 198.18.0.9/24 is 198.18.0.0/24.
        let got = parse(
            "--from",
            "d.txt",
            "198.18.0.0/24\n198.18.0.9/24\n198.18.0.1\n198.18.0.1\n",
        )
        .unwrap();
        assert_eq!(got.entries, vec![p("198.18.0.0/24"), p("198.18.0.1")]);
        assert_eq!((got.lines, got.duplicates), (4, 2));
    }

    #[test]
    fn a_bad_line_names_file_and_line_and_the_forms() {
        let e = err("198.18.0.0/24\n# fine\n198.18.0.300\n");
        assert!(e.contains("bad.txt:3:"), "{e}");
        assert!(e.contains("198.18.0.300"), "{e}");
        assert!(e.contains("ipset save line"), "{e}");
        assert!(e.contains("nothing was applied"), "{e}");
        for (text, line) in [
            ("198.18.0.0/33\n", "bad.txt:1:"),
            ("\n\n198.18.0.1 198.18.0.2\n", "bad.txt:3:"),
            ("add bad\n", "bad.txt:1:"),
            ("add bad 198.18.0.0/24,tcp:80\n", "bad.txt:1:"),
            ("198.18.0.1-198.18.0.9\n", "bad.txt:1:"),
            ("::ffff:198.18.0.1\n", "bad.txt:1:"),
            ("2001:db8::/129\n", "bad.txt:1:"),
            ("example.com\n", "bad.txt:1:"),
        ] {
            let e = err(text);
            assert!(e.contains(line), "{text:?}: {e}");
        }
    }

    #[test]
    fn many_bad_lines_are_counted_not_all_quoted() {
        let text: String = (0..10).map(|i| format!("nope{i}\n")).collect();
        let e = err(&text);
        assert!(e.contains("bad.txt:1:") && e.contains("bad.txt:3:"), "{e}");
        assert!(!e.contains("bad.txt:4:"), "{e}");
        assert!(e.contains("and 7 more bad lines"), "{e}");
    }

    #[test]
    fn an_empty_file_is_an_empty_list() {
        let got = parse("--from", "e.txt", "# nothing yet\n\n").unwrap();
        assert!(got.entries.is_empty());
    }

    #[test]
    fn allow_entries_cover_deny_entries_inside_them() {
        let allow = List::parse(
            "--from",
            ListAction::Allow,
            "a",
            "198.18.7.0/24\n198.18.9.9\n2001:db8:1::/48\n",
        )
        .unwrap()
        .0;
        let allowed = Allowed::of([&allow]);
        for inside in [
            "198.18.7.0/24",
            "198.18.7.9",
            "198.18.7.128/25",
            "198.18.9.9",
            "2001:db8:1:2::1",
        ] {
            assert!(allowed.covers(&p(inside)), "{inside}");
        }
        for outside in ["198.18.6.9", "198.18.0.0/16", "198.18.9.8", "2001:db8:2::1"] {
            assert!(!allowed.covers(&p(outside)), "{outside}");
        }
        assert_eq!(masked(p("198.18.7.9").addr, 0), p("0.0.0.0/0").addr);
    }

    #[test]
    fn names() {
        for ok in ["firehol_level1", "a", "crowdsec-bans", "drop.v4"] {
            check_name("--name", ok).unwrap();
        }
        for bad in ["", "-x", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_name("--name", bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            default_name("/etc/ratelimit/firehol_level1.netset").as_deref(),
            Some("firehol_level1")
        );
    }
}
