//! `cargo xtask deb [--out DIR]`: a Debian package of the release binary,
//! `ratelimit_VERSION_ARCH.deb` (the version of the workspace's Cargo.toml,
//! the architecture `dpkg --print-architecture` names), built with
//! `dpkg-deb --build --root-owner-group` from a staging tree under
//! `target/deb-stage/`. It holds:
//!
//! | what | where |
//! |---|---|
//! | the binary (stripped as `dh_strip` does; the eBPF object is in it) | `/usr/bin/ratelimit` |
//! | the service's binary (stripped), which `ratelimit serve` runs | `/usr/bin/ratelimit-serve` |
//! | its man pages (`ratelimit man --out`), `gzip -9n` | `/usr/share/man/man8/` (`man5/` for `.5` pages) |
//! | its completions (`ratelimit completions SHELL`) | `/usr/share/bash-completion/completions/ratelimit`, `/usr/share/zsh/vendor-completions/_ratelimit`, `/usr/share/fish/vendor_completions.d/ratelimit.fish` |
//! | `dist/ratelimit@.service`, `ExecStart=/usr/bin/ratelimit …` | `/usr/lib/systemd/system/ratelimit@.service` |
//! | `dist/ratelimit-serve.service`, `ExecStart=/usr/bin/ratelimit-serve …` | `/usr/lib/systemd/system/ratelimit-serve.service` |
//! | `examples/ratelimit.toml` (a conffile) | `/etc/ratelimit/ratelimit.toml` |
//! | `dist/fail2ban/ratelimit.conf`, `ratelimit = /usr/bin/ratelimit` (a conffile) | `/etc/fail2ban/action.d/ratelimit.conf` |
//! | `copyright`, `changelog.gz` (CHANGELOG.md), `README.md` | `/usr/share/doc/ratelimit/` |
//! | `dist/deb/postinst`, `dist/deb/postrm` (`systemctl daemon-reload`) | `DEBIAN/` |
//!
//! `Depends` is what `dpkg-shlibdeps` says of the two binaries (from `readelf -d`
//! and `objdump -T` when dpkg-dev is not installed); `Installed-Size` is
//! counted as `dpkg-gencontrol` counts it.
//!
//! [`check`] (`cargo xtask deb --check`, and a step of `cargo xtask test`)
//! builds the package from a binary already built, installs it with dpkg into
//! a scratch root (never `/`), checks every file, the conffiles, the unit
//! (`systemd-analyze verify`) and the binary, then removes and purges it and
//! checks what is left each time.

