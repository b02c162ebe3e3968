//! The Debian kernels `cargo xtask vm` boots, and how they get here.
//!
//! [`TABLE`] names each kernel (`6.1`, `6.12`, `sid`) and the Debian suites
//! it comes from. [`fetch`] takes one of those names and returns a
//! [`Kernel`]: the kernel image and the modules directory of Debian's own
//! package, extracted under `target/vm/kernels/<name>/root/`.
//!
//! The packages come through a private apt configuration, one per kernel,
//! under `target/vm/apt/<name>/`: its own `apt.conf` (passed with `-c`), its
//! own sources.list (deb.debian.org, checked against
//! `/usr/share/keyrings/debian-archive-keyring.gpg`), its own lists, cache and
//! an empty dpkg status file. `apt-get update`, then `apt-get download` into
//! `target/vm/kernels/<name>/`, then `dpkg -x`. Nothing is installed: the
//! host's /boot, /lib/modules, /etc/apt and dpkg database are not touched.
//!
//! Which package: the candidate of the suite's `linux-image-amd64`
//! metapackage names the ABI package (`linux-image-6.1.0-56-amd64`); from
//! sid on that package is empty and depends on `linux-binary-<abi>` (the
//! vmlinuz), `linux-modules-<abi>` and `linux-base-<abi>` (modules.builtin,
//! config, System.map), which are taken too: every dependency whose name
//! ends with the ABI.
//!
//! A kernel already extracted is reused without asking apt anything (so it
//! works offline); `refresh` runs `apt-get update` and downloads again when
//! the suite has a newer version. `target/vm/kernels/<name>/packages` records
//! what was extracted.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// One kernel of the table.
pub(super) struct Spec {
    /// What `--kernel` takes.
    pub name: &'static str,
    /// The `deb` lines' suites, main component only.
    suites: &'static [Suite],
    /// The ABI package's name must start with this (`linux-image-6.1.`).
    image_prefix: &'static str,
    /// In the matrix (`--all`): a kernel the program supports. One below
    /// the minimum is booted only when named, to see it refused.
    pub supported: bool,
}

/// A suite and the archive it lives in.
struct Suite {
    archive: &'static str,
    suite: &'static str,
}

const DEBIAN: &str = "http://deb.debian.org/debian";
const SECURITY: &str = "http://deb.debian.org/debian-security";

/// bookworm's debian-archive-keyring holds the bookworm and trixie archive
/// keys; sid's Release is signed with both of them (checked with gpgv), so
/// no suite needs `[trusted=yes]`.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The kernels `cargo xtask vm` knows.
pub(super) const TABLE: [Spec; 4] = [
    Spec {
        name: "5.10",
        suites: &[
            Suite {
                archive: DEBIAN,
                suite: "bullseye",
            },
            Suite {
                archive: DEBIAN,
                suite: "bullseye-updates",
            },
            Suite {
                archive: SECURITY,
                suite: "bullseye-security",
            },
        ],
        image_prefix: "linux-image-5.10.",
        supported: false,
    },
    Spec {
        name: "6.1",
        suites: &[
            Suite {
                archive: DEBIAN,
                suite: "bookworm",
            },
            Suite {
                archive: DEBIAN,
                suite: "bookworm-updates",
            },
            Suite {
                archive: SECURITY,
                suite: "bookworm-security",
            },
        ],
        image_prefix: "linux-image-6.1.",
        supported: true,
    },
    Spec {
        name: "6.12",
        suites: &[
            Suite {
                archive: DEBIAN,
                suite: "trixie",
            },
            Suite {
                archive: DEBIAN,
                suite: "trixie-updates",
            },
            Suite {
                archive: SECURITY,
                suite: "trixie-security",
            },
        ],
        image_prefix: "linux-image-6.12.",
        supported: true,
    },
    Spec {
        name: "sid",
        suites: &[Suite {
            archive: DEBIAN,
            suite: "sid",
        }],
        image_prefix: "linux-image-",
        supported: true,
    },
];

/// The kernels booted when `--kernel` is not given: the oldest supported
/// and the newest.
pub(crate) const DEFAULT: [&str; 2] = ["6.1", "sid"];

/// A kernel extracted on the host, ready to boot.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    /// Its name in [`TABLE`] (`6.1`).
    pub name: String,
    /// What `uname -r` says in the guest (`6.1.0-56-amd64`).
    pub release: String,
    /// The packages extracted, with their versions.
    pub packages: Vec<(String, String)>,
    /// The bzImage qemu boots.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` of the extracted tree.
    pub modules: PathBuf,
}

/// The spec called `name`, or an error listing the known names.
pub(super) fn spec(name: &str) -> Result<&'static Spec> {
    TABLE.iter().find(|s| s.name == name).with_context(|| {
        let names: Vec<&str> = TABLE.iter().map(|s| s.name).collect();
        format!(
            "no kernel called {name:?}: the known ones are {}",
            names.join(", ")
        )
    })
}

