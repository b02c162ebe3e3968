//! Where a daemon's rules are kept: its [`Layers`] (the base and the live
//! changes) saved in the run directory, whole or not at all, after every
//! change, and read back at the next start.
//!
//! The **base** is the config file (with the command line's options), or the
//! command line alone. **Live changes** (`set`, `allow`, `deny`, `unset`) are
//! kept on top of the base, across reloads (SIGHUP, `ratelimit reload`) and
//! restarts, until they are unset or dropped with `ratelimit reload --replace`.
//! Lists are saved with their entries (a list loaded with `deny --from FILE`
//! comes back without its file; one of the config file is read again from its
//! file when the daemon is given the config file).
//!
//! A daemon that adopts a running program and is given no rules continues with
//! the saved base and live changes. If the record does not match what the
//! kernel enforces, the record wins and is written back (it holds only
//! acknowledged changes: the kernel is ahead of it by a change never
//! acknowledged, or was edited by hand), with a warning; if the record is
//! damaged, it takes the rules the kernel enforces and logs why, loudly. It
//! never falls back to the defaults in silence. The record outlives a clean stop (it lives in /run, so
//! not a reboot): live changes come back with the next start.

use std::{path::Path, sync::Arc};

use serde::{Deserialize, Serialize};
use tracing::{error, warn};

use crate::{
    config::{RawConfig, RawLimit},
    error::{Error, Result},
    host::clock::now_ms,
    host::identity::Identity,
    host::rundir,
    model::decisions::{Decision, Decisions},
    model::lists::{List, ListAction},
    model::overlay::{Expiry, Layers, Overlay},
    model::rules::{Mode, RuleSet, Selector},
};

/// The saved record.
#[derive(Serialize, Deserialize)]
struct Saved {
    version: u32,
    base: RawConfig,
    /// The base's lists, with their entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    base_lists: Vec<SavedList>,
    #[serde(default)]
    live: RawOverlay,
    /// CrowdSec's decisions, in a file of their own beside the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    crowdsec: Option<SavedDecisions>,
}

/// CrowdSec's decisions as saved: one a line in `file`, `ID CIDR END_MS
/// ORIGIN`, then the changes since, appended: the same line for a decision
/// added or replaced, `-ID` for one let go. The record reads the file's
/// first `len` bytes (all of it when `len` is absent: records before the
/// changes were appended), so a change is saved at its own cost and an
/// append no record names is never read. The file is written anew (under a
/// new name) once its changes outnumber what it holds.
#[derive(Serialize, Deserialize)]
struct SavedDecisions {
    file: String,
    /// Decisions held once the file is read, to tell a file cut short.
    count: usize,
    /// The bytes of `file` this record holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    len: Option<u64>,
}

/// One decision's line.
fn decision_line(s: &mut String, d: &Decision) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "{} {} {} {}", d.id, d.prefix, d.until_ms, d.origin);
}

impl SavedDecisions {
    /// The text of `decisions`' file.
    fn text(decisions: &Decisions) -> String {
        let mut s = String::with_capacity(decisions.len() * 48);
        for d in decisions.iter() {
            decision_line(&mut s, d);
        }
        s
    }

    /// The lines that make `before` into `after`.
    fn changes(before: &Decisions, after: &Decisions) -> (String, usize) {
        use std::fmt::Write as _;
        let mut s = String::new();
        let mut n = 0;
        for change in after.changes_since(before) {
            match change {
                Ok(d) => decision_line(&mut s, d),
                Err(id) => {
                    let _ = writeln!(s, "-{id}");
                }
            }
            n += 1;
        }
        (s, n)
    }

