//! The program loaded, attached and pinned for one (network namespace,
//! interface): prepared first (maps loaded or adopted from pins, the program
//! verified), given its rules, and only then attached or swapped into the pinned
//! link, so that a failure at any step leaves whatever enforced before enforcing.

use std::{
    ffi::CString,
    fs,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};
use ratelimit_common::{self as common, PROGRAM_NAME};
use tracing::{info, warn};

use super::{AttachMode, Attached, LINK_PIN, LoadOptions, Maps, sys};
use crate::{
    error::{Error, Result},
    host::identity::{self, Identity},
    host::rundir,
};

/// A program loaded and verified with its maps, not attached yet: give the maps
/// their rules, then [`Prepared::attach`].
pub struct Prepared {
    id: Identity,
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<crate::host::logs::TracingLog>>,
    /// The maps.
    pub maps: Maps,
    dir: PathBuf,
    root: identity::BpfRoot,
    /// The maps are a previous daemon's (from its pins): buckets, counters and
    /// rules carry over.
    pub adopted_maps: bool,
    /// A pinned link on this very interface: the program will be swapped into it.
    live_link: bool,
    /// That link is an earlier version's, pinned in this directory under an
    /// older layout ([`identity::OLDER_LAYOUTS`]): the upgrade swaps the
    /// program into it and removes that version's pins.
    older: Option<(&'static str, PathBuf)>,
    ifindex: u32,
}

/// The program attached and pinned for one interface.
pub struct Enforcer {
    id: Identity,
    mode: Attached,
    /// Present while the link is pinned; `None` once released.
    link: Option<PinnedLink>,
    /// The link's id: the truth about what is attached is asked of it, not
    /// of its pin (which someone may remove).
    link_id: u32,
    /// The daemon's own handle on the link, opened from its pin the moment
    /// it was pinned: what the interface checks and a pin put back ask the
    /// kernel through. Opening a link by its id needs `CAP_SYS_ADMIN`, which
    /// the unit does not grant (with its three capabilities every check
    /// read "not attached" while the program enforced). Closed with the
    /// link: a detach must leave no handle holding it.
    link_fd: Option<OwnedFd>,
    /// Keeps the program's fd (and so the maps' fds) open.
    ebpf: Ebpf,
    /// Reads the program's aya-log records (see [`crate::host::logs`]).
    logger: Option<aya_log::EbpfLogger<crate::host::logs::TracingLog>>,
    /// The maps.
    pub maps: Maps,
    /// Whether the maps are a previous daemon's: its rules, buckets and
    /// counters carried over.
    pub adopted: bool,
    /// Whether the program was swapped into a previous daemon's live link (no
    /// moment without enforcement), rather than attached anew.
    pub took_over_link: bool,
    /// The older pin layout whose program it replaced (an upgrade), if any.
    pub upgraded_from: Option<&'static str>,
    /// The interface index the program is attached to.
    ifindex: u32,
    dir: PathBuf,
    root: identity::BpfRoot,
}

/// Whether the interface is still the one the program is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterfaceState {
    /// Attached to it.
    Attached,
    /// The interface is gone: nothing is enforced until it comes back.
    Gone,
    /// An interface of that name is back, a new one: the program must be
    /// attached to it.
    Recreated,
}