use std::{
    collections::BTreeSet,
    env, fs,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{install, is_root, workspace_root};

/// The package's name.
const PACKAGE: &str = "ratelimit";
/// Where `cargo xtask deb` writes the package, under the workspace root.
pub(crate) const DEFAULT_OUT: &str = "target/deb";
/// The staging directory, under the workspace root: `debian/control` (for
/// dpkg-shlibdeps) and `debian/ratelimit/`, the package's tree.
const STAGE: &str = "target/deb-stage";

/// The binary, as installed.
const BIN: &str = "/usr/bin/ratelimit";
/// The service's binary, as installed.
const SERVE_BIN: &str = "/usr/bin/ratelimit-serve";
/// The daemon's unit, as installed.
const UNIT: &str = "/usr/lib/systemd/system/ratelimit@.service";
/// The service's unit, as installed.
const SERVE_UNIT: &str = "/usr/lib/systemd/system/ratelimit-serve.service";
/// The example config, as installed (the unit reads `/etc/ratelimit/IFACE.toml`:
/// this is the file to copy there).
const CONFIG: &str = "/etc/ratelimit/ratelimit.toml";
/// The fail2ban action, as installed.
const FAIL2BAN: &str = "/etc/fail2ban/action.d/ratelimit.conf";
/// The fail2ban action, as shipped (the only file of its directory).
const FAIL2BAN_SRC: &str = "dist/fail2ban/ratelimit.conf";
/// The example config, as shipped.
const CONFIG_SRC: &str = "examples/ratelimit.toml";
/// The maintainer scripts, as shipped (in `dist/deb/`).
const SCRIPTS: [&str; 2] = ["postinst", "postrm"];

/// The conffiles: dpkg keeps them on a removal (not a purge) and never
/// overwrites one the operator changed.
const CONFFILES: [&str; 2] = [CONFIG, FAIL2BAN];

/// Where each shell's completions go: the places bash-completion, zsh (as
/// Debian builds it) and fish look in for packages' files.
const COMPLETIONS: [(&str, &str); 3] = [
    ("bash", "/usr/share/bash-completion/completions/ratelimit"),
    ("zsh", "/usr/share/zsh/vendor-completions/_ratelimit"),
    (
        "fish",
        "/usr/share/fish/vendor_completions.d/ratelimit.fish",
    ),
];

/// The package's documentation directory.
const DOC: &str = "/usr/share/doc/ratelimit";

/// Files the package must hold, with their modes (one man page per command
/// comes on top of these two, and the file formats' pages).
const EXPECTED: [(&str, u32); 16] = [
    (BIN, 0o755),
    (SERVE_BIN, 0o755),
    ("/usr/share/man/man8/ratelimit.8.gz", 0o644),
    ("/usr/share/man/man8/ratelimit-run.8.gz", 0o644),
    ("/usr/share/man/man5/ratelimit.toml.5.gz", 0o644),
    ("/usr/share/man/man5/ratelimit-serve.toml.5.gz", 0o644),
    (COMPLETIONS[0].1, 0o644),
    (COMPLETIONS[1].1, 0o644),
    (COMPLETIONS[2].1, 0o644),
    (UNIT, 0o644),
    (SERVE_UNIT, 0o644),
    (CONFIG, 0o644),
    (FAIL2BAN, 0o644),
    ("/usr/share/doc/ratelimit/copyright", 0o644),
    ("/usr/share/doc/ratelimit/changelog.gz", 0o644),
    ("/usr/share/doc/ratelimit/README.md", 0o644),
];

/// The control file's `Description`: a synopsis and a paragraph.
const DESCRIPTION: &str = "\
Description: per-source packet rate limiter at the NIC driver (XDP)
 ratelimit gives every source address (or /24, /64, ...) a token bucket in
 an XDP program attached at the network card's driver, and drops what
 exceeds it before the kernel spends anything on it. Its daemon loads the
 program, takes live changes from the command line (limits, allow and deny
 rules, temporary bans, block lists), keeps its state across restarts and
 exports counters and Prometheus metrics.
 .
 One daemon per interface: the systemd template unit ratelimit@IFACE reads
 /etc/ratelimit/IFACE.toml. A fail2ban action is included. It needs Linux
 5.12 or later with BTF.
";

/// What dpkg-shlibdeps needs to find in `debian/control`.
const SHLIBDEPS_CONTROL: &str = "Source: ratelimit\n\nPackage: ratelimit\nArchitecture: any\n";

/// What the workspace's Cargo.toml says of the package.
#[derive(Debug, Clone)]
struct Meta {
    /// The crate's version, as `ratelimit --version` prints it.
    version: String,
    authors: Vec<String>,
    repository: Option<String>,
    /// An SPDX expression (`MIT OR Apache-2.0`).
    license: String,
}

/// A package `cargo xtask deb` wrote.
pub(crate) struct Built {
    /// The `.deb`.
    pub(crate) path: PathBuf,
    /// Its `Version` (Debian's form of the crate's version).
    version: String,
    /// The crate's version.
    crate_version: String,
    /// Its `Depends`.
    depends: String,
}

/// Builds the package from `bin` (a release build of `ratelimit`) into `out`.
pub(crate) fn build(bin: &Path, out: &Path) -> Result<Built> {
    for tool in ["dpkg", "dpkg-deb", "gzip", "strip"] {
        need(tool)?;
    }
    let meta = meta()?;
    let arch = output(
        Command::new("dpkg").arg("--print-architecture"),
        "dpkg --print-architecture",
    )?
    .trim()
    .to_string();
    let version = debian_version(&meta.version);
    let work = workspace_root().join(STAGE);
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let tree = work.join("debian").join(PACKAGE);
    stage(bin, &tree, &work, &meta)?;

    // Directories 0755, files 0644 or 0755, whatever the umask was.
    // `Installed-Size` counts the tree's top directory too, as
    // dpkg-gencontrol does.
    let mut entries = vec![Entry::Other];
    for path in walk(&tree)? {
        let full = tree.join(path);
        let md = fs::symlink_metadata(&full)?;
        if md.is_dir() {
            fs::set_permissions(&full, fs::Permissions::from_mode(0o755))?;
            entries.push(Entry::Other);
        } else {
            let mode = md.permissions().mode() & 0o7777;
            ensure!(
                md.is_file() && (mode == 0o644 || mode == 0o755),
                "{} is not a plain file of mode 0644 or 0755 ({mode:o})",
                full.display()
            );
            entries.push(Entry::File(md.len()));
        }
    }
    let installed_size = installed_size(entries);

    fs::write(work.join("debian/control"), SHLIBDEPS_CONTROL)?;
    // dpkg-shlibdeps finds the package's root by its DEBIAN directory.
    let debian = tree.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    let depends = depends(
        &work,
        &[
            format!("debian/{PACKAGE}{BIN}"),
            format!("debian/{PACKAGE}{SERVE_BIN}"),
        ],
    )?;

    let maintainer = maintainer(&meta);
    let control = control(&Control {
        version: &version,
        arch: &arch,
        maintainer: &maintainer,
        installed_size,
        depends: &depends,
        homepage: meta.repository.as_deref(),
    });
    install::put(&debian.join("control"), control.as_bytes(), 0o644)?;
    install::put(&debian.join("conffiles"), conffiles().as_bytes(), 0o644)?;
    for script in SCRIPTS {
        let src = workspace_root().join("dist/deb").join(script);
        install::put(&debian.join(script), &read(&src)?, 0o755)?;
    }
    fs::set_permissions(&debian, fs::Permissions::from_mode(0o755))?;

    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(format!("{PACKAGE}_{version}_{arch}.deb"));
    let packed = Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group"])
        .arg(&tree)
        .arg(&path)
        .output()
        .context("running dpkg-deb")?;
    // Its warnings (a field it finds wrong) are shown, not swallowed.
    let warnings = String::from_utf8_lossy(&packed.stderr);
    ensure!(
        packed.status.success(),
        "dpkg-deb --build failed ({}): {warnings}",
        packed.status
    );
    if !warnings.trim().is_empty() {
        eprintln!("{}", warnings.trim_end());
    }
    eprintln!(
        "xtask: deb: {} ({version}, {arch}, Installed-Size {installed_size} KiB, Depends: {depends})",
        path.display()
    );
    Ok(Built {
        path,
        version,
        crate_version: meta.version,
        depends,
    })
}

/// Writes the package's files into `tree` (`work` holds what is made on the
/// way: the man pages before gzip).
fn stage(bin: &Path, tree: &Path, work: &Path, meta: &Meta) -> Result<()> {
    let root = workspace_root();
    let at = |p: &str| tree.join(p.trim_start_matches('/'));

    let staged = at(BIN);
    fs::create_dir_all(staged.parent().context("a directory")?)?;
    // What dh_strip does to an executable: the symbol table goes (4 MB), the
    // build id stays.
    for (from, to) in [
        (bin.to_path_buf(), staged.clone()),
        (install::serve_bin(bin), at(SERVE_BIN)),
    ] {
        output(
            Command::new("strip")
                .args(["--remove-section=.comment", "--remove-section=.note", "-o"])
                .arg(&to)
                .arg(&from),
            "strip",
        )?;
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755))?;
    }

    let man = work.join("man");
    install::man_pages(&staged, &man)?;
    let mut pages: Vec<PathBuf> = fs::read_dir(&man)
        .with_context(|| format!("reading {}", man.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    pages.sort();
    ensure!(!pages.is_empty(), "`ratelimit man` wrote no page");
    for page in pages {
        let name = page
            .file_name()
            .and_then(|n| n.to_str())
            .context("a man page's name")?;
        let section = man_section(name)
            .with_context(|| format!("`ratelimit man` wrote {name}: not a .5 or .8 page"))?;
        gzip(
            &page,
            &at(&format!("/usr/share/man/man{section}/{name}.gz")),
        )?;
    }

    for (shell, path) in COMPLETIONS {
        install::put(&at(path), &install::completion(&staged, shell)?, 0o644)?;
    }

    for (shipped, installed) in [(install::UNIT, UNIT), (install::SERVE_UNIT, SERVE_UNIT)] {
        let unit = String::from_utf8(read(&root.join(shipped))?)
            .with_context(|| format!("{shipped} is not UTF-8"))?;
        install::put(
            &at(installed),
            install::unit_for(&unit, Path::new(BIN))?.as_bytes(),
            0o644,
        )?;
    }

    install::put(&at(CONFIG), &read(&root.join(CONFIG_SRC))?, 0o644)?;

    let fail2ban_dir = root.join("dist/fail2ban");
    let mut shipped: Vec<String> = fs::read_dir(&fail2ban_dir)
        .with_context(|| format!("reading {}", fail2ban_dir.display()))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    shipped.sort();
    ensure!(
        shipped == ["ratelimit.conf"],
        "dist/fail2ban/ holds {shipped:?}: say where each file goes in xtask/src/deb.rs"
    );
    let action = String::from_utf8(read(&root.join(FAIL2BAN_SRC))?)
        .with_context(|| format!("{FAIL2BAN_SRC} is not UTF-8"))?;
    install::put(&at(FAIL2BAN), fail2ban_action(&action)?.as_bytes(), 0o644)?;

    let doc = at(DOC);
    install::put(&doc.join("copyright"), copyright(meta)?.as_bytes(), 0o644)?;
    gzip(&root.join("CHANGELOG.md"), &doc.join("changelog.gz"))?;
    install::put(
        &doc.join("README.md"),
        &read(&root.join("README.md"))?,
        0o644,
    )?;
    Ok(())
}

/// Installs the package built from `bin` into a scratch root, checks it,
/// removes and purges it (see the module's documentation). As root only:
/// skipped (loudly) otherwise, but not when `CI` is set.
pub(crate) fn check(bin: &Path, out: &Path) -> Result<()> {
    if !is_root() {
        if env::var_os("CI").is_some() {
            bail!(
                "CI is set but this is not root: the .deb check (dpkg -i into a scratch root) must run"
            );
        }
        eprintln!("xtask: SKIPPED (needs root): the .deb check (dpkg -i into a scratch root)");
        return Ok(());
    }
    need("dpkg-query")?;
    eprintln!("xtask: deb: building the package from {}", bin.display());
    let built = build(bin, out)?;
    let scratch =
        Scratch::new(env::temp_dir().join(format!("ratelimit-deb-check-{}", std::process::id())))?;
    eprintln!(
        "xtask: deb: checking {} in the scratch root {}",
        built.path.display(),
        scratch.root.display()
    );
    match checks(&built, &scratch) {
        Ok(()) => {
            fs::remove_dir_all(&scratch.dir)
                .with_context(|| format!("removing {}", scratch.dir.display()))?;
            eprintln!("xtask: deb: all checks passed: {}", built.path.display());
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "xtask: deb: FAILED; the scratch root is left in {}",
                scratch.dir.display()
            );
            Err(e.context(format!("the .deb check of {}", built.path.display())))
        }
    }
}