    /// The decisions, read from `dir`.
    fn read(&self, dir: &Path) -> std::result::Result<Decisions, String> {
        if !is_decisions_file_name(&self.file) {
            return Err(format!(
                "its CrowdSec decisions file {:?} is not one",
                self.file
            ));
        }
        let path = dir.join(&self.file);
        let mut text = rundir::read(&path)
            .map_err(|e| format!("its CrowdSec decisions cannot be read ({e})"))?
            .ok_or_else(|| format!("its CrowdSec decisions file {} is missing", path.display()))?;
        if let Some(len) = self.len {
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if text.len() < len || !text.is_char_boundary(len) {
                return Err(format!(
                    "its CrowdSec decisions file {} holds {} bytes, not {len} (cut short?)",
                    path.display(),
                    text.len()
                ));
            }
            text.truncate(len);
        }
        let mut all = std::collections::BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let bad = || format!("{}:{}: not a saved decision", path.display(), i + 1);
            if let Some(id) = line.strip_prefix('-') {
                all.remove(&id.parse::<u64>().map_err(|_| bad())?);
                continue;
            }
            let mut words = line.splitn(4, ' ');
            let (Some(id), Some(cidr), Some(until), Some(origin)) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(bad());
            };
            let d = Decision {
                id: id.parse().map_err(|_| bad())?,
                prefix: crate::model::prefix::Prefix::parse("decision", cidr).map_err(|_| bad())?,
                until_ms: until.parse().map_err(|_| bad())?,
                origin: Arc::from(origin),
            };
            all.insert(d.id, d);
        }
        if all.len() != self.count {
            return Err(format!(
                "its CrowdSec decisions file holds {} decisions, not {} (cut short?)",
                all.len(),
                self.count
            ));
        }
        Ok(Decisions::of(all.into_values()))
    }
}

/// Whether `name` is a decisions file's name (`IFACE.crowdsec-HASH.decisions`),
/// nothing that leads out of the directory.
fn is_decisions_file_name(name: &str) -> bool {
    name.contains(".crowdsec-") && name.ends_with(".decisions") && !name.contains('/')
}

/// A list as saved: its entries one per line in a file of their own beside
/// the record (`file`, named by their content: written once, when the list
/// is loaded, not at every change), or in the record itself (`entries`:
/// records of version 2).
#[derive(Serialize, Deserialize)]
struct SavedList {
    name: String,
    action: ListAction,
    source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    entries: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    /// Entries in `file`, to tell a file cut short.
    #[serde(default)]
    count: usize,
}

impl SavedList {
    fn of(name: &str, l: &List, file: String) -> Self {
        SavedList {
            name: name.to_string(),
            action: l.action,
            source: l.source.clone(),
            entries: None,
            file: Some(file),
            count: l.entries.len(),
        }
    }

    /// The list, its entries read from `dir` when they are in a file.
    fn list(&self, dir: &Path) -> std::result::Result<List, String> {
        crate::model::lists::check_name("name", &self.name).map_err(|e| format!("{e}"))?;
        let field = format!("list {}", self.name);
        let text = match (&self.entries, &self.file) {
            (Some(text), _) => text.clone(),
            (None, Some(file)) if is_list_file_name(file) => {
                let path = dir.join(file);
                rundir::read(&path)
                    .map_err(|e| format!("its list {} cannot be read ({e})", self.name))?
                    .ok_or_else(|| {
                        format!(
                            "its list {}'s file {} is missing",
                            self.name,
                            path.display()
                        )
                    })?
            }
            _ => return Err(format!("its list {} has no entries", self.name)),
        };
        let list = List::parse(&field, self.action, &self.source, &text)
            .map(|(l, _)| l)
            .map_err(|e| format!("its list {} is invalid ({e})", self.name))?;
        if self.file.is_some() && list.entries.len() != self.count {
            return Err(format!(
                "its list {}'s file holds {} entries, not {} (cut short?)",
                self.name,
                list.entries.len(),
                self.count
            ));
        }
        Ok(list)
    }
}

/// Whether `name` is a list file's name (`IFACE.list-HASH.entries`), nothing
/// that leads out of the directory.
fn is_list_file_name(name: &str) -> bool {
    name.contains(".list-") && name.ends_with(".entries") && !name.contains('/')
}

/// The list files already written, by the entries they hold (the same `Arc`
/// while a list is unchanged): a save writes only the lists it has not; and
/// the decisions file last written ([`DecisionsFile`]).
#[derive(Default)]
pub struct ListFiles(
    Vec<(Arc<[crate::model::rules::Prefix]>, String)>,
    Option<DecisionsFile>,
);

/// Changes a decisions file takes beyond twice the decisions it holds
/// before it is written anew.
const JOURNAL_SLACK: usize = if cfg!(test) { 100 } else { 10_000 };

/// The decisions file last written: the decisions its first `len` bytes
/// hold, and how many lines those are.
pub struct DecisionsFile {
    decisions: Decisions,
    name: String,
    len: u64,
    lines: usize,
}