fn vm_dir() -> PathBuf {
    crate::workspace_root().join("target/vm")
}

/// Returns the kernel `spec` names, downloading and extracting it when it is
/// not there yet or when `refresh` finds a newer one.
pub(super) fn fetch(spec: &Spec, refresh: bool) -> Result<Kernel> {
    let dir = vm_dir().join("kernels").join(spec.name);
    let record = dir.join("packages");
    if !refresh && let Some(kernel) = cached(spec, &dir, &record)? {
        eprintln!(
            "xtask vm: kernel {}: {} ({}), cached",
            spec.name,
            kernel.release,
            describe(&kernel.packages)
        );
        return Ok(kernel);
    }
    let apt = Apt::new(spec)?;
    eprintln!(
        "xtask vm: kernel {}: apt-get update ({})",
        spec.name,
        apt.dir.display()
    );
    apt.run(&["update", "-qq"], &apt.dir)?;
    let (release, packages) = resolve(spec, &apt)?;
    if let Some(kernel) = cached(spec, &dir, &record)?
        && kernel.packages == packages
    {
        eprintln!(
            "xtask vm: kernel {}: {} ({}), up to date",
            spec.name,
            kernel.release,
            describe(&kernel.packages)
        );
        return Ok(kernel);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = fs::remove_file(&record);
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    let wanted: Vec<String> = packages.iter().map(|(p, v)| format!("{p}={v}")).collect();
    eprintln!(
        "xtask vm: downloading {} into {}",
        wanted.join(" "),
        dir.display()
    );
    let mut args = vec!["download", "-q"];
    args.extend(wanted.iter().map(String::as_str));
    apt.run(&args, &dir)?;

    let root = dir.join("root");
    let tmp = dir.join("root.tmp");
    for d in [&root, &tmp] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    fs::create_dir_all(&tmp)?;
    for entry in fs::read_dir(&dir)? {
        let deb = entry?.path();
        if deb.extension().is_none_or(|e| e != "deb") {
            continue;
        }
        eprintln!(
            "xtask vm: extracting {}",
            deb.file_name().unwrap_or_default().to_string_lossy()
        );
        let status = Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(&tmp)
            .status()
            .context("running dpkg -x")?;
        if !status.success() {
            bail!("dpkg -x {} failed ({status})", deb.display());
        }
    }
    fs::rename(&tmp, &root)?;
    // The extracted tree is the cache; the .debs would only double it.
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    let text: String = std::iter::once(format!("release {release}\n"))
        .chain(packages.iter().map(|(p, v)| format!("{p} {v}\n")))
        .collect();
    fs::write(&record, text).with_context(|| format!("writing {}", record.display()))?;
    let kernel = cached(spec, &dir, &record)?.with_context(|| {
        format!(
            "{} was extracted but holds no vmlinuz or no modules for {release}",
            root.display()
        )
    })?;
    eprintln!(
        "xtask vm: kernel {}: {} ({})",
        spec.name,
        kernel.release,
        describe(&kernel.packages)
    );
    Ok(kernel)
}

fn describe(packages: &[(String, String)]) -> String {
    packages
        .iter()
        .map(|(p, v)| format!("{p} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernel recorded in `record`, when its files are all there.
fn cached(spec: &Spec, dir: &Path, record: &Path) -> Result<Option<Kernel>> {
    let Ok(text) = fs::read_to_string(record) else {
        return Ok(None);
    };
    let mut release = None;
    let mut packages = Vec::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("release", r)) => release = Some(r.to_string()),
            Some((p, v)) => packages.push((p.to_string(), v.to_string())),
            None => {}
        }
    }
    let Some(release) = release else {
        return Ok(None);
    };
    let root = dir.join("root");
    // bookworm: /boot and /lib/modules; later: /usr/lib/modules, and from sid
    // on the vmlinuz lives beside the modules.
    let vmlinuz = [
        root.join(format!("boot/vmlinuz-{release}")),
        root.join(format!("usr/lib/modules/{release}/vmlinuz")),
        root.join(format!("lib/modules/{release}/vmlinuz")),
    ]
    .into_iter()
    .find(|p| p.is_file());
    let modules = [
        root.join(format!("usr/lib/modules/{release}")),
        root.join(format!("lib/modules/{release}")),
    ]
    .into_iter()
    .find(|p| p.join("kernel").is_dir());
    let (Some(vmlinuz), Some(modules)) = (vmlinuz, modules) else {
        return Ok(None);
    };
    Ok(Some(Kernel {
        name: spec.name.to_string(),
        release,
        packages,
        vmlinuz,
        modules,
    }))
}

/// The kernel release and the packages to download: the ABI package the
/// suite's `linux-image-amd64` depends on, and its dependencies named after
/// the same ABI (sid's `linux-binary-*`, `linux-modules-*`, `linux-base-*`).
fn resolve(spec: &Spec, apt: &Apt) -> Result<(String, Vec<(String, String)>)> {
    let meta = apt.show("linux-image-amd64")?;
    let image = meta
        .depends
        .iter()
        .find(|d| {
            d.starts_with(spec.image_prefix)
                && (d.ends_with("-amd64") || d.ends_with("-amd64-unsigned"))
        })
        .with_context(|| {
            format!(
                "linux-image-amd64 {} depends on no {}*-amd64 package (Depends: {})",
                meta.version,
                spec.image_prefix,
                meta.depends.join(", ")
            )
        })?
        .clone();
    let release = image
        .strip_prefix("linux-image-")
        .map(|r| r.strip_suffix("-unsigned").unwrap_or(r))
        .context("a linux-image- package")?
        .to_string();
    let shown = apt.show(&image)?;
    let mut packages = vec![(image.clone(), shown.version.clone())];
    for dep in &shown.depends {
        if dep.ends_with(&format!("-{release}")) && dep.starts_with("linux-") {
            let v = apt.show(dep)?.version;
            packages.push((dep.clone(), v));
        }
    }
    Ok((release, packages))
}

/// A private apt configuration (see the module docs).
struct Apt {
    dir: PathBuf,
    conf: PathBuf,
}

/// One stanza of `apt-cache show`.
struct Shown {
    version: String,
    /// The package names of Depends (alternatives and versions dropped).
    depends: Vec<String>,
}

impl Apt {
    /// Writes `target/vm/apt/<name>/`: apt.conf, sources.list, the lists,
    /// the cache and an empty status file.
    fn new(spec: &Spec) -> Result<Self> {
        let dir = vm_dir().join("apt").join(spec.name);
        for d in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(d))
                .with_context(|| format!("creating {}", dir.join(d).display()))?;
        }
        let status = dir.join("status");
        if !status.exists() {
            fs::write(&status, "")?;
        }
        let sources: String = spec
            .suites
            .iter()
            .map(|s| format!("deb [signed-by={KEYRING}] {} {} main\n", s.archive, s.suite))
            .collect();
        fs::write(dir.join("sources.list"), sources)?;
        let d = dir.display();
        // The host's apt.conf.d is still read (it may hold what the network
        // here needs); its hooks, which act on the host's own state, are
        // cleared, and so is appstream's DEP-11 metadata, which is of no use.
        let conf = format!(
            "Dir::State \"{d}\";\n\
             Dir::State::lists \"{d}/lists/\";\n\
             Dir::State::status \"{d}/status\";\n\
             Dir::Cache \"{d}/cache/\";\n\
             Dir::Etc::SourceList \"{d}/sources.list\";\n\
             Dir::Etc::SourceParts \"/dev/null\";\n\
             APT::Architecture \"amd64\";\n\
             APT::Architectures {{ \"amd64\"; }};\n\
             APT::Sandbox::User \"root\";\n\
             Acquire::IndexTargets::deb::DEP-11::DefaultEnabled \"false\";\n\
             #clear APT::Update::Post-Invoke-Success;\n\
             #clear APT::Update::Post-Invoke;\n\
             #clear DPkg::Post-Invoke;\n\
             #clear DPkg::Pre-Invoke;\n"
        );
        let conf_path = dir.join("apt.conf");
        fs::write(&conf_path, conf)?;
        Ok(Self {
            dir,
            conf: conf_path,
        })
    }

    fn command(&self, tool: &str) -> Command {
        let mut cmd = Command::new(tool);
        cmd.arg("-c").arg(&self.conf).env_remove("APT_CONFIG");
        cmd
    }

    /// `apt-get ARGS` in `cwd`.
    fn run(&self, args: &[&str], cwd: &Path) -> Result<()> {
        let status = self
            .command("apt-get")
            .args(args)
            .current_dir(cwd)
            .status()
            .context("running apt-get")?;
        if !status.success() {
            bail!(
                "apt-get -c {} {} failed ({status}); the Debian archive must be reachable",
                self.conf.display(),
                args.join(" ")
            );
        }
        Ok(())
    }

    /// The candidate version of `package` and its dependencies.
    fn show(&self, package: &str) -> Result<Shown> {
        let out = self
            .command("apt-cache")
            .args(["show", "--no-all-versions", package])
            .output()
            .context("running apt-cache show")?;
        if !out.status.success() {
            bail!(
                "apt-cache show {package} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(": ")))
                .map(str::to_string)
        };
        let version = field("Version").with_context(|| format!("{package} has no Version"))?;
        let depends = field("Depends")
            .unwrap_or_default()
            .split(',')
            .flat_map(|alt| alt.split('|'))
            .filter_map(|d| d.split_whitespace().next().map(str::to_string))
            .collect();
        Ok(Shown { version, depends })
    }
}