/// The checks of [`check`], in order.
fn checks(built: &Built, s: &Scratch) -> Result<()> {
    let ok = |what: &str| eprintln!("xtask: deb: ok: {what}");

    for dep in built
        .depends
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        ensure!(
            host_satisfies(dep)?,
            "this host does not satisfy the package's dependency {dep}, yet runs the binary"
        );
    }
    ok(&format!("this host satisfies Depends: {}", built.depends));

    // The scratch database has none of the dependencies (checked above on
    // the host instead); scripts run outside the root (it has no shell),
    // with DPKG_ROOT set, where they do nothing.
    s.dpkg(&["--force-depends", "--install"], Some(&built.path))?;
    let status = s.query("${Status} ${Version}")?;
    ensure!(
        status == format!("install ok installed {}", built.version),
        "after dpkg -i: status and version {status:?}"
    );
    ok(&format!("dpkg -i: {status}"));

    for (path, mode) in EXPECTED {
        let md = fs::symlink_metadata(s.path(path))
            .with_context(|| format!("{path} is not installed"))?;
        ensure!(md.is_file() && md.len() > 0, "{path}: not a non-empty file");
        let got = md.mode() & 0o7777;
        ensure!(got == mode, "{path}: mode {got:o}, not {mode:o}");
        ensure!(md.uid() == 0 && md.gid() == 0, "{path}: not owned by root");
    }
    ok(&format!(
        "the {} expected files, non-empty, with their modes",
        EXPECTED.len()
    ));

    let listed = s.list()?;
    let mut man_pages = 0;
    for path in &listed {
        let full = s.path(path);
        let md = fs::symlink_metadata(&full)
            .with_context(|| format!("dpkg -L lists {path}, which is not there"))?;
        let want = if md.is_dir() || path.starts_with("/usr/bin/") {
            0o755
        } else {
            0o644
        };
        ensure!(
            md.is_dir() || md.is_file(),
            "{path}: neither a file nor a directory"
        );
        let got = md.mode() & 0o7777;
        ensure!(got == want, "{path}: mode {got:o}, not {want:o}");
        ensure!(md.uid() == 0 && md.gid() == 0, "{path}: not owned by root");
        if path.starts_with("/usr/share/man/") && md.is_file() {
            ensure!(path.ends_with(".gz"), "{path}: a man page not gzipped");
            man_pages += 1;
        }
        if md.is_file() && path.ends_with(".gz") {
            output(
                Command::new("gzip").arg("-t").arg(&full),
                &format!("gzip -t {path}"),
            )?;
        }
    }
    ok(&format!(
        "every path dpkg -L lists ({}) is there, owned by root, dirs 0755, files 0644 (0755 in /usr/bin); {man_pages} man pages, gzip -t passes",
        listed.len()
    ));

    let verify = s.dpkg(&["--verify", PACKAGE], None)?;
    ensure!(verify.trim().is_empty(), "dpkg --verify: {verify}");
    ok("dpkg --verify (every file's md5sum)");

    let registered = parse_conffiles(&s.query("${Conffiles}")?);
    let want: BTreeSet<String> = CONFFILES.iter().map(|c| c.to_string()).collect();
    ensure!(
        registered == want,
        "conffiles registered: {registered:?}, not {want:?}"
    );
    ok(&format!("conffiles registered: {}", CONFFILES.join(", ")));

    let unit = fs::read_to_string(s.path(UNIT))?;
    let exec = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))
        .context("the installed unit has no ExecStart=")?;
    ensure!(
        exec.starts_with(&format!("{BIN} run --iface %i ")),
        "the installed unit's ExecStart={exec}"
    );
    let action = fs::read_to_string(s.path(FAIL2BAN))?;
    ensure!(
        !unit.contains("/usr/local/") && action.contains(&format!("ratelimit = {BIN}\n")),
        "the unit or the fail2ban action still names /usr/local, or the action is not pointed at {BIN}"
    );
    ok(&format!("ExecStart={exec}; the fail2ban action runs {BIN}"));

    verify_unit(s, &unit, "ratelimit@eth0.service")?;

    let serve_unit = fs::read_to_string(s.path(SERVE_UNIT))?;
    let exec = serve_unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))
        .context("the installed service unit has no ExecStart=")?;
    ensure!(
        exec == format!("{SERVE_BIN} $SERVE_ARGS") && !serve_unit.contains("/usr/local/"),
        "the installed service unit's ExecStart={exec}"
    );
    ok(&format!("the service's ExecStart={exec}"));
    verify_unit(s, &serve_unit, "ratelimit-serve.service")?;

    let installed_bin = s.path(BIN);
    let version = output(
        Command::new(&installed_bin).arg("--version"),
        "ratelimit --version",
    )?;
    ensure!(
        version.trim() == format!("ratelimit {}", built.crate_version),
        "ratelimit --version printed {version:?}, the package is {}",
        built.version
    );
    ok(&format!("{BIN} --version: {}", version.trim()));
    let serve_version = output(
        Command::new(s.path(SERVE_BIN)).arg("--version"),
        "ratelimit-serve --version",
    )?;
    ensure!(
        serve_version.trim() == format!("ratelimit-serve {}", built.crate_version),
        "ratelimit-serve --version printed {serve_version:?}, the package is {}",
        built.version
    );
    ok(&format!("{SERVE_BIN} --version: {}", serve_version.trim()));
    let config = s.path(CONFIG);
    let checked = output(
        Command::new(&installed_bin)
            .args(["check", "--config"])
            .arg(&config),
        &format!("ratelimit check --config {}", config.display()),
    )?;
    ok(&format!(
        "ratelimit check --config {CONFIG}: {}",
        checked.trim()
    ));

    s.dpkg(&["--remove", PACKAGE], None)?;
    let status = s.query("${Status}")?;
    ensure!(
        status == "deinstall ok config-files",
        "after dpkg -r: status {status:?}"
    );
    let left = s.files()?;
    let problems = after_removal(&left, &CONFFILES);
    ensure!(
        problems.is_empty(),
        "after dpkg -r: {}",
        problems.join("; ")
    );
    ok(&format!(
        "dpkg -r: {status}; only the conffiles and their directories are left ({} paths)",
        left.len()
    ));

    s.dpkg(&["--purge", PACKAGE], None)?;
    let left = s.files()?;
    ensure!(left.is_empty(), "after dpkg -P, still there: {left:?}");
    let out = Command::new("dpkg-query")
        .arg(format!("--admindir={}", s.admin.display()))
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .context("running dpkg-query")?;
    let status = String::from_utf8_lossy(&out.stdout);
    ensure!(
        !out.status.success() || status.contains("not-installed"),
        "after dpkg -P the database still has the package: {status}"
    );
    ok("dpkg -P: nothing is left, the database no longer knows the package");
    Ok(())
}