impl ListFiles {
    /// The file of `l` (entries one per line, named by a hash of them),
    /// written into `dir` if it is not there yet.
    fn file_of(&mut self, id: &Identity, dir: &Path, l: &List) -> Result<String> {
        if let Some((_, name)) = self.0.iter().find(|(e, _)| Arc::ptr_eq(e, &l.entries)) {
            return Ok(name.clone());
        }
        let text = l.text();
        let name = format!("{}.list-{:016x}.entries", id.iface, fnv1a(text.as_bytes()));
        let path = dir.join(&name);
        if !path.exists() {
            rundir::write_atomic(&path, text.as_bytes())?;
        }
        self.0.push((l.entries.clone(), name.clone()));
        Ok(name)
    }

    /// The file of `decisions` and the length of it that holds them: the
    /// last file with what changed since appended, or, the first time and
    /// once the changes outnumber the decisions, a new file; `None` when
    /// there are none.
    fn decisions_file(
        &mut self,
        id: &Identity,
        dir: &Path,
        decisions: &Decisions,
    ) -> Result<Option<SavedDecisions>> {
        if decisions.is_empty() {
            return Ok(None);
        }
        let file = match self.1.take() {
            Some(f) if f.decisions.same(decisions) => f,
            Some(f) if f.lines < 2 * decisions.len() + JOURNAL_SLACK => {
                let (text, n) = SavedDecisions::changes(&f.decisions, decisions);
                let len = rundir::append_at(&dir.join(&f.name), f.len, text.as_bytes())?;
                DecisionsFile {
                    decisions: decisions.clone(),
                    name: f.name,
                    len,
                    lines: f.lines + n,
                }
            }
            _ => {
                let text = SavedDecisions::text(decisions);
                // Never the name of a file a record may still name.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                let name = format!(
                    "{}.crowdsec-{:016x}.decisions",
                    id.iface,
                    fnv1a(text.as_bytes()) ^ nanos
                );
                rundir::write_atomic(&dir.join(&name), text.as_bytes())?;
                DecisionsFile {
                    decisions: decisions.clone(),
                    name,
                    len: text.len() as u64,
                    lines: decisions.len(),
                }
            }
        };
        let saved = SavedDecisions {
            file: file.name.clone(),
            count: decisions.len(),
            len: Some(file.len),
        };
        self.1 = Some(file);
        Ok(Some(saved))
    }
}

/// FNV-1a, 64 bits: a file name for a list's content, the same in every
/// build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[derive(Serialize, Deserialize)]
struct RawLiveList {
    name: String,
    /// `None`: removed.
    list: Option<SavedList>,
    /// When it ends, Unix ms (a list loaded with `--for`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<u64>,
}

#[derive(Default, Serialize, Deserialize)]
struct RawOverlay {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default: Option<RawLimit>,
    #[serde(default)]
    rules: Vec<RawLive>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    lists: Vec<RawLiveList>,
}

#[derive(Serialize, Deserialize)]
struct RawLive {
    /// A selector's text form (a CIDR and its match).
    cidr: String,
    /// `None`: unset.
    rule: Option<RawLimit>,
    /// When it ends, Unix ms (a rule set with `--for`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<u64>,
    /// What comes back when it ends: the live change it replaced (absent: the
    /// config file's rule, if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restores: Option<RawRestore>,
}

/// A live change a temporary rule hides: a rule, or an unset (`rule` null).
#[derive(Serialize, Deserialize)]
struct RawRestore {
    rule: Option<RawLimit>,
}

const VERSION: u32 = 3;

/// The saved record of `id`'s daemon.
pub fn path(id: &Identity) -> std::path::PathBuf {
    rundir::file(id, "rules.json")
}

/// The saved form of `rules`; `file` names (and writes, if need be) each
/// list's file.
fn record(
    rules: &Layers,
    file: &mut dyn FnMut(&List) -> Result<String>,
    crowdsec: Option<SavedDecisions>,
) -> Result<Saved> {
    let mut list = |n: &str, l: &List| Ok::<_, Error>(SavedList::of(n, l, file(l)?));
    let base_lists = rules
        .base
        .lists
        .iter()
        .map(|(n, l)| list(n, l))
        .collect::<Result<_>>()?;
    let mut live_lists = Vec::new();
    for (n, l) in &rules.live.lists {
        live_lists.push(RawLiveList {
            name: n.clone(),
            list: l.as_ref().map(|l| list(n, l)).transpose()?,
            expires_at_ms: rules.live.expiring_lists.get(n).copied(),
        });
    }
    Ok(Saved {
        version: VERSION,
        base: RawConfig::from(&rules.base),
        base_lists,
        live: RawOverlay {
            default: rules.live.default.as_ref().map(RawLimit::from),
            rules: rules
                .live
                .rules
                .iter()
                .map(|(p, a)| {
                    let expiry = rules.live.expiring.get(p);
                    RawLive {
                        cidr: p.to_string(),
                        rule: a.as_ref().map(RawLimit::from),
                        expires_at_ms: expiry.map(|e| e.at_ms),
                        restores: expiry.and_then(|e| e.under).map(|u| RawRestore {
                            rule: u.as_ref().map(RawLimit::from),
                        }),
                    }
                })
                .collect(),
            mode: rules.live.mode,
            lists: live_lists,
        },
        crowdsec,
    })
}

