//! The text `--help` shows after the options: each command's examples, and
//! the exit codes under `ratelimit --help`. The man pages ([`crate::cli::docs`])
//! render the same text. Every example line is parsed by a test, so an
//! example that names a flag that does not exist fails the build's tests.

use crate::error::Kind;

/// `ratelimit --help`: the exit codes, and where the examples are.
pub fn top() -> String {
    let mut s = String::from("Exit status:\n  0  success\n");
    for kind in Kind::ALL {
        s.push_str(&format!("  {}  {}\n", kind.exit_code(), kind.meaning()));
    }
    s.push_str(
        "\nWith --json, a failed command also prints {\"error\": {\"kind\", \"message\", \
         \"field\", \"exit_code\"}} on stdout.\n\n\
         `ratelimit help COMMAND` shows a command's options and examples; \
         `man ratelimit` and `man ratelimit-COMMAND` once installed.",
    );
    s
}

/// `ratelimit run`.
pub const RUN: &str = "\
Examples:
  ratelimit run --iface eth0
  ratelimit run --iface eth0 --config /etc/ratelimit/eth0.toml --metrics :9477 --keep-attached
  ratelimit run --iface eth0 --rate 100/s --burst 50 --dry-run";

/// `ratelimit set`.
pub const SET: &str = "\
Examples:
  ratelimit set 198.18.0.0/24 --rate 100/s --per 24
  ratelimit set 198.18.0.0/24 --rate 200/s --quiet
  ratelimit set 0.0.0.0/0 --proto tcp --syn --rate 20/s --for 1h";

/// `ratelimit allow`.
pub const ALLOW: &str = "\
Examples:
  ratelimit allow 2001:db8:beef::/48
  ratelimit allow --from partners.ipset";

/// `ratelimit deny`.
pub const DENY: &str = "\
Examples:
  ratelimit deny 198.18.0.66/32 --for 10m
  ratelimit deny --from firehol_level1.netset
  cut -d, -f3 bans.csv | ratelimit deny --from - --name bans --for 4h";

/// `ratelimit unset`.
pub const UNSET: &str = "\
Examples:
  ratelimit unset 198.18.0.66/32
  ratelimit unset 0.0.0.0/0 --proto tcp --syn
  ratelimit unset --list firehol_level1";

/// `ratelimit mode`.
pub const MODE: &str = "\
Examples:
  ratelimit mode allowlist-only
  ratelimit mode normal";

/// `ratelimit reset`.
pub const RESET: &str = "\
Examples:
  ratelimit reset
  ratelimit reset --live
  ratelimit reset --config";

/// `ratelimit reload`.
pub const RELOAD: &str = "\
Examples:
  ratelimit reload
  ratelimit reload --replace --iface eth0";

/// `ratelimit list`.
pub const LIST: &str = "\
Examples:
  ratelimit list
  ratelimit list --stats
  ratelimit list --json --iface eth0";

/// `ratelimit status`.
pub const STATUS: &str = "\
Examples:
  ratelimit status
  ratelimit status --json";

/// `ratelimit stats`.
pub const STATS: &str = "\
Examples:
  ratelimit stats --watch
  ratelimit stats --json --iface eth0";

/// `ratelimit top`.
pub const TOP: &str = "\
Examples:
  ratelimit top -n 20
  ratelimit top --fleet --json";

/// `ratelimit log`.
pub const LOG: &str = "\
Examples:
  ratelimit log
  ratelimit log -n 100 --json
  ratelimit log --follow --iface eth0";

/// `ratelimit check`.
pub const CHECK: &str = "\
Examples:
  ratelimit check --config /etc/ratelimit/eth0.toml
  ratelimit check --config next.toml --json
  ratelimit check --config big.toml --max-rules 65536";

/// `ratelimit explain`.
pub const EXPLAIN: &str = "\
Examples:
  ratelimit explain 198.18.0.20
  ratelimit explain 198.18.0.20 --proto udp --dport 27015
  ratelimit explain 2001:db8::7 --proto tcp --dport 443 --syn --json";

/// `ratelimit get`.
pub const GET: &str = "\
Examples:
  ratelimit get 198.18.0.20
  ratelimit get 2001:db8::7 --json";

/// `ratelimit detach`.
pub const DETACH: &str = "\
Examples:
  ratelimit detach
  ratelimit detach --iface eth0";

/// `ratelimit gc`.
pub const GC: &str = "\
Examples:
  ratelimit gc
  ratelimit gc --json";

/// `ratelimit completions`.
pub const COMPLETIONS: &str = "\
Examples:
  ratelimit completions bash > /usr/share/bash-completion/completions/ratelimit
  ratelimit completions zsh > /usr/local/share/zsh/site-functions/_ratelimit
  ratelimit completions fish > ~/.config/fish/completions/ratelimit.fish";

/// `ratelimit man`.
pub const MAN: &str = "\
Examples:
  ratelimit man | man -l -
  ratelimit man ratelimit.toml | man -l -
  ratelimit man --out /tmp/ratelimit-man";

/// The example command lines of a help text: the lines that run `ratelimit`
/// (first, or after a pipe), up to a pipe or redirection.
pub fn examples(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        let command = if line.starts_with("ratelimit ") {
            line
        } else {
            &line[line.find("| ratelimit ")? + 2..]
        };
        let end = command.find(['|', '>']).unwrap_or(command.len());
        Some(command[..end].trim())
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::*;
    use crate::cli::args::Cli;

    #[test]
    fn every_command_has_examples_and_every_example_parses() {
        let cmd = Cli::command();
        let mut seen = 0;
        for sub in cmd.get_subcommands() {
            let after = sub
                .get_after_help()
                .unwrap_or_else(|| panic!("`ratelimit {}` has no examples", sub.get_name()))
                .to_string();
            let lines: Vec<&str> = examples(&after).collect();
            assert!(
                (1..=3).contains(&lines.len()),
                "`ratelimit {}`: {} examples, expected 1 to 3: {after}",
                sub.get_name(),
                lines.len()
            );
            for line in lines {
                let words: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(
                    words.get(1).copied(),
                    Some(sub.get_name()),
                    "an example of `ratelimit {}` runs another command: {line}",
                    sub.get_name()
                );
                if let Err(e) = Cli::try_parse_from(&words) {
                    panic!("the example `{line}` does not parse: {e}");
                }
                seen += 1;
            }
        }
        assert!(seen > 20, "only {seen} examples found");
    }

    #[test]
    fn examples_are_cut_at_pipes_and_redirections() {
        let found: Vec<&str> = examples(DENY).chain(examples(COMPLETIONS)).collect();
        assert!(
            found.contains(&"ratelimit deny --from - --name bans --for 4h"),
            "{found:?}"
        );
        assert!(found.contains(&"ratelimit completions bash"), "{found:?}");
        assert!(examples("Examples:\n  man ratelimit\n").next().is_none());
    }

    #[test]
    fn top_help_lists_every_exit_code() {
        let text = top();
        for code in 0..=5 {
            assert!(text.contains(&format!("\n  {code}  ")), "{text}");
        }
    }
}
