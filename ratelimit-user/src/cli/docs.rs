//! Shell completions and man pages, generated from the clap definitions of
//! [`crate::cli`] so they never disagree with the options: `ratelimit
//! completions SHELL` (clap_complete) and `ratelimit man [PAGE] [--out DIR]`
//! (clap_mangen, section 8: a daemon run by root).
//!
//! The pages: `ratelimit(8)`, the overview (commands, exit status,
//! environment, files), and one `ratelimit-COMMAND(8)` per command with its
//! options and examples ([`crate::cli::help`]); then the file formats,
//! section 5: `ratelimit.toml(5)` and `ratelimit-serve.toml(5)`, every key of
//! each ([`file_page`], tested against the parsers). `ratelimit man` prints
//! the first, `ratelimit man PAGE` the one named (`ratelimit.toml`,
//! `ratelimit-run`); `--out DIR` writes them all, as `cargo xtask install`
//! does.

mod file_page;
mod ratelimit_toml;
mod serve_toml;

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use clap::CommandFactory as _;
use clap_complete::Shell;
use clap_mangen::{
    Man,
    roff::{Roff, bold, italic, roman},
};

use crate::{
    cli::args::Cli,
    error::{Error, Kind, Result},
};

/// The manual section: system administration commands and daemons.
pub const SECTION: &str = "8";

/// The completion script for `shell`.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "ratelimit", &mut out);
    out
}

/// The file formats' pages, section 5.
const FILE_PAGES: [&file_page::Page; 2] = [&ratelimit_toml::PAGE, &serve_toml::PAGE];

/// The pages as (file name, roff): `ratelimit.8` first, then
/// `ratelimit-COMMAND.8` for each command, then the file formats'
/// `NAME.5`.
pub fn pages() -> Vec<(String, Vec<u8>)> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![(format!("ratelimit.{SECTION}"), overview(&cmd))];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("ratelimit-{}", sub.get_name());
        pages.push((format!("{name}.{SECTION}"), command_page(sub, &name)));
    }
    for page in FILE_PAGES {
        pages.push((page.file_name(), page.render()));
    }
    pages
}

/// The page `name` names: its file name (`ratelimit.toml.5`), or that
/// without the section (`ratelimit.toml`, `ratelimit-run`), or with it in
/// parentheses (`ratelimit.toml(5)`).
pub fn page(name: &str) -> Result<(String, Vec<u8>)> {
    let all = pages();
    let wanted = |file: &str| {
        let (stem, section) = file.rsplit_once('.').expect("a page's file has a section");
        name == file || name == stem || name == format!("{stem}({section})")
    };
    if let Some(i) = all.iter().position(|(file, _)| wanted(file)) {
        return Ok(all.into_iter().nth(i).expect("found"));
    }
    let names: Vec<&str> = all
        .iter()
        .filter_map(|(file, _)| file.rsplit_once('.').map(|(stem, _)| stem))
        .collect();
    Err(Error::invalid(
        "PAGE",
        format!("no page {name:?}; the pages are {}", names.join(", ")),
    ))
}

/// Writes every page into `dir` (created if missing); returns their paths.
pub fn write_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    pages()
        .into_iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(Error::io(format!("writing {}", path.display())))?;
            Ok(path)
        })
        .collect()
}

fn man(cmd: &clap::Command) -> Man {
    Man::new(cmd.clone())
        .section(SECTION)
        .manual("System Administration")
        .source(format!("ratelimit {}", env!("CARGO_PKG_VERSION")))
}