/// A save written down to its last step: the record is in place once
/// [`PendingSave::commit`]ted; dropped, nothing changed.
pub struct PendingSave {
    record: rundir::Staged,
    /// The list files the record names.
    keep: Vec<String>,
    dir: std::path::PathBuf,
    iface: String,
}

/// Writes everything a save of `rules` needs but the last rename: the files
/// of lists not saved before, and the record under a temporary name. A full
/// disk or any other failure is known here, before anything changes.
pub fn stage(id: &Identity, rules: &Layers, files: &mut ListFiles) -> Result<PendingSave> {
    let record_path = path(id);
    let dir = record_path
        .parent()
        .expect("the record is in a directory")
        .to_path_buf();
    let mut keep = Vec::new();
    let crowdsec = files.decisions_file(id, &dir, &rules.decisions)?;
    if let Some(c) = &crowdsec {
        keep.push(c.file.clone());
    }
    let saved = record(
        rules,
        &mut |l| {
            let name = files.file_of(id, &dir, l)?;
            keep.push(name.clone());
            Ok(name)
        },
        crowdsec,
    )?;
    // The cache keeps only the lists this record names.
    files.0.retain(|(_, name)| keep.contains(name));
    let json = serde_json::to_vec_pretty(&saved).expect("the record serializes");
    Ok(PendingSave {
        record: rundir::stage(&record_path, &json)?,
        keep,
        dir,
        iface: id.iface.clone(),
    })
}

impl PendingSave {
    /// Puts the record in place, then removes the list and decisions files
    /// it no longer names.
    pub fn commit(self) -> Result<()> {
        self.record.commit()?;
        let prefix = format!("{}.list-", self.iface);
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = (name.starts_with(&prefix) && is_list_file_name(&name))
                    || (name.starts_with(&format!("{}.crowdsec-", self.iface))
                        && is_decisions_file_name(&name));
                if ours && !self.keep.contains(&name) {
                    rundir::remove(&e.path());
                }
            }
        }
        Ok(())
    }
}

/// Saves `rules`, whole or not at all.
pub fn save(id: &Identity, rules: &Layers, files: &mut ListFiles) -> Result<()> {
    stage(id, rules, files)?.commit()
}

/// What was found in the run directory.
pub enum Found {
    /// No record: a first start.
    Missing,
    /// A readable record.
    Rules(Box<Layers>),
    /// A record that cannot be read: why.
    Damaged(String),
}

/// Reads the saved record of `id`'s daemon.
pub fn load(id: &Identity) -> Found {
    let p = path(id);
    let text = match rundir::read(&p) {
        Ok(None) => return Found::Missing,
        Ok(Some(t)) => t,
        Err(e) => return Found::Damaged(format!("{e}")),
    };
    let dir = p.parent().expect("the record is in a directory");
    match parse(&text, dir) {
        Ok(r) => Found::Rules(Box::new(r)),
        Err(e) => Found::Damaged(e),
    }
}

