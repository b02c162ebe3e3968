//! A program enforcing with no daemon (left by `--keep-attached`, or its
//! daemon killed): the read-only commands (`list`, `stats`, `status`, `top`)
//! answer from its pinned maps and the saved record, with the daemon's own
//! builders (`daemon::read`), marked `"daemon": false`. The CLI asks here when
//! no daemon answers. Nothing here writes: changes need a daemon, and
//! `ratelimit run --iface IFACE` adopts the program with its rules and buckets.

use std::{path::PathBuf, time::Duration};

use super::{
    control::TOP_WINDOW,
    read::{self, Teller},
    store::{self, Found},
};
use crate::{
    error::{Error, Result},
    host::identity::{self, Identity},
    kernel::{LINK_PIN, Maps},
    model::overlay::Layers,
    protocol::{
        Request,
        answer::{self, Answer, Interface, Offline, RulesFrom},
    },
};

/// A pinned program of this network namespace, opened read-only.
pub struct Pinned {
    id: Identity,
    /// The pin directory as the operator knows it (`/sys/fs/bpf/...`).
    shown: PathBuf,
    maps: Maps,
    rules: Layers,
    /// Whether the saved record was set aside for what the kernel enforces.
    from_kernel: bool,
}

/// The interfaces of this network namespace with a pinned program.
pub fn pinned_here() -> Result<Vec<String>> {
    let Some(root) = identity::find_bpffs()? else {
        return Ok(Vec::new());
    };
    let here = Identity::here("")?;
    let dir = identity::pin_dir(&root.path, &here);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut found: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join(LINK_PIN).exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    Ok(found)
}

/// Attached if an interface of that name exists in this namespace (the
/// pinned link leads to one), else gone.
fn interface_state(iface: &str) -> Interface {
    let Ok(name) = std::ffi::CString::new(iface) else {
        return Interface::Gone;
    };
    // SAFETY: a C string.
    if unsafe { libc::if_nametoindex(name.as_ptr()) } == 0 {
        Interface::Gone
    } else {
        Interface::Attached
    }
}

impl Pinned {
    /// The program pinned for `iface` in this namespace, if one is.
    pub fn open(iface: &str) -> Result<Option<Self>> {
        let id = Identity::here(iface)?;
        let Some(root) = identity::find_bpffs()? else {
            return Ok(None);
        };
        let dir = identity::pin_dir(&root.path, &id);
        if !dir.join(LINK_PIN).exists() {
            return Ok(None);
        }
        let mut maps = Maps::from_pins(&dir)?;
        let kernel = maps.rule_set()?;
        // The saved record knows what the maps cannot say (where a rule came
        // from, when a temporary one ends), if it matches what is enforced.
        let (rules, from_kernel) = match store::load(&id) {
            Found::Rules(saved) if saved.effective().same_in_kernel(&kernel) => (*saved, false),
            _ => (Layers::of(kernel), true),
        };
        // The counted lists' rules, found by their entries: `list --stats`
        // then shows each list's counters as the daemon would.
        maps.recover_counted(&rules.effective())?;
        Ok(Some(Self {
            shown: identity::pin_dir(&root.shown, &id),
            id,
            maps,
            rules,
            from_kernel,
        }))
    }

    /// Where the pins are, as the operator knows it.
    pub fn shown(&self) -> &std::path::Path {
        &self.shown
    }

    /// Answers a read-only request from the pins.
    pub async fn answer(&self, request: &Request) -> Result<Answer> {
        let iface = self.id.iface.as_str();
        let pins = Some(self.shown.display().to_string());
        let offline = Some(self.offline());
        Ok(match request {
            Request::List { counters } => {
                let list = read::list_of(&self.rules, counters.then_some(&self.maps))?;
                answer::Rules {
                    pins,
                    offline,
                    ..list
                }
                .into()
            }
            Request::Stats => {
                // Rates over a short span, read now.
                let span = Duration::from_millis(500);
                let before = self.maps.counters()?;
                tokio::time::sleep(span).await;
                let after = self.maps.counters()?;
                let stats = read::stats_of(&self.maps, iface, |r| {
                    let (a, b) = (after[r as usize], before[r as usize]);
                    Some((
                        a.packets.saturating_sub(b.packets) as f64 / span.as_secs_f64(),
                        a.bytes.saturating_sub(b.bytes) as f64 / span.as_secs_f64(),
                    ))
                })?;
                answer::Stats {
                    pins,
                    offline,
                    ..stats
                }
                .into()
            }
            Request::Top { n } => {
                let first = read::drops_of(&self.maps, iface)?;
                tokio::time::sleep(TOP_WINDOW).await;
                let second = read::drops_of(&self.maps, iface)?;
                answer::Top {
                    pins,
                    offline,
                    ..read::top_of(&first, second, TOP_WINDOW, *n)
                }
                .into()
            }
            Request::Status => read::status_of(
                &self.maps,
                &self.rules.effective(),
                &self.id,
                self.shown.display().to_string(),
                Teller::Pins {
                    interface: interface_state(iface),
                    note: self.note(),
                    offline: self.offline(),
                },
            )?
            .into(),
            _ => return Err(Error::Refused(self.note())),
        })
    }

    /// How the pins were read.
    fn offline(&self) -> Offline {
        Offline {
            daemon: false,
            rules_from: self.from_kernel.then_some(RulesFrom::Kernel),
        }
    }

    /// What the operator should know: no daemon, where the answer came from,
    /// how to make changes.
    pub fn note(&self) -> String {
        format!(
            "no daemon runs on {}: the program pinned in {} enforces on its own; read from its pinned maps{}. Changes need a daemon: `ratelimit run --iface {}` adopts the program with its rules and buckets",
            self.id,
            self.shown.display(),
            if self.from_kernel {
                " (rules as the kernel holds them: the saved record is missing or differs)"
            } else {
                ""
            },
            self.id.iface
        )
    }
}