/// `systemd-analyze verify` on the installed unit: a copy named as an
/// instance (a template cannot be verified), outside the root, its
/// `ExecStart` pointed at the installed binary (systemd 252's `verify
/// --root` would need the root to hold `sysinit.target` and `/bin/kill`
/// too), with the installed man pages on `MANPATH` (verify checks the
/// `Documentation=` pages).
fn verify_unit(s: &Scratch, unit: &str, instance: &str) -> Result<()> {
    if which::which("systemd-analyze").is_err() {
        if env::var_os("CI").is_some() {
            bail!("CI is set and systemd-analyze is missing: `cargo xtask setup` installs it");
        }
        eprintln!(
            "xtask: deb: SKIPPED (needs systemd-analyze): systemd-analyze verify of the installed unit"
        );
        return Ok(());
    }
    let copy = s.dir.join("verify").join(instance);
    let mut text = unit.to_string();
    for bin in [SERVE_BIN, BIN] {
        text = text.replace(
            &format!("ExecStart={bin} "),
            &format!(
                "ExecStart={} ",
                s.path(bin).to_str().context("a UTF-8 scratch path")?
            ),
        );
    }
    install::put(&copy, text.as_bytes(), 0o644)?;
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .env("MANPATH", s.path("/usr/share/man"))
        .output()
        .context("running systemd-analyze verify")?;
    let complaints = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify of the installed unit {instance} ({}): {complaints}",
        out.status
    );
    eprintln!(
        "xtask: deb: ok: systemd-analyze verify of the installed unit (as {instance}, ExecStart at the scratch root's binary, the installed man pages)"
    );
    Ok(())
}

/// A scratch root for dpkg: `root/` (the files) and `admin/` (its own
/// database, outside the root so that nothing but the package's files is
/// there), `dpkg.log` (not the host's /var/log/dpkg.log).
struct Scratch {
    dir: PathBuf,
    root: PathBuf,
    admin: PathBuf,
}

impl Scratch {
    fn new(dir: PathBuf) -> Result<Self> {
        // Never the real root: an absolute path at least two levels down.
        ensure!(
            dir.is_absolute() && dir.components().count() >= 3,
            "refusing {} as a scratch directory",
            dir.display()
        );
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let root = dir.join("root");
        let admin = dir.join("admin");
        for d in [&root, &admin.join("updates"), &admin.join("info")] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        fs::write(admin.join("status"), "")?;
        Ok(Self { dir, root, admin })
    }

    /// `path` (absolute, as in the package) in the root.
    fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Runs dpkg on the scratch root; returns its standard output.
    fn dpkg(&self, args: &[&str], deb: Option<&Path>) -> Result<String> {
        let mut cmd = Command::new("dpkg");
        cmd.arg(format!("--instdir={}", self.root.display()))
            .arg(format!("--admindir={}", self.admin.display()))
            .arg(format!("--log={}", self.dir.join("dpkg.log").display()))
            .arg("--force-script-chrootless")
            .args(args);
        if let Some(deb) = deb {
            cmd.arg(deb);
        }
        output(&mut cmd, &format!("dpkg {}", args.join(" ")))
    }