/// Reads a record, its lists' files in `dir`.
fn parse(text: &str, dir: &Path) -> std::result::Result<Layers, String> {
    if text.trim().is_empty() {
        return Err("it is empty".into());
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("it is not JSON ({e})"))?;
    let saved: Saved = if value.get("version").is_some() {
        serde_json::from_value(value).map_err(|e| format!("it is not a rules record ({e})"))?
    } else {
        // The first turn's record: a rule set alone.
        Saved {
            version: 1,
            base: serde_json::from_value(value)
                .map_err(|e| format!("it is not a rules record ({e})"))?,
            base_lists: Vec::new(),
            live: RawOverlay::default(),
            crowdsec: None,
        }
    };
    let mut base = saved
        .base
        .validate(&RuleSet::default())
        .map_err(|e| format!("its base rules are invalid ({e})"))?;
    for l in &saved.base_lists {
        base.lists.insert(l.name.clone(), l.list(dir)?);
    }
    let mut live = Overlay {
        mode: saved.live.mode,
        ..Overlay::default()
    };
    if let Some(d) = &saved.live.default {
        live.default = Some(
            d.validate("default", None)
                .map_err(|e| format!("its live default is invalid ({e})"))?,
        );
    }
    for r in &saved.live.rules {
        let p = Selector::parse("cidr", &r.cidr).map_err(|e| format!("{e}"))?;
        let rule = |raw: &Option<RawLimit>| match raw {
            Some(l) => l
                .validate(&p.to_string(), Some(p.source.addr.is_ipv4()))
                .map(Some)
                .map_err(|e| format!("its live rule for {p} is invalid ({e})")),
            None => Ok(None),
        };
        live.rules.insert(p, rule(&r.rule)?);
        if let Some(at_ms) = r.expires_at_ms {
            let under = match &r.restores {
                Some(u) => Some(rule(&u.rule)?),
                None => None,
            };
            live.expiring.insert(p, Expiry { at_ms, under });
        }
    }
    for l in &saved.live.lists {
        let list = l.list.as_ref().map(|l| l.list(dir)).transpose()?;
        live.lists.insert(l.name.clone(), list);
        if let Some(at) = l.expires_at_ms {
            live.expiring_lists.insert(l.name.clone(), at);
        }
    }
    let decisions = match &saved.crowdsec {
        Some(c) => c.read(dir)?,
        None => Decisions::default(),
    };
    let rules = Layers {
        base,
        live,
        decisions,
    };
    rules
        .effective()
        .validate()
        .map_err(|e| format!("its rules are invalid together ({e})"))?;
    Ok(rules)
}