/// Renders `f` (one piece of a page) onto `out`. Each piece starts with roff's
/// preamble (the `Aq` string definition); a page needs it once.
fn render(out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) {
    let mut piece = Vec::new();
    f(&mut piece).expect("writing into memory");
    let piece = String::from_utf8(piece).expect("roff is UTF-8");
    let first = out.is_empty();
    for line in piece.lines() {
        if first || !PREAMBLE.contains(&line) {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
}

/// The lines roff puts before every piece it renders.
const PREAMBLE: [&str; 2] = [r".ie \n(.g .ds Aq \(aq", ".el .ds Aq '"];

/// `ratelimit(8)`.
fn overview(cmd: &clap::Command) -> Vec<u8> {
    let page = man(cmd);
    let mut out = Vec::new();
    render(&mut out, |w| page.render_title(w));
    render(&mut out, |w| page.render_name_section(w));
    render(&mut out, |w| page.render_synopsis_section(w));
    let mut roff = Roff::new();
    roff.control("SH", ["DESCRIPTION"]);
    roff.text([roman(
        "ratelimit limits the packets each source address (or network) may send to an \
         interface, in an XDP program at the NIC driver: what exceeds a source's token \
         bucket is dropped before the kernel spends anything on it.",
    )]);
    roff.control("PP", []).text([
        bold("ratelimit run"),
        roman(
            " is the daemon: it loads and attaches the program, gives it its rules (from \
             the command line and a TOML file) and keeps its state across restarts, pinned \
             in bpffs. The other commands talk to the daemon of an interface over its \
             control socket, as root; a change is enforced when the command returns.",
        ),
    ]);
    render(&mut out, |w| roff.to_writer(w));
    render(&mut out, |w| page.render_options_section(w));
    render(&mut out, |w| page.render_subcommands_section(w));

    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    roff.control("TP", [])
        .text([bold("0")])
        .text([roman("success")]);
    for kind in Kind::ALL {
        roff.control("TP", [])
            .text([bold(kind.exit_code().to_string())])
            .text([roman(format!("{} ({})", kind.meaning(), kind.name()))]);
    }
    roff.control("PP", []).text([
        roman("With "),
        bold("--json"),
        roman(", a command that fails also prints one JSON object on standard output: "),
        roman(r#"{"error": {"kind": KIND, "message": TEXT, "field": FLAG, "exit_code": N}}"#),
        roman(", where "),
        italic("field"),
        roman(" is given for invalid input only. The message is printed on standard error too."),
    ]);

    roff.control("SH", ["ENVIRONMENT"]);
    for (name, what) in [
        (
            "RATELIMIT_LOG",
            "the daemon's log filter, in tracing's env-filter syntax (default: info)",
        ),
        (
            "RATELIMIT_RUN_DIR",
            "the run directory (default: /run/ratelimit): control sockets, locks, saved rules",
        ),
        (
            "RATELIMIT_TIMEOUT",
            "seconds a command waits for the daemon's answer (default: 30); past it the command exits 6, and a change may have been applied",
        ),
        (
            "NO_COLOR",
            "when set and not empty, logs and help are never coloured (they are not when standard error is not a terminal either)",
        ),
    ] {
        roff.control("TP", [])
            .text([bold(name)])
            .text([roman(what)]);
    }

    roff.control("SH", ["FILES"]);
    for (path, what) in [
        (
            "/run/ratelimit/NS/IFACE.sock",
            "the control socket of the daemon on IFACE; NS is host, or ns and the network namespace's cookie",
        ),
        (
            "/sys/fs/bpf/ratelimit/v5/NS/IFACE/",
            "the pinned link and maps, which outlive the daemon under --keep-attached or SIGKILL",
        ),
        (
            "/etc/ratelimit/IFACE.toml",
            "the rules, as the systemd unit ratelimit@IFACE.service reads them; their keys: ratelimit.toml(5)",
        ),
    ] {
        roff.control("TP", [])
            .text([italic(path)])
            .text([roman(what)]);
    }

    roff.control("SH", ["SEE ALSO"]);
    let mut refs: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| format!("ratelimit-{}({SECTION})", s.get_name()))
        .collect();
    refs.extend(
        FILE_PAGES
            .iter()
            .map(|p| format!("{}({})", p.name, file_page::SECTION)),
    );
    refs.extend([
        "systemctl(1)".into(),
        "ip-link(8)".into(),
        "bpftool(8)".into(),
    ]);
    roff.text([roman(refs.join(", "))]);
    render(&mut out, |w| roff.to_writer(w));
    out
}

/// `ratelimit-COMMAND(8)`: options, then the examples of its `--help`.
fn command_page(sub: &clap::Command, name: &str) -> Vec<u8> {
    let page = man(sub).title(name);
    let mut out = Vec::new();
    render(&mut out, |w| page.render_title(w));
    render(&mut out, |w| page.render_name_section(w));
    render(&mut out, |w| page.render_synopsis_section(w));
    render(&mut out, |w| page.render_description_section(w));
    render(&mut out, |w| page.render_options_section(w));

    let mut roff = Roff::new();
    if let Some(after) = sub.get_after_help() {
        let after = after.to_string();
        roff.control("SH", ["EXAMPLES"]).control("nf", []);
        roff.control("RS", ["4"]);
        for line in after.lines().filter(|l| l.starts_with("  ")) {
            roff.text([roman(line.trim())]);
        }
        roff.control("RE", []).control("fi", []);
    }
    roff.control("SH", ["SEE ALSO"]);
    let mut refs = vec![format!("ratelimit({SECTION})")];
    // The file the command reads.
    let file = match sub.get_name() {
        "run" | "check" | "reload" => Some(&ratelimit_toml::PAGE),
        "serve" => Some(&serve_toml::PAGE),
        _ => None,
    };
    refs.extend(file.map(|p| format!("{}({})", p.name, file_page::SECTION)));
    roff.text([roman(refs.join(", "))]);
    render(&mut out, |w| roff.to_writer(w));
    out
}

/// `ratelimit completions SHELL`: the script on standard output.
pub fn print_completions(shell: Shell) -> Result<()> {
    std::io::stdout()
        .write_all(&completions(shell))
        .map_err(Error::io("writing the completions to standard output"))
}

/// `ratelimit man [PAGE] [--out DIR]`: `ratelimit(8)`, or the page named, on
/// standard output, or every page into DIR (their paths printed).
pub fn print_man(name: Option<&str>, out: Option<&Path>) -> Result<()> {
    let Some(dir) = out else {
        let (_, text) = match name {
            Some(name) => page(name)?,
            None => pages().swap_remove(0),
        };
        return std::io::stdout()
            .write_all(&text)
            .map_err(Error::io("writing the man page to standard output"));
    };
    for path in write_pages(dir)? {
        println!("{}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(page: &[u8]) -> String {
        String::from_utf8(page.to_vec()).expect("roff is UTF-8")
    }

    #[test]
    fn the_overview_page_has_the_commands_and_exit_codes() {
        let pages = pages();
        let (name, page) = &pages[0];
        assert_eq!(name, "ratelimit.8");
        let page = text(page);
        assert!(page.contains("\n.TH ratelimit 8 "), "{page}");
        assert_eq!(page.matches(PREAMBLE[1]).count(), 1, "{page}");
        for needle in [
            ".SH \"EXIT STATUS\"",
            "ratelimit\\-run(8)",
            "ratelimit\\-deny(8)",
            "RATELIMIT_LOG",
            "NO_COLOR",
            "no\\-daemon",
        ] {
            assert!(page.contains(needle), "{needle} missing from:\n{page}");
        }
    }

    #[test]
    fn each_command_has_a_page_with_its_options_and_examples() {
        let pages = pages();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        for want in ["ratelimit-run.8", "ratelimit-set.8", "ratelimit-man.8"] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        assert!(!names.contains(&"ratelimit-help.8"), "{names:?}");
        let (_, run) = pages
            .iter()
            .find(|(n, _)| n == "ratelimit-run.8")
            .expect("ratelimit-run.8");
        let run = text(run);
        for needle in [
            "\n.TH ratelimit-run 8 ",
            "\\-\\-keep\\-attached",
            ".SH EXAMPLES",
            "ratelimit run \\-\\-iface eth0",
        ] {
            assert!(run.contains(needle), "{needle} missing from:\n{run}");
        }
    }

    #[test]
    fn the_file_formats_have_pages_found_by_name() {
        let pages = pages();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        for want in ["ratelimit.toml.5", "ratelimit-serve.toml.5"] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        for name in ["ratelimit.toml", "ratelimit.toml.5", "ratelimit.toml(5)"] {
            let (file, page) = page(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(file, "ratelimit.toml.5");
            let page = text(&page);
            assert!(page.contains("\n.TH RATELIMIT.TOML 5 "), "{page}");
            assert_eq!(page.matches(PREAMBLE[1]).count(), 1, "{page}");
        }
        assert_eq!(page("ratelimit").unwrap().0, "ratelimit.8");
        assert_eq!(page("ratelimit-run").unwrap().0, "ratelimit-run.8");
        let e = page("ratelimit-serve.yaml").unwrap_err().to_string();
        assert!(e.contains("ratelimit-serve.toml"), "{e}");
        let overview = text(&pages[0].1);
        assert!(overview.contains("ratelimit.toml(5)"), "{overview}");
        let (_, serve) = page("ratelimit-serve").unwrap();
        assert!(text(&serve).contains("ratelimit\\-serve.toml(5)"));
    }

    #[test]
    fn completions_know_the_commands_and_flags() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).expect("UTF-8");
            for word in ["allowlist-only", "keep-attached", "deny", "completions"] {
                assert!(script.contains(word), "{shell}: {word} missing");
            }
        }
    }
}