    /// `dpkg-query -W -f=FORMAT ratelimit` on the scratch database.
    fn query(&self, format: &str) -> Result<String> {
        output(
            Command::new("dpkg-query")
                .arg(format!("--admindir={}", self.admin.display()))
                .args(["-W", &format!("-f={format}"), PACKAGE]),
            &format!("dpkg-query -W -f='{format}'"),
        )
        .map(|s| s.trim().to_string())
    }

    /// What `dpkg -L` lists, but `/.`.
    fn list(&self) -> Result<Vec<String>> {
        let out = output(
            Command::new("dpkg-query")
                .arg(format!("--admindir={}", self.admin.display()))
                .args(["-L", PACKAGE]),
            "dpkg-query -L",
        )?;
        Ok(out
            .lines()
            .filter(|l| !l.is_empty() && *l != "/.")
            .map(str::to_string)
            .collect())
    }

    /// Every path under the root, absolute as in the package.
    fn files(&self) -> Result<Vec<String>> {
        Ok(walk(&self.root)?
            .iter()
            .map(|p| format!("/{}", p.display()))
            .collect())
    }
}

/// Debian's form of a Cargo version: a pre-release sorts before its release
/// (`1.0.0-rc.1` → `1.0.0~rc.1`); build metadata stays (`+…`).
fn debian_version(cargo: &str) -> String {
    let (base, build) = match cargo.split_once('+') {
        Some((b, m)) => (b, Some(m)),
        None => (cargo, None),
    };
    let mut v = base.replacen('-', "~", 1);
    if let Some(build) = build {
        v.push('+');
        v.push_str(build);
    }
    v
}

/// The `Maintainer`: Cargo.toml's first author, or "ratelimit maintainers".
fn maintainer(meta: &Meta) -> String {
    meta.authors
        .first()
        .cloned()
        .unwrap_or_else(|| "ratelimit maintainers".to_string())
}

/// The control file's varying fields.
struct Control<'a> {
    version: &'a str,
    arch: &'a str,
    maintainer: &'a str,
    installed_size: u64,
    depends: &'a str,
    homepage: Option<&'a str>,
}

/// The text of `DEBIAN/control`.
fn control(c: &Control) -> String {
    let mut s = format!(
        "Package: {PACKAGE}\nVersion: {}\nArchitecture: {}\nMaintainer: {}\nInstalled-Size: {}\n",
        c.version, c.arch, c.maintainer, c.installed_size
    );
    if !c.depends.is_empty() {
        s.push_str(&format!("Depends: {}\n", c.depends));
    }
    s.push_str("Suggests: fail2ban\nSection: net\nPriority: optional\n");
    if let Some(homepage) = c.homepage {
        s.push_str(&format!("Homepage: {homepage}\n"));
    }
    s.push_str(DESCRIPTION);
    s
}

/// The text of `DEBIAN/conffiles`.
fn conffiles() -> String {
    CONFFILES.iter().map(|c| format!("{c}\n")).collect()
}

/// The paths of a `${Conffiles}` field (` PATH MD5SUM [obsolete]` lines).
fn parse_conffiles(field: &str) -> BTreeSet<String> {
    field
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// One entry of the package's tree, as `Installed-Size` counts it.
enum Entry {
    /// A regular file of this many bytes.
    File(u64),
    /// A directory (the package has no other kind: no links).
    Other,
}

/// `Installed-Size` in KiB, as `dpkg-gencontrol` counts it: each file's size
/// rounded up to a KiB (an empty file is 0), and 1 KiB for each directory.
fn installed_size(entries: impl IntoIterator<Item = Entry>) -> u64 {
    entries
        .into_iter()
        .map(|e| match e {
            Entry::File(bytes) => bytes.div_ceil(1024),
            Entry::Other => 1,
        })
        .sum()
}

/// The section of a man page from its name's extension (`.5` or `.8`).
pub(crate) fn man_section(name: &str) -> Option<&'static str> {
    match Path::new(name).extension()?.to_str()? {
        "5" => Some("5"),
        "8" => Some("8"),
        _ => None,
    }
}

/// The fail2ban action as installed: run `/usr/bin/ratelimit`.
fn fail2ban_action(shipped: &str) -> Result<String> {
    let from = format!("ratelimit = {}\n", install::SHIPPED_BIN);
    ensure!(
        shipped.contains(&from),
        "{FAIL2BAN_SRC} no longer sets `{}`: update xtask/src/deb.rs",
        from.trim()
    );
    Ok(shipped.replace(&from, &format!("ratelimit = {BIN}\n")))
}

/// What is wrong with the root after `dpkg -r`: anything but the conffiles
/// and their directories left, or a conffile gone.
fn after_removal(left: &[String], conffiles: &[&str]) -> Vec<String> {
    let mut allowed = BTreeSet::new();
    for c in conffiles {
        let mut p = Path::new(c);
        allowed.insert(p.display().to_string());
        while let Some(parent) = p.parent() {
            if parent == Path::new("/") {
                break;
            }
            allowed.insert(parent.display().to_string());
            p = parent;
        }
    }
    let left: BTreeSet<&str> = left.iter().map(String::as_str).collect();
    let mut problems: Vec<String> = left
        .iter()
        .filter(|p| !allowed.contains(**p))
        .map(|p| format!("{p} is left"))
        .collect();
    problems.extend(
        conffiles
            .iter()
            .filter(|c| !left.contains(**c))
            .map(|c| format!("the conffile {c} is gone")),
    );
    problems
}

/// The copyright file (machine-readable format 1.0) for Cargo.toml's
/// `license`: the texts of MIT and a pointer to Debian's copy of Apache-2.0.
fn copyright(meta: &Meta) -> Result<String> {
    let mut ids = Vec::new();
    let mut expr = Vec::new();
    for word in meta.license.split_whitespace() {
        match word {
            "OR" | "AND" => expr.push(word.to_lowercase()),
            id => {
                ids.push(id);
                expr.push(id.to_string());
            }
        }
    }
    ensure!(!ids.is_empty(), "Cargo.toml's license is empty");
    let mut s = format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: {PACKAGE}\n"
    );
    if let Some(repo) = &meta.repository {
        s.push_str(&format!("Source: {repo}\n"));
    }
    s.push_str(
        "Comment: The binary holds the Rust crates of the source's Cargo.lock,\n \
         each under its own license.\n",
    );
    s.push_str(&format!(
        "\nFiles: *\nCopyright: {}\nLicense: {}\n",
        maintainer(meta),
        expr.join(" ")
    ));
    for id in ids {
        let text = match id {
            "MIT" => MIT,
            "Apache-2.0" => {
                " On Debian systems, the full text of the Apache License, Version 2.0,\n \
                 is in /usr/share/common-licenses/Apache-2.0.\n"
            }
            other => bail!("no text for the license {other}: add it to xtask/src/deb.rs"),
        };
        s.push_str(&format!("\nLicense: {id}\n{text}"));
    }
    Ok(s)
}