/// The rules a starting daemon enforces: the base is `given` (from `--config`
/// and the command line), or, when it adopts a running program (`kernel`: what
/// its maps enforce) and is given nothing, the saved base, else the defaults;
/// the saved live changes go on top. See the module docs.
pub fn initial(
    id: &Identity,
    given: Option<RuleSet>,
    found: Found,
    kernel: Option<RuleSet>,
) -> Result<Layers> {
    let where_ = path(id);
    match (given, found, kernel) {
        (Some(base), Found::Rules(saved), _) => Ok(Layers {
            base,
            live: saved.live,
            decisions: saved.decisions,
        }),
        (Some(base), Found::Damaged(why), _) => {
            error!(
                record = %where_.display(),
                "the saved live rule changes cannot be read ({why}); the rules given on the command line and in the config file are applied without them"
            );
            Ok(Layers::of(base))
        }
        (Some(base), Found::Missing, _) => Ok(Layers::of(base)),
        (None, Found::Rules(saved), Some(k)) if !saved.effective().same_in_kernel(&k) => {
            // Killed between ending temporary rules in the kernel and saving
            // the record: the record with them ended is what it enforces.
            let mut ended = (*saved).clone();
            if !ended.expire(now_ms()).is_empty() && ended.effective().same_in_kernel(&k) {
                return Ok(ended);
            }
            // The record wins: it holds only acknowledged changes. The
            // kernel differs from it by a change never acknowledged (a
            // daemon killed between writing the maps and the record) or by
            // a hand's edit of the pinned maps (a rule deleted): either way
            // the acknowledged rules are put back.
            warn!(
                record = %where_.display(),
                "the saved rules differ from what the kernel enforces (a daemon killed between a change and its record, or the pinned maps edited by hand); the saved rules are put back: they hold only acknowledged changes"
            );
            Ok(ended)
        }
        (None, Found::Rules(saved), Some(_)) => Ok(*saved),
        // Nothing runs: the base is what was given (nothing: the defaults), the
        // live changes come back on top.
        (None, Found::Rules(saved), None) => {
            let rules = Layers {
                base: RuleSet::default(),
                live: saved.live,
                decisions: saved.decisions,
            };
            if let Err(e) = rules.effective().validate() {
                return Err(Error::Refused(format!(
                    "the saved live changes in {} do not fit the default rules ({e}): give the rules with --config or the rule options, or remove the file",
                    where_.display()
                )));
            }
            Ok(rules)
        }
        (None, Found::Damaged(why), Some(k)) => {
            error!(
                record = %where_.display(),
                rules = k.rules.len(),
                "THE SAVED RULES CANNOT BE READ ({why}): keeping exactly what the kernel enforces, read back from the pinned maps; the record is rewritten from them"
            );
            Ok(Layers::of(k))
        }
        (None, Found::Damaged(why), None) => Err(Error::Refused(format!(
            "the saved rules {} cannot be read ({why}) and no program runs to take them from: give the rules with --config or the rule options, or remove the file to start from the defaults",
            where_.display()
        ))),
        (None, Found::Missing, Some(k)) => {
            warn!(
                rules = k.rules.len(),
                "no saved rules: keeping what the kernel enforces, read back from the pinned maps"
            );
            Ok(Layers::of(k))
        }
        (None, Found::Missing, None) => Ok(Layers::of(RuleSet::default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rules::Action;

    fn p(s: &str) -> Selector {
        Selector::parse("cidr", s).unwrap()
    }

    /// A directory for list files, removed on drop.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("rl-store-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Self(d)
        }

        /// The record of `rules`, its lists' files written here.
        fn record(&self, rules: &Layers) -> String {
            let crowdsec = (!rules.decisions.is_empty()).then(|| {
                let text = SavedDecisions::text(&rules.decisions);
                let file = format!("t.crowdsec-{:016x}.decisions", fnv1a(text.as_bytes()));
                std::fs::write(self.0.join(&file), text).unwrap();
                SavedDecisions {
                    file,
                    count: rules.decisions.len(),
                    len: None,
                }
            });
            let saved = record(
                rules,
                &mut |l| {
                    let text = l.text();
                    let name = format!("t.list-{:016x}.entries", fnv1a(text.as_bytes()));
                    std::fs::write(self.0.join(&name), text).unwrap();
                    Ok(name)
                },
                crowdsec,
            )
            .unwrap();
            serde_json::to_string(&saved).unwrap()
        }

        fn parse(&self, text: &str) -> std::result::Result<Layers, String> {
            parse(text, &self.0)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn live_changes_sit_on_top_of_the_base() {
        let mut base = RuleSet::default();
        base.rules.insert(p("198.18.1.0/24"), Action::Allow);
        base.rules.insert(p("198.18.2.0/24"), Action::Allow);
        let mut rules = Layers::of(base);
        rules
            .live
            .rules
            .insert(p("198.18.9.0/24"), Some(Action::Deny { dry_run: false }));
        rules.live.rules.insert(p("198.18.2.0/24"), None);
        let e = rules.effective();
        assert!(e.rules.contains_key(&p("198.18.1.0/24")));
        assert!(!e.rules.contains_key(&p("198.18.2.0/24")), "unset live");
        assert!(e.rules.contains_key(&p("198.18.9.0/24")));
        assert_eq!(rules.origin(&p("198.18.9.0/24")), "live");
        assert_eq!(rules.origin(&p("198.18.1.0/24")), "config");
    }

    #[test]
    fn damaged_records_say_why() {
        for (text, why) in [
            ("", "empty"),
            ("{\"version\": 2, \"ba", "not JSON"),
            ("\u{1}\u{2}garbage", "not JSON"),
            (
                "{\"version\":2,\"base\":{\"default\":{\"rate\":\"10/fortnight\"}}}",
                "base rules are invalid",
            ),
        ] {
            let e = Dir::new("damaged").parse(text).map(|_| ()).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_record_reads_back_whole() {
        let mut base = RuleSet::default();
        base.rules.insert(p("198.18.1.0/24"), Action::Allow);
        let mut rules = Layers::of(base);
        rules.live.rules.insert(p("198.18.1.0/24"), None);
        rules
            .live
            .rules
            .insert(p("2001:db8::/32"), Some(Action::Deny { dry_run: true }));
        let dir = Dir::new("whole");
        let text = dir.record(&rules);
        assert_eq!(dir.parse(&text).unwrap(), rules);
    }

    #[test]
    fn a_temporary_rule_ends_with_what_it_hid_back_and_is_saved_with_its_time() {
        let mut base = RuleSet::default();
        base.rules.insert(p("198.18.1.0/24"), Action::Allow);
        let mut rules = Layers::of(base);
        let deny = Some(Action::Deny { dry_run: false });
        // A ban over a config rule, then a second ban on top of the first.
        rules.set_live(p("198.18.1.0/24"), deny, Some(5_000));
        rules.set_live(p("198.18.1.0/24"), deny, Some(9_000));
        // A ban over a live rule.
        rules.set_live(p("198.18.2.0/24"), Some(Action::Allow), None);
        rules.set_live(p("198.18.2.0/24"), deny, Some(7_000));
        assert_eq!(rules.expires(&p("198.18.1.0/24")), Some(9_000));

        // Read back from the saved record, with times and what they hide.
        let dir = Dir::new("temporary");
        let text = dir.record(&rules);
        let mut back = dir.parse(&text).unwrap();
        assert_eq!(back, rules);

        assert!(back.expire(6_999).is_empty());
        assert_eq!(back.expire(7_000), vec!["198.18.2.0/24".to_string()]);
        assert_eq!(
            back.effective().rules[&p("198.18.2.0/24")],
            Action::Allow,
            "the live allow it hid comes back"
        );
        assert_eq!(back.expire(9_000), vec!["198.18.1.0/24".to_string()]);
        assert_eq!(back.effective().rules[&p("198.18.1.0/24")], Action::Allow);
        // Only the live allow is left; the config rule shows through again.
        assert_eq!(back.live.rules.len(), 1, "{:?}", back.live.rules);
        assert!(back.live.expiring.is_empty());

        // Ended early (unset), it gives back what it hid; what lasts under a
        // temporary rule is what comes back.
        let mut early = rules.clone();
        assert_eq!(early.lasting(&p("198.18.2.0/24")), Some(Action::Allow));
        assert_eq!(early.lasting(&p("198.18.1.0/24")), Some(Action::Allow));
        assert!(early.end_temporary(&p("198.18.2.0/24")));
        assert!(!early.end_temporary(&p("198.18.2.0/24")), "ended once");
        assert_eq!(early.effective().rules[&p("198.18.2.0/24")], Action::Allow);

        // A permanent change makes it permanent.
        rules.set_live(p("198.18.1.0/24"), deny, None);
        assert_eq!(rules.expires(&p("198.18.1.0/24")), None);
    }

    #[test]
    fn a_record_saved_before_its_bans_ended_in_the_kernel_is_taken_with_them_ended() {
        let id = Identity {
            netns: 1,
            netns_inode: crate::host::identity::HOST_NETNS,
            iface: "rltest0".into(),
        };
        let deny = Some(Action::Deny { dry_run: false });
        let far = now_ms() + 3_600_000;
        let mut saved = Layers::of(RuleSet::default());
        saved.set_live(p("198.18.1.0/24"), deny, Some(1));
        saved.set_live(p("198.18.2.0/24"), deny, Some(far));
        // What the kernel enforces: the first ban ended (the daemon was
        // killed before it saved the record), the second still on.
        let mut kernel = RuleSet::default();
        kernel
            .rules
            .insert(p("198.18.2.0/24"), Action::Deny { dry_run: false });
        let got = initial(&id, None, Found::Rules(Box::new(saved)), Some(kernel)).unwrap();
        assert!(!got.effective().rules.contains_key(&p("198.18.1.0/24")));
        assert_eq!(
            got.expires(&p("198.18.2.0/24")),
            Some(far),
            "the other ban lost its end: {got:?}"
        );
    }

    #[test]
    fn an_acknowledged_rule_deleted_from_the_kernel_by_hand_comes_back() {
        let id = Identity {
            netns: 1,
            netns_inode: crate::host::identity::HOST_NETNS,
            iface: "rltest0".into(),
        };
        let mut saved = Layers::of(RuleSet::default());
        saved.set_live(
            p("198.18.3.0/24"),
            Some(Action::Deny { dry_run: false }),
            None,
        );
        // The pinned trie lost the rule (`bpftool map delete …`).
        let kernel = RuleSet::default();
        let got = initial(&id, None, Found::Rules(Box::new(saved)), Some(kernel)).unwrap();
        assert_eq!(
            got.effective().rules.get(&p("198.18.3.0/24")),
            Some(&Action::Deny { dry_run: false }),
            "the acknowledged deny was dropped: {got:?}"
        );
    }

    #[test]
    fn lists_are_saved_with_their_entries() {
        let list = |action, text: &str| {
            List::parse("--from", action, "/gone/list.txt", text)
                .unwrap()
                .0
        };
        let mut base = RuleSet::default();
        base.lists.insert(
            "firehol".into(),
            list(ListAction::Deny, "198.18.0.0/16\n2001:db8::/48\n"),
        );
        let mut rules = Layers::of(base);
        rules.live.lists.insert(
            "bans".into(),
            Some(list(ListAction::Deny, "198.19.0.1\n198.19.0.2\n")),
        );
        rules.live.lists.insert(
            "friends".into(),
            Some(list(ListAction::Allow, "198.18.7.7\n")),
        );
        let dir = Dir::new("lists");
        let text = dir.record(&rules);
        let back = dir.parse(&text).unwrap();
        assert_eq!(back, rules);
        let e = back.effective();
        assert_eq!(e.lists["bans"].entries.len(), 2);
        assert_eq!(e.lists["firehol"].source, "/gone/list.txt");
        assert_eq!(back.list_origin("bans"), "live");
        assert_eq!(back.list_origin("firehol"), "config");

        // A base list removed live stays removed.
        rules.live.lists.insert("firehol".into(), None);
        let back = dir.parse(&dir.record(&rules)).unwrap();
        assert!(!back.effective().lists.contains_key("firehol"));
    }

    #[test]
    fn decisions_are_saved_by_appending_what_changed_and_read_back_to_the_length_named() {
        let dir = Dir::new("journal");
        let id = Identity {
            netns: 1,
            netns_inode: 1,
            iface: "rlj0".into(),
        };
        let mut files = ListFiles::default();
        let d = |id: u64, last: u8| {
            Decision::new(
                id,
                p(&format!("198.18.0.{last}")).source,
                "feed",
                0,
                3_600_000,
            )
        };
        let mut held = Decisions::of((1..=50).map(|i| d(i, i as u8)));
        let first = files.decisions_file(&id, &dir.0, &held).unwrap().unwrap();
        assert_eq!(first.read(&dir.0).unwrap(), held);
        let mut saved = Vec::new();
        for round in 0..5u64 {
            // One replaced, one let go, one new.
            held.apply([d(100 + round, 200), d(1 + round, 201)], [40 + round]);
            let s = files.decisions_file(&id, &dir.0, &held).unwrap().unwrap();
            assert_eq!(s.file, first.file, "appended to the same file");
            assert_eq!(s.read(&dir.0).unwrap(), held, "round {round}");
            saved.push((s, held.clone()));
        }
        // An earlier record still reads what it held: appends come after it.
        let (early, then) = &saved[1];
        assert_eq!(&early.read(&dir.0).unwrap(), then);
        // An append no record names (the daemon stopped before the record)
        // is cut off by the next and never read.
        let path = dir.0.join(&first.file);
        let named = std::fs::metadata(&path).unwrap().len();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, b"-3\n999 198.18.0.9/32 1 x").unwrap();
        assert_eq!(saved[4].0.read(&dir.0).unwrap(), held);
        held.apply([d(300, 9)], []);
        let s = files.decisions_file(&id, &dir.0, &held).unwrap().unwrap();
        assert_eq!(
            s.len,
            Some(named + "300 198.18.0.9/32 3600000 feed\n".len() as u64)
        );
        assert_eq!(s.read(&dir.0).unwrap(), held);
        // Once the changes outnumber what is held, a new file.
        let small = Decisions::of([d(1, 1)]);
        let mut files = ListFiles::default();
        let a = files.decisions_file(&id, &dir.0, &small).unwrap().unwrap();
        let mut churn = small.clone();
        let mut last = a.file.clone();
        for i in 0..(JOURNAL_SLACK as u64) {
            churn.apply([d(2 + i, 2)], [1 + i]);
            last = files
                .decisions_file(&id, &dir.0, &churn)
                .unwrap()
                .unwrap()
                .file;
        }
        assert_ne!(
            last, a.file,
            "written anew once the changes outnumber the decisions"
        );
    }

    #[test]
    fn crowdsec_decisions_are_saved_with_their_ends_beside_the_operators_rules() {
        let mut rules = Layers::of(RuleSet::default());
        rules
            .live
            .rules
            .insert(p("198.18.0.5/32"), Some(Action::Deny { dry_run: false }));
        rules.decisions.apply(
            [
                Decision::new(7, p("198.18.0.5").source, "cscli", 0, 120_000),
                Decision::new(8, p("198.18.7.0/24").source, "CAPI", 0, 3_600_000),
            ],
            [],
        );
        let dir = Dir::new("crowdsec");
        let back = dir.parse(&dir.record(&rules)).unwrap();
        assert_eq!(back, rules);
        assert_eq!(back.list_origin("crowdsec:cscli"), "crowdsec");
        let e = back.effective();
        assert_eq!(e.lists["crowdsec:CAPI"].entries.len(), 1);
        assert!(
            e.rules.contains_key(&p("198.18.0.5/32")),
            "the hand-made rule stays"
        );

        // A decisions file cut short is said, not half read.
        let text = dir.record(&rules);
        let file = std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".decisions"))
            .unwrap()
            .path();
        let whole = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, whole.lines().next().unwrap()).unwrap();
        let e = dir.parse(&text).unwrap_err();
        assert!(e.contains("cut short"), "{e}");
    }
}
