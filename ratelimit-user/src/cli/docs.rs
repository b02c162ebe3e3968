//! Shell completions and man pages, generated from the clap definitions of
//! [`crate::cli`] so they never disagree with the options: `ratelimit
//! completions SHELL` (clap_complete) and `ratelimit man [--out DIR]`
//! (clap_mangen, section 8: a daemon run by root).
//!
//! The pages: `ratelimit(8)`, the overview (commands, exit status,
//! environment, files), and one `ratelimit-COMMAND(8)` per command with its
//! options and examples ([`crate::cli::help`]). `ratelimit man` prints the first;
//! `--out DIR` writes them all, as `cargo xtask install` does.

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

/// The pages as (file name, roff): `ratelimit.8` first, then
/// `ratelimit-COMMAND.8` for each command.
pub fn pages() -> Vec<(String, Vec<u8>)> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![(format!("ratelimit.{SECTION}"), overview(&cmd))];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("ratelimit-{}", sub.get_name());
        pages.push((format!("{name}.{SECTION}"), command_page(sub, &name)));
    }
    pages
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
            "the rules, as the systemd unit ratelimit@IFACE.service reads them",
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
    roff.text([roman(format!("ratelimit({SECTION})"))]);
    render(&mut out, |w| roff.to_writer(w));
    out
}

/// `ratelimit completions SHELL`: the script on standard output.
pub fn print_completions(shell: Shell) -> Result<()> {
    std::io::stdout()
        .write_all(&completions(shell))
        .map_err(Error::io("writing the completions to standard output"))
}

/// `ratelimit man [--out DIR]`: `ratelimit(8)` on standard output, or every
/// page into DIR (their paths printed).
pub fn print_man(out: Option<&Path>) -> Result<()> {
    let Some(dir) = out else {
        let (_, overview) = pages().swap_remove(0);
        return std::io::stdout()
            .write_all(&overview)
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
    fn completions_know_the_commands_and_flags() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).expect("UTF-8");
            for word in ["allowlist-only", "keep-attached", "deny", "completions"] {
                assert!(script.contains(word), "{shell}: {word} missing");
            }
        }
    }
}