/// The MIT license, as a copyright file's paragraph.
const MIT: &str = " Permission is hereby granted, free of charge, to any person obtaining a
 copy of this software and associated documentation files (the \"Software\"),
 to deal in the Software without restriction, including without limitation
 the rights to use, copy, modify, merge, publish, distribute, sublicense,
 and/or sell copies of the Software, and to permit persons to whom the
 Software is furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in
 all copies or substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
 FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 DEALINGS IN THE SOFTWARE.
";

/// `Depends` from `dpkg-shlibdeps` run in `work` (which holds
/// `debian/control`) on `bins` (relative to `work`), or, without dpkg-dev,
/// from the binaries' `NEEDED` libraries and glibc symbol versions.
fn depends(work: &Path, bins: &[String]) -> Result<String> {
    if which::which("dpkg-shlibdeps").is_ok() {
        let out = Command::new("dpkg-shlibdeps")
            .current_dir(work)
            .arg("-O")
            .args(bins)
            .output()
            .context("running dpkg-shlibdeps")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.success(),
            "dpkg-shlibdeps failed ({}): {stderr}",
            out.status
        );
        if !stderr.trim().is_empty() {
            eprintln!("{}", stderr.trim_end());
        }
        return shlibdeps_depends(&String::from_utf8_lossy(&out.stdout))
            .context("dpkg-shlibdeps printed no shlibs:Depends");
    }
    eprintln!("xtask: deb: no dpkg-shlibdeps (dpkg-dev): Depends from readelf -d and objdump -T");
    let (mut dynamic, mut symbols) = (String::new(), String::new());
    for bin in bins {
        let bin = work.join(bin);
        dynamic += &output(
            Command::new("readelf").args(["-d", "--wide"]).arg(&bin),
            "readelf -d",
        )?;
        symbols += &output(Command::new("objdump").arg("-T").arg(&bin), "objdump -T")?;
    }
    elf_depends(&dynamic, &symbols)
}

/// The value of the `shlibs:Depends=` line `dpkg-shlibdeps -O` prints.
fn shlibdeps_depends(out: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(|d| d.trim().to_string())
}

/// `Depends` from `readelf -d` (the `NEEDED` libraries) and `objdump -T` (the
/// highest `GLIBC_x.y` version the binary needs).
fn elf_depends(readelf_dynamic: &str, objdump_symbols: &str) -> Result<String> {
    let (mut libc, mut libgcc) = (false, false);
    for line in readelf_dynamic.lines().filter(|l| l.contains("(NEEDED)")) {
        let lib = line
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(lib, _)| lib)
            .with_context(|| format!("a NEEDED line without a library: {line}"))?;
        match lib {
            "libc.so.6" | "libm.so.6" | "libpthread.so.0" | "libdl.so.2" | "librt.so.1"
            | "libutil.so.1" => libc = true,
            l if l.starts_with("ld-linux") => libc = true,
            "libgcc_s.so.1" => libgcc = true,
            other => {
                bail!("the binary needs {other}: say which package has it in xtask/src/deb.rs")
            }
        }
    }
    let mut deps = Vec::new();
    if libc {
        let v = max_glibc(objdump_symbols).context("no GLIBC_x.y symbol version in objdump -T")?;
        deps.push(format!("libc6 (>= {v})"));
    }
    if libgcc {
        deps.push("libgcc-s1".to_string());
    }
    Ok(deps.join(", "))
}

/// The highest `GLIBC_x.y[.z]` version named in `objdump -T`'s output.
fn max_glibc(symbols: &str) -> Option<String> {
    symbols
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let v: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let v = v.trim_end_matches('.').to_string();
            let parts: Option<Vec<u32>> = v.split('.').map(|n| n.parse().ok()).collect();
            Some((parts?, v))
        })
        .max()
        .map(|(_, v)| v)
}

/// Whether the host has a package satisfying one dependency (`name`, `name
/// (>= v)`, alternatives with `|`).
fn host_satisfies(dep: &str) -> Result<bool> {
    for alt in dep.split('|').map(str::trim) {
        let (name, constraint) = match alt.split_once('(') {
            Some((name, rest)) => (name.trim(), Some(rest.trim_end_matches(')').trim())),
            None => (alt, None),
        };
        let out = Command::new("dpkg-query")
            .args(["-W", "-f=${db:Status-Abbrev} ${Version}\n", name])
            .output()
            .context("running dpkg-query")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((state, version)) = line.split_once(' ') else {
                continue;
            };
            if !state.starts_with("ii") {
                continue;
            }
            let version = version.trim();
            let fits = match constraint.and_then(|c| c.split_once(' ')) {
                None => true,
                Some((op, want)) => {
                    let op = match op {
                        ">=" => "ge",
                        "<=" => "le",
                        ">>" => "gt",
                        "<<" => "lt",
                        "=" => "eq",
                        other => bail!("an unknown relation {other} in {dep}"),
                    };
                    Command::new("dpkg")
                        .args(["--compare-versions", version, op, want.trim()])
                        .status()
                        .context("running dpkg --compare-versions")?
                        .success()
                }
            };
            if fits {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// What the package says of itself: the `[workspace.package]` table of the
/// workspace's Cargo.toml (the crates inherit their version and license from
/// it; `repository` is only there).
fn meta() -> Result<Meta> {
    let path = workspace_root().join("Cargo.toml");
    let text = String::from_utf8(read(&path)?).context("Cargo.toml is not UTF-8")?;
    parse_meta(&text)
}

/// [`meta`] from the text of Cargo.toml: one-line `key = "value"` and `key =
/// ["a", "b"]` entries of `[workspace.package]`.
fn parse_meta(cargo_toml: &str) -> Result<Meta> {
    let mut fields = std::collections::BTreeMap::new();
    let mut inside = false;
    for line in cargo_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[workspace.package]";
            continue;
        }
        if !inside || line.starts_with('#') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            fields.insert(key.trim(), value.trim());
        }
    }
    ensure!(!fields.is_empty(), "Cargo.toml has no [workspace.package]");
    let string = |key: &str| -> Result<Option<String>> {
        let Some(value) = fields.get(key) else {
            return Ok(None);
        };
        let inner = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .filter(|v| !v.contains('"'))
            .with_context(|| {
                format!("Cargo.toml's workspace.package.{key} is not a one-line string: {value}")
            })?;
        Ok(Some(inner.to_string()))
    };
    let authors = match fields.get("authors") {
        None => Vec::new(),
        Some(value) => value
            .strip_prefix('[')
            .and_then(|v| v.strip_suffix(']'))
            .with_context(|| {
                format!("Cargo.toml's workspace.package.authors is not a one-line array: {value}")
            })?
            .split(',')
            .map(|a| a.trim().trim_matches('"').to_string())
            .filter(|a| !a.is_empty())
            .collect(),
    };
    Ok(Meta {
        version: string("version")?.context("Cargo.toml has no workspace.package.version")?,
        authors,
        repository: string("repository")?,
        license: string("license")?.context("Cargo.toml has no workspace.package.license")?,
    })
}