fn ifindex(iface: &str) -> u32 {
    let Ok(name) = CString::new(iface) else {
        return 0;
    };
    // SAFETY: a valid C string.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// The link pinned at `path`, or `None` if there is no such link.
fn open_pinned(path: &Path) -> Option<OwnedFd> {
    sys::obj_get(path).ok()
}

/// An XDP link's id and interface index (0 once its interface is gone).
fn link_info(fd: &OwnedFd) -> Option<(u32, u32)> {
    sys::xdp_link_info(fd.as_fd()).ok()
}

/// The interface index of the XDP link pinned at `path` (0 once its interface
/// is gone), or `None` if there is no such link.
fn pinned_link_ifindex(path: &Path) -> Option<u32> {
    open_pinned(path)
        .and_then(|fd| link_info(&fd))
        .map(|(_, i)| i)
}

impl Enforcer {
    /// Loads and verifies the program for `id`, its maps adopted from a previous
    /// daemon's pins (unless `reset`, or there are none) or created with the
    /// sizes of `opts`. Nothing is attached, and nothing pinned changes.
    pub fn prepare(id: &Identity, opts: &LoadOptions, reset: bool) -> Result<Prepared> {
        let iface = &id.iface;
        if iface.is_empty() || iface.len() >= libc::IFNAMSIZ || iface.contains('/') {
            return Err(Error::UnknownInterface(iface.clone()));
        }
        let index = ifindex(iface);
        if index == 0 {
            return Err(Error::UnknownInterface(iface.clone()));
        }
        let root = identity::bpffs_root()?;
        let dir = identity::pin_dir(&root.path, id);
        fs::create_dir_all(&dir).map_err(Error::io(format!(
            "creating {} (is bpffs mounted at /sys/fs/bpf?)",
            identity::pin_dir(&root.shown, id).display()
        )))?;
        // A start that fails from here leaves no empty pin directory behind.
        let mut fresh_dir = EmptyDirGuard(Some(dir.clone()));
        let pinned_maps = common::PINNED_MAPS.iter().all(|m| dir.join(m).exists());
        let adopt_maps = pinned_maps && !reset;
        let mut loader = if adopt_maps {
            LoadOptions::from_pins(&dir)?.loader()
        } else {
            opts.loader()
        };
        if adopt_maps {
            for name in common::PINNED_MAPS {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader.load(crate::EBPF_OBJECT).map_err(Error::Load)?;
        // Fresh maps take the table's split from the options; adopted ones
        // from their config.
        let maps = Maps::from_ebpf(
            &mut ebpf,
            (!adopt_maps).then(|| common::state_lines(opts.state_capacity)),
        )?;
        let logger =
            match aya_log::EbpfLogger::init_with_logger(&mut ebpf, crate::host::logs::TracingLog) {
                Ok(l) => Some(l),
                Err(e) => {
                    warn!(error = %e, "the XDP program's log records will not be forwarded");
                    None
                }
            };
        program(&mut ebpf)?
            .load()
            .map_err(|source| Error::Program {
                op: "loading the XDP program (the verifier's log is in the source chain)",
                source,
            })?;
        let live_link = match pinned_link_ifindex(&dir.join(LINK_PIN)) {
            Some(i) if i == index => true,
            Some(i) => {
                warn!(
                    iface = %id,
                    pinned = i,
                    now = index,
                    "the pinned link leads to an interface that is gone (deleted or re-created): attaching anew"
                );
                false
            }
            None => false,
        };
        // An earlier version's program enforcing here, kept attached: the
        // upgrade takes its link (its maps' layout is not this one's).
        let older = if live_link {
            None
        } else {
            identity::OLDER_LAYOUTS
                .iter()
                .filter(|&&l| l != identity::pin_layout())
                .find_map(|&layout| {
                    let old = identity::pin_dir_of(&root.path, id, layout);
                    (pinned_link_ifindex(&old.join(LINK_PIN)) == Some(index))
                        .then_some((layout, old))
                })
        };
        let live_link = live_link || older.is_some();
        fresh_dir.0 = None;
        Ok(Prepared {
            id: id.clone(),
            ebpf,
            logger,
            maps,
            dir,
            root,
            adopted_maps: adopt_maps,
            live_link,
            older,
            ifindex: index,
        })
    }
}

/// Removes a pin directory (and its namespace directory) on drop if they are
/// empty, unless disarmed (`None`).
struct EmptyDirGuard(Option<PathBuf>);

impl Drop for EmptyDirGuard {
    fn drop(&mut self) {
        if let Some(dir) = &self.0
            && fs::remove_dir(dir).is_ok()
        {
            remove_empty_parents(dir);
        }
    }
}

/// Removes the directories above a pin directory that are left empty: its
/// namespace's, its layout's and `ratelimit/` itself (each fails while
/// anything else is pinned in it, and nothing above `ratelimit/` is touched).
fn remove_empty_parents(dir: &Path) {
    let mut at = dir.parent();
    for _ in 0..3 {
        match at {
            Some(p) if fs::remove_dir(p).is_ok() => at = p.parent(),
            _ => return,
        }
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(PROGRAM_NAME)
        .ok_or_else(|| Error::Program {
            op: "finding the XDP program in the object",
            source: aya::programs::ProgramError::UnexpectedProgramType,
        })?
        .try_into()
        .map_err(|source| Error::Program {
            op: "typing the XDP program",
            source,
        })
}

impl Prepared {
    /// Whether attaching will take over a previous daemon's live link.
    pub fn will_adopt(&self) -> bool {
        self.live_link
    }

    /// The rules a previous daemon's pinned maps hold (`None`: no pins): the
    /// adopted maps', or with `--reset` those of the pins about to be replaced.
    pub fn pinned_rules(&self) -> Option<Result<crate::model::rules::RuleSet>> {
        if self.adopted_maps {
            return Some(self.maps.rule_set());
        }
        if !common::PINNED_MAPS
            .iter()
            .all(|m| self.dir.join(m).exists())
        {
            return None;
        }
        Some(Maps::from_pins(&self.dir).and_then(|m| m.rule_set()))
    }

    /// Attaches the program: swapped atomically into the pinned link of a
    /// previous daemon (no moment without enforcement), else attached anew in
    /// `mode`; then pins the link and, if they are new, the maps.
    pub fn attach(mut self, mode: AttachMode) -> Result<Enforcer> {
        let link_path = self.dir.join(LINK_PIN);
        // The link to take over: this layout's, or an earlier version's.
        let live_path = match &self.older {
            Some((_, old)) => old.join(LINK_PIN),
            None => link_path.clone(),
        };
        let program = program(&mut self.ebpf)?;
        let (link, mode) = if self.live_link {
            let pinned = PinnedLink::from_pin(&live_path).map_err(|source| Error::Link {
                path: link_path.clone(),
                source,
            })?;
            let fd_link: FdLink = pinned.into();
            let id = program
                .attach_to_link(XdpLink::try_from(fd_link).map_err(|source| Error::Link {
                    path: live_path.clone(),
                    source,
                })?)
                .map_err(|source| Error::Program {
                    op: "replacing the program in the pinned link",
                    source,
                })?;
            let link = program.take_link(id).map_err(|source| Error::Program {
                op: "taking the XDP link",
                source,
            })?;
            // Our fd now holds the link: replace the old pin with ours.
            fs::remove_file(&live_path)
                .map_err(Error::io(format!("replacing {}", live_path.display())))?;
            (pin_link(link, &link_path)?, read_mode(&self.id))
        } else {
            let (id, mode) = attach(program, &self.id.iface, mode)?;
            let link = program.take_link(id).map_err(|source| Error::Program {
                op: "taking the XDP link",
                source,
            })?;
            // A stale pin (its interface gone) goes; the program is attached now.
            let _ = fs::remove_file(&link_path);
            (pin_link(link, &link_path)?, mode)
        };
        if !self.adopted_maps {
            self.maps.pin(&self.dir)?;
        }
        if let Some((layout, old)) = &self.older {
            // The earlier version's maps: read by nothing now (its program
            // was replaced), freed once unpinned.
            match fs::remove_dir_all(old) {
                Ok(()) => remove_empty_parents(old),
                Err(e) => {
                    warn!(dir = %old.display(), error = %e, "the earlier version's pins could not all be removed (remove them by hand: nothing reads them)")
                }
            }
            info!(
                layout,
                "upgraded: the program of an earlier version (pin layout {layout}) was replaced in its link, with no moment without a program; rules come from the daemon's record, buckets and counters start anew"
            );
        }
        write_mode(&self.id, mode);
        Ok(Enforcer {
            adopted: self.adopted_maps,
            took_over_link: self.live_link,
            upgraded_from: self.older.as_ref().map(|(l, _)| *l),
            id: self.id,
            mode,
            link_id: link.1,
            link_fd: Some(link.2),
            link: Some(link.0),
            ebpf: self.ebpf,
            logger: self.logger,
            maps: self.maps,
            ifindex: self.ifindex,
            dir: self.dir,
            root: self.root,
        })
    }
}

impl Enforcer {
    /// Takes the program's log reader, to be polled by the daemon.
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<crate::host::logs::TracingLog>> {
        self.logger.take()
    }

    /// Who this is.
    pub fn id(&self) -> &Identity {
        &self.id
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.id.iface
    }

    /// The attach mode.
    pub fn mode(&self) -> Attached {
        self.mode
    }

    /// The pin directory, as the operator finds it.
    pub fn pin_dir(&self) -> PathBuf {
        identity::pin_dir(&self.root.shown, &self.id)
    }

    /// Whether the program is still attached to the interface of its name,
    /// asked of the link itself.
    pub fn check_interface(&self) -> InterfaceState {
        let now = ifindex(&self.id.iface);
        let linked = self
            .link_fd
            .as_ref()
            .and_then(link_info)
            .filter(|(id, _)| *id == self.link_id)
            .map_or(0, |(_, i)| i);
        if now == 0 {
            InterfaceState::Gone
        } else if now != self.ifindex || linked != now {
            InterfaceState::Recreated
        } else {
            InterfaceState::Attached
        }
    }

    /// Pins again what was removed from under the daemon (say, an
    /// operator's `rm -r` of its pin directory): the link and every map, from
    /// the daemon's own handles, so that a restart still adopts them and a
    /// `--keep-attached` exit still leaves them enforcing. Whether anything
    /// had to be pinned again.
    pub fn check_pins(&mut self) -> Result<bool> {
        if self.link.is_none() {
            return Ok(false);
        }
        let link_path = self.dir.join(LINK_PIN);
        let link_ok = open_pinned(&link_path)
            .and_then(|fd| link_info(&fd))
            .is_some_and(|(id, _)| id == self.link_id);
        let maps_ok = common::PINNED_MAPS
            .iter()
            .all(|m| self.dir.join(m).exists());
        if link_ok && maps_ok {
            return Ok(false);
        }
        let shown = self.pin_dir();
        fs::create_dir_all(&self.dir)
            .map_err(Error::io(format!("creating {}", shown.display())))?;
        if !link_ok {
            let fd = self.link_fd.as_ref().ok_or_else(|| Error::Io {
                what: format!(
                    "pinning the XDP link {} again: no handle on it",
                    self.link_id
                ),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?;
            let _ = fs::remove_file(&link_path);
            sys::obj_pin(fd.as_fd(), &link_path).map_err(Error::io(format!(
                "pinning the XDP link again at {}",
                shown.join(LINK_PIN).display()
            )))?;
        }
        if !maps_ok {
            self.maps.pin(&self.dir)?;
        }
        Ok(true)
    }

    /// Attaches the program anew to the interface of its name (it was deleted
    /// and re-created), in the mode it ran in; the maps (rules, buckets) carry
    /// over.
    pub fn reattach(&mut self) -> Result<()> {
        let mode = match self.mode {
            Attached::Native => AttachMode::Native,
            Attached::Generic => AttachMode::Generic,
        };
        let link_path = self.dir.join(LINK_PIN);
        let program = program(&mut self.ebpf)?;
        let (id, mode) = attach(program, &self.id.iface, mode)?;
        let link = program.take_link(id).map_err(|source| Error::Program {
            op: "taking the XDP link",
            source,
        })?;
        if let Some(old) = self.link.take() {
            let _ = old.unpin();
        }
        self.link_fd = None;
        let _ = fs::remove_file(&link_path);
        let (pinned, id, fd) = pin_link(link, &link_path)?;
        self.link = Some(pinned);
        self.link_id = id;
        self.link_fd = Some(fd);
        self.mode = mode;
        self.ifindex = ifindex(&self.id.iface);
        write_mode(&self.id, mode);
        Ok(())
    }

    /// Detaches the program and removes every pin of the interface.
    pub fn detach(mut self) -> Result<()> {
        if let Some(link) = self.link.take() {
            let link = link.unpin().map_err(Error::io("unpinning the XDP link"))?;
            drop(link);
        }
        // The last handle: the link goes with it.
        self.link_fd = None;
        rundir::remove(&rundir::file(&self.id, "mode"));
        remove_pins(&self.dir)
    }

    /// Leaves the program attached and pinned: it keeps enforcing after exit.
    pub fn keep(mut self) {
        drop(self.link.take());
        self.link_fd = None;
    }
}

fn write_mode(id: &Identity, mode: Attached) {
    let path = rundir::file(id, "mode");
    if let Err(e) = rundir::write_atomic(&path, mode.to_string().as_bytes()) {
        warn!(path = %path.display(), error = %e, "could not record the attach mode");
    }
}

fn read_mode(id: &Identity) -> Attached {
    rundir::read(&rundir::file(id, "mode"))
        .ok()
        .flatten()
        .and_then(|s| Attached::parse(&s))
        .unwrap_or(Attached::Native)
}

/// Pins `link` at `path`; the pinned link, its id, and a handle of the
/// daemon's own on it (opened from the pin, which needs no more than the
/// pin's own access).
fn pin_link(link: XdpLink, path: &Path) -> Result<(PinnedLink, u32, OwnedFd)> {
    let fd_link = FdLink::try_from(link).map_err(|source| Error::Link {
        path: path.to_path_buf(),
        source,
    })?;
    let id = fd_link
        .info()
        .map_err(|source| Error::Link {
            path: path.to_path_buf(),
            source,
        })?
        .id();
    let pinned = fd_link.pin(path).map_err(|source| Error::Pin {
        path: path.to_path_buf(),
        source,
    })?;
    match sys::obj_get(path) {
        Ok(fd) => Ok((pinned, id, fd)),
        Err(e) => {
            // Not left pinned: the caller's error path owns nothing else.
            let _ = pinned.unpin();
            Err(Error::io(format!(
                "opening the XDP link just pinned at {}",
                path.display()
            ))(e))
        }
    }
}

fn attach(
    program: &mut Xdp,
    iface: &str,
    mode: AttachMode,
) -> Result<(aya::programs::xdp::XdpLinkId, Attached)> {
    let native = |p: &mut Xdp| p.attach(iface, XdpMode::Driver);
    let generic = |p: &mut Xdp| p.attach(iface, XdpMode::Skb);
    let err = |mode: &'static str| {
        move |source| Error::Attach {
            iface: iface.to_string(),
            mode,
            source,
        }
    };
    match mode {
        AttachMode::Native => Ok((native(program).map_err(err("native"))?, Attached::Native)),
        AttachMode::Generic => Ok((generic(program).map_err(err("generic"))?, Attached::Generic)),
        AttachMode::Auto => match native(program) {
            Ok(id) => Ok((id, Attached::Native)),
            Err(e) => {
                warn!(iface, error = %e, "native XDP attach failed; falling back to generic (skb) mode, which runs later and costs more per packet");
                Ok((generic(program).map_err(err("generic"))?, Attached::Generic))
            }
        },
    }
}

/// Removes a pin directory and everything in it, and its namespace's directory
/// if that is left empty.
pub fn remove_pins(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {
            remove_empty_parents(dir);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::Io {
            what: format!("removing {}", dir.display()),
            source: e,
        }),
    }
}