/// Every path under `dir` (not following links), relative to it, sorted.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let entries = fs::read_dir(dir.join(&rel))
            .with_context(|| format!("reading {}", dir.join(&rel).display()))?;
        for entry in entries {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() && path != Path::new("DEBIAN") {
                todo.push(path.clone());
            }
            if path != Path::new("DEBIAN") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `gzip -9n < src > dest` (no name, no time stamp: the same bytes each
/// build), mode 0644.
fn gzip(src: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest.parent().context("a directory")?)?;
    let file = fs::File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
    let status = Command::new("gzip")
        .arg("-9nc")
        .arg(src)
        .stdout(file)
        .status()
        .context("running gzip")?;
    ensure!(
        status.success(),
        "gzip -9n {} failed ({status})",
        src.display()
    );
    fs::set_permissions(dest, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("reading {}", path.display()))
}

fn need(tool: &str) -> Result<()> {
    which::which(tool)
        .map(|_| ())
        .with_context(|| format!("{tool} is not installed (it is in dpkg, gzip or binutils)"))
}

/// Runs `cmd`; its standard output if it succeeds, its output in the error if not.
fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting: {what}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            version: "0.1.0".into(),
            authors: vec![],
            repository: Some("https://example.invalid/ratelimit".into()),
            license: "MIT OR Apache-2.0".into(),
        }
    }

    #[test]
    fn the_control_file_has_every_field_in_order() {
        let text = control(&Control {
            version: "0.1.0",
            arch: "amd64",
            maintainer: &maintainer(&meta()),
            installed_size: 16113,
            depends: "libc6 (>= 2.34), libgcc-s1 (>= 4.2)",
            homepage: Some("https://example.invalid/ratelimit"),
        });
        let fields: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with(' '))
            .map(|l| l.split_once(':').unwrap().0)
            .collect();
        assert_eq!(
            fields,
            [
                "Package",
                "Version",
                "Architecture",
                "Maintainer",
                "Installed-Size",
                "Depends",
                "Suggests",
                "Section",
                "Priority",
                "Homepage",
                "Description"
            ]
        );
        assert!(text.starts_with("Package: ratelimit\nVersion: 0.1.0\nArchitecture: amd64\n"));
        assert!(
            text.contains("\nMaintainer: ratelimit maintainers\n"),
            "{text}"
        );
        assert!(text.contains("\nInstalled-Size: 16113\n"));
        assert!(text.contains("\nDepends: libc6 (>= 2.34), libgcc-s1 (>= 4.2)\n"));
        assert!(text.contains("\nSection: net\nPriority: optional\n"));
        // The description: a synopsis, then a paragraph of lines starting
        // with a space, at most 80 columns, an empty line as " .".
        let desc: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Description:"))
            .collect();
        assert!(desc.len() > 3);
        assert!(
            desc[1..]
                .iter()
                .all(|l| l.starts_with(' ') && l.len() <= 80 && !l.trim().is_empty())
        );
        assert!(text.ends_with('\n') && !text.ends_with("\n\n"));
    }

    #[test]
    fn no_homepage_or_depends_no_field() {
        let text = control(&Control {
            version: "1.0.0~rc.1",
            arch: "arm64",
            maintainer: "A <a@example.invalid>",
            installed_size: 1,
            depends: "",
            homepage: None,
        });
        assert!(
            !text.contains("Homepage:") && !text.contains("Depends:"),
            "{text}"
        );
        assert!(text.contains("\nMaintainer: A <a@example.invalid>\n"));
    }

    #[test]
    fn the_metadata_comes_from_the_workspace_table() {
        let real = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        let m = parse_meta(&real).unwrap();
        assert!(!m.version.is_empty() && !m.license.is_empty(), "{m:?}");
        let text = r#"
[workspace]
members = ["a"]

[workspace.package]
version = "1.2.3"
# a comment
authors = ["A <a@example.invalid>", "B"]
license = "MIT"
repository = "https://example.invalid/x"

[workspace.dependencies]
version = "9"
"#;
        let m = parse_meta(text).unwrap();
        assert_eq!(m.version, "1.2.3");
        assert_eq!(m.authors, ["A <a@example.invalid>", "B"]);
        assert_eq!(m.license, "MIT");
        assert_eq!(m.repository.as_deref(), Some("https://example.invalid/x"));
        let bare =
            parse_meta("[workspace.package]\nversion = \"1.0.0\"\nlicense = \"MIT\"\n").unwrap();
        assert!(bare.authors.is_empty() && bare.repository.is_none());
        assert!(parse_meta("[workspace.package]\nlicense = \"MIT\"\n").is_err());
        assert!(
            parse_meta("[workspace.package]\nversion = \"1\"\nlicense = \"MIT\"\nauthors = [\n")
                .is_err()
        );
    }

    #[test]
    fn versions_in_debian_form() {
        assert_eq!(debian_version("0.1.0"), "0.1.0");
        assert_eq!(debian_version("1.0.0-rc.1"), "1.0.0~rc.1");
        assert_eq!(debian_version("1.0.0-rc-2+git.5"), "1.0.0~rc-2+git.5");
        let first = Meta {
            authors: vec!["A <a@example.invalid>".into(), "B".into()],
            ..meta()
        };
        assert_eq!(maintainer(&first), "A <a@example.invalid>");
    }

    #[test]
    fn installed_size_counts_as_dpkg_gencontrol() {
        assert_eq!(installed_size(Vec::new()), 0);
        assert_eq!(
            installed_size([
                Entry::File(0),
                Entry::File(1),
                Entry::File(1024),
                Entry::File(1025),
                Entry::Other,
                Entry::Other,
            ]),
            1 + 1 + 2 + 1 + 1
        );
    }

    #[test]
    fn the_conffiles_are_under_etc_and_listed_one_a_line() {
        assert_eq!(
            conffiles(),
            "/etc/ratelimit/ratelimit.toml\n/etc/fail2ban/action.d/ratelimit.conf\n"
        );
        assert!(CONFFILES.iter().all(|c| c.starts_with("/etc/")));
        for c in CONFFILES {
            assert!(EXPECTED.iter().any(|(p, _)| *p == c), "{c} is not expected");
        }
        let field = " /etc/ratelimit/ratelimit.toml 0f343b0931126a20f133d67c2b018a3b\n \
                     /etc/fail2ban/action.d/ratelimit.conf d5e29449b9e66d5b4bb0d6ce48fbbcb1 obsolete\n";
        let want: BTreeSet<String> = CONFFILES.iter().map(|c| c.to_string()).collect();
        assert_eq!(parse_conffiles(field), want);
        assert!(parse_conffiles("").is_empty());
    }

    #[test]
    fn after_a_removal_only_the_conffiles_and_their_directories_may_stay() {
        let left: Vec<String> = [
            "/etc",
            "/etc/fail2ban",
            "/etc/fail2ban/action.d",
            "/etc/fail2ban/action.d/ratelimit.conf",
            "/etc/ratelimit",
            "/etc/ratelimit/ratelimit.toml",
        ]
        .map(String::from)
        .to_vec();
        assert!(after_removal(&left, &CONFFILES).is_empty());
        let mut more = left.clone();
        more.push("/usr/bin/ratelimit".into());
        more.retain(|p| p.as_str() != CONFIG);
        assert_eq!(
            after_removal(&more, &CONFFILES),
            [
                "/usr/bin/ratelimit is left",
                "the conffile /etc/ratelimit/ratelimit.toml is gone"
            ]
        );
    }

    #[test]
    fn man_pages_by_their_extension() {
        assert_eq!(man_section("ratelimit.8"), Some("8"));
        assert_eq!(man_section("ratelimit-run.8"), Some("8"));
        assert_eq!(man_section("ratelimit.toml.5"), Some("5"));
        assert_eq!(man_section("ratelimit.1"), None);
        assert_eq!(man_section("README"), None);
    }

    #[test]
    fn the_fail2ban_action_runs_the_packaged_binary() {
        let shipped = "[Init]\n\nratelimit = /usr/local/bin/ratelimit\niface_opt =\n";
        assert_eq!(
            fail2ban_action(shipped).unwrap(),
            "[Init]\n\nratelimit = /usr/bin/ratelimit\niface_opt =\n"
        );
        assert!(fail2ban_action("ratelimit = /opt/ratelimit\n").is_err());
        let real = std::fs::read_to_string(workspace_root().join(FAIL2BAN_SRC)).unwrap();
        assert!(
            fail2ban_action(&real)
                .unwrap()
                .contains("ratelimit = /usr/bin/ratelimit\n")
        );
    }

    #[test]
    fn the_copyright_file_gives_each_license() {
        let text = copyright(&meta()).unwrap();
        assert!(text.starts_with(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        ));
        assert!(text.contains("\nLicense: MIT or Apache-2.0\n"), "{text}");
        assert!(text.contains("\nLicense: MIT\n Permission is hereby granted"));
        assert!(text.contains("/usr/share/common-licenses/Apache-2.0"));
        assert!(text.contains("\nSource: https://example.invalid/ratelimit\n"));
        let gpl = Meta {
            license: "GPL-2.0".into(),
            ..meta()
        };
        assert!(copyright(&gpl).is_err());
    }

    #[test]
    fn depends_from_shlibdeps_or_the_elf() {
        assert_eq!(
            shlibdeps_depends("shlibs:Depends=libc6 (>= 2.34), libgcc-s1 (>= 4.2)\n").unwrap(),
            "libc6 (>= 2.34), libgcc-s1 (>= 4.2)"
        );
        assert_eq!(shlibdeps_depends("misc:Depends=\n"), None);
        let dynamic = "\
 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libm.so.6]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x0000000000000001 (NEEDED)             Shared library: [ld-linux-x86-64.so.2]
 0x000000000000000c (INIT)               0x12000
";
        let symbols = "\
0000000000000000      DF *UND*	0000000000000000 (GLIBC_2.2.5) memcpy
0000000000000000      DF *UND*	0000000000000000 (GLIBC_2.34) __libc_start_main
0000000000000000      DF *UND*	0000000000000000  GLIBC_2.9   pipe2
0000000000000000      DF *UND*	0000000000000000 (GLIBC_PRIVATE) _dl_x
0000000000000000      DF *UND*	0000000000000000 (GCC_3.0) _Unwind_Resume
";
        assert_eq!(max_glibc(symbols).as_deref(), Some("2.34"));
        assert_eq!(
            elf_depends(dynamic, symbols).unwrap(),
            "libc6 (>= 2.34), libgcc-s1"
        );
        let odd = " 0x1 (NEEDED)  Shared library: [libssl.so.3]\n";
        assert!(elf_depends(odd, symbols).is_err());
    }

    #[test]
    fn every_expected_file_is_one_the_build_writes() {
        // The completions and the unit of the table are the ones staged.
        for (_, path) in COMPLETIONS {
            assert!(EXPECTED.iter().any(|(p, m)| *p == path && *m == 0o644));
        }
        assert!(EXPECTED.iter().any(|(p, m)| *p == BIN && *m == 0o755));
        assert!(EXPECTED.iter().all(|(p, _)| p.starts_with('/')));
        for script in SCRIPTS {
            assert!(workspace_root().join("dist/deb").join(script).is_file());
        }
    }

    #[test]
    fn a_scratch_root_is_never_the_real_one() {
        assert!(Scratch::new(PathBuf::from("/")).is_err());
        assert!(Scratch::new(PathBuf::from("/tmp")).is_err());
        assert!(Scratch::new(PathBuf::from("relative/dir")).is_err());
    }
}
