//! The command line: clap parses strings into [`Cli`]; [`main`] turns them into
//! validated types and runs the command.

pub mod docs;
pub mod help;
pub mod report;

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use serde_json::Value;

use crate::{
    config::{RawBurst, RawConfig, RawLevel, RawLimit},
    daemon::{self, RunOptions, offline},
    error::{Error, Result},
    host::input,
    kernel::{AttachMode, LoadOptions},
    model::lists::{self, ListAction},
    model::rate::{parse_duration, parse_rate},
    model::rules::{Clock, MalformedPolicy},
    protocol::{self, Request},
};

/// A per-source packet rate limiter at the NIC driver (XDP).
#[derive(Debug, Parser)]
#[command(name = "ratelimit", version, after_help = help::top())]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: attach to an interface and enforce.
    #[command(after_help = help::RUN)]
    Run(RunArgs),
    /// Set a limit on the default rule or a CIDR.
    #[command(after_help = help::SET)]
    Set(SetArgs),
    /// Exempt a CIDR, or a list of them (--from FILE): never limited.
    #[command(after_help = help::ALLOW)]
    Allow(ListableArgs),
    /// Drop everything from a CIDR, or from a list of them (--from FILE).
    #[command(after_help = help::DENY)]
    Deny(ListableArgs),
    /// Remove the rule of a CIDR, or a list (--list NAME).
    #[command(after_help = help::UNSET)]
    Unset(UnsetArgs),
    /// Switch between normal and allowlist-only (everything not under an
    /// `allow` rule dropped); kept across restarts.
    #[command(after_help = help::MODE)]
    Mode(ModeArgs),
    /// Read the config file again; live changes stay on top (unless --replace).
    #[command(after_help = help::RELOAD)]
    Reload(ReloadArgs),
    /// Show the rules (with --stats, what each rule passed and dropped).
    #[command(after_help = help::LIST)]
    List(ListArgs),
    /// Show what runs and how.
    #[command(after_help = help::STATUS)]
    Status(ReadArgs),
    /// Show counters by reason, with per-second rates.
    #[command(after_help = help::STATS)]
    Stats(StatsArgs),
    /// Show the sources with the most drops.
    #[command(after_help = help::TOP)]
    Top(TopArgs),
    /// Serve the throttling service (HTTP and JSON) for other programs, on Redis.
    #[command(after_help = help::SERVE)]
    Serve(ServeArgs),
    /// Check a config file as `run` and `reload` would read it, without
    /// touching anything running: every error with its line; exit status 2
    /// if there is any.
    #[command(after_help = help::CHECK)]
    Check(CheckArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = help::COMPLETIONS)]
    Completions(CompletionsArgs),
    /// Print the man page ratelimit(8), or write every page into a directory.
    #[command(after_help = help::MAN)]
    Man(ManArgs),
}

/// `ratelimit check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The TOML config file to check (and the list files it names).
    #[arg(long)]
    pub config: PathBuf,
    /// Print one JSON object: {"file", "ok", "errors": [{"line", "field",
    /// "message"}], "summary"}.
    #[arg(long)]
    pub json: bool,
    /// The daemon's --max-rules: more rules are an error.
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_RULES_CAPACITY, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rules: u32,
    /// The daemon's --max-list-entries: more list entries are an error.
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_LIST_CAPACITY, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_list_entries: u32,
}

/// `ratelimit completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `ratelimit man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write ratelimit.8 and one ratelimit-COMMAND.8 per command into DIR
    /// (created if missing) instead of printing ratelimit.8.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl Cli {
    /// Whether the command asked for JSON output (`--json`): a failure is then
    /// reported as JSON on stdout too.
    pub fn json(&self) -> bool {
        match &self.command {
            Command::List(l) => l.read.json,
            Command::Status(r) => r.json,
            Command::Check(c) => c.json,
            Command::Stats(s) => s.read.json,
            Command::Top(t) => t.read.json,
            Command::Run(_)
            | Command::Set(_)
            | Command::Allow(_)
            | Command::Deny(_)
            | Command::Unset(_)
            | Command::Mode(_)
            | Command::Reload(_)
            | Command::Serve(_)
            | Command::Completions(_)
            | Command::Man(_) => false,
        }
    }
}

/// `ratelimit serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on: HOST:PORT, [V6]:PORT, localhost:PORT, or :PORT
    /// (every IPv4 address).
    #[arg(long, default_value = "127.0.0.1:9478")]
    pub listen: String,
    /// Redis: redis://HOST:PORT[/DB] for one server, or
    /// redis+cluster://HOST:PORT,HOST:PORT for a Redis Cluster.
    #[arg(long)]
    pub redis: String,
    /// Prefix of the Redis keys (each key is PREFIX{KEY}).
    #[arg(long, default_value = "ratelimit:")]
    pub prefix: String,
    /// Client connections open at once; past it the one idle longest is
    /// closed for a new one, and when all are busy a new one is answered 503
    /// [default: 1024, or the open-file limit minus 96 if lower].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<String>,
    /// How long a request's headers may take to arrive, from the connection's
    /// opening (or a later request's first byte).
    #[arg(long, value_name = "DURATION", default_value = crate::serve::DEFAULT_HEADER_TIMEOUT)]
    pub header_timeout: String,
    /// How long a keep-alive connection may wait for its next request.
    #[arg(long, value_name = "DURATION", default_value = crate::serve::DEFAULT_IDLE_TIMEOUT)]
    pub idle_timeout: String,
    /// How long a request's body may take to arrive, from its headers
    /// (answered 408 past it).
    #[arg(long, value_name = "DURATION", default_value = crate::serve::DEFAULT_BODY_TIMEOUT)]
    pub body_timeout: String,
    /// Largest request body, like 16KiB or 65536 (bytes); answered 413 past
    /// it.
    #[arg(long, value_name = "SIZE", default_value = crate::serve::DEFAULT_MAX_BODY)]
    pub max_body: String,
}

impl ServeArgs {
    /// The validated options: each flag's error names it and its forms.
    pub fn options(&self) -> Result<crate::serve::Options> {
        use crate::serve::{DEFAULT_PORT, MAX_MAX_BODY, MAX_TIMEOUT, Options};
        let timeout = |flag: &str, s: &str| -> Result<Duration> {
            let d = Duration::from_nanos(parse_duration(flag, s)?);
            if d < Duration::from_millis(1) || d > MAX_TIMEOUT {
                return Err(Error::invalid(
                    flag,
                    format!("{s:?} is out of range; write 1ms to 1h, like 500ms, 5s or 2min"),
                ));
            }
            Ok(d)
        };
        let max_connections = match &self.max_connections {
            None => None,
            Some(s) => match s.trim().parse::<usize>() {
                Ok(n) if (1..=1_000_000).contains(&n) => Some(n),
                _ => {
                    return Err(Error::invalid(
                        "--max-connections",
                        format!(
                            "{s:?} is not a number of connections from 1 to 1000000, like 1024"
                        ),
                    ));
                }
            },
        };
        let max_body = crate::model::rate::parse_size("--max-body", &self.max_body)?;
        if max_body == 0 || max_body > MAX_MAX_BODY as u64 {
            return Err(Error::invalid(
                "--max-body",
                format!(
                    "{:?} is out of range; write 1 byte to 1MiB, like 16KiB or 65536",
                    self.max_body
                ),
            ));
        }
        Ok(Options {
            listen: crate::host::listen::listen_addr("--listen", &self.listen, DEFAULT_PORT)?,
            redis: self.redis.clone(),
            prefix: self.prefix.clone(),
            max_connections,
            header_timeout: timeout("--header-timeout", &self.header_timeout)?,
            idle_timeout: timeout("--idle-timeout", &self.idle_timeout)?,
            body_timeout: timeout("--body-timeout", &self.body_timeout)?,
            max_body: max_body as usize,
        })
    }
}

/// `ratelimit run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The interface to attach to.
    #[arg(long)]
    pub iface: String,
    /// A TOML config file (see examples/ratelimit.toml); SIGHUP reloads it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Default rate per source [default: 1000/s].
    #[arg(long)]
    pub rate: Option<String>,
    /// Default burst [default: one second's worth of the rate].
    #[arg(long)]
    pub burst: Option<String>,
    /// IPv4 key prefix: 32 limits each address, 24 each /24 [default: 32].
    #[arg(long)]
    pub per_v4: Option<u8>,
    /// IPv6 key prefix: 64 limits each /64 [default: 64].
    #[arg(long)]
    pub per_v6: Option<u8>,
    /// Attach mode.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub mode: AttachMode,
    /// Never drop: count what would have been dropped.
    #[arg(long)]
    pub dry_run: bool,
    /// Drop truncated or malformed IP frames (default: pass them).
    #[arg(long)]
    pub drop_malformed: bool,
    /// Frames the kernel would deliver as IP that cannot be judged (more than
    /// 8 VLAN tags, an IPv6 chain of more than 8 extension headers, a tiny
    /// first fragment): drop them (the default), judge them by the rules that
    /// need nothing they hide (next-rule), or pass them [default: drop].
    #[arg(long, value_enum)]
    pub unjudged: Option<crate::model::rules::Unjudged>,
    /// Non-first fragments under a rule that matches ports or TCP flags:
    /// judged by the next rule of their source (their first fragment carries
    /// the header and is judged whole), or dropped [default: next-rule].
    #[arg(long, value_enum)]
    pub fragments: Option<crate::model::rules::Fragments>,
    /// Leave the program attached and enforcing after exit.
    #[arg(long)]
    pub keep_attached: bool,
    /// Fresh maps, sized by the --max-* options: buckets and counters start
    /// over; the rules are kept.
    #[arg(long)]
    pub reset: bool,
    /// Serve Prometheus metrics over HTTP on this address: HOST:PORT like
    /// 127.0.0.1:9477, [::1]:9477, localhost:9477, or :9477 (every IPv4
    /// address).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// IPv4 sources tracked at once (a load-time setting; 80 bytes each).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_STATE_CAPACITY)]
    pub max_sources: u32,
    /// IPv6 sources (per key prefix, /64 by default) tracked at once (a
    /// load-time setting; 96 bytes each).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_STATE_V6_CAPACITY)]
    pub max_sources_v6: u32,
    /// Prefix rules at most (a load-time setting; each rule's counters take
    /// 128 bytes per CPU).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_RULES_CAPACITY)]
    pub max_rules: u32,
    /// Blocklist and allowlist entries at most, all lists together (a
    /// load-time setting; kernel memory is taken per entry loaded, about 100
    /// bytes in each of the two rule tries).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_LIST_CAPACITY)]
    pub max_list_entries: u32,
    /// Sources tracked at once under the algorithms other than gcra (a load-time
    /// setting; about 540 bytes each).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_WIDE_CAPACITY)]
    pub max_wide_sources: u32,
    /// The default rule's budget for frames from sources without state yet, e.g.
    /// 10k/s, or `unlimited` [default: 10k/s].
    #[arg(long)]
    pub new_sources: Option<String>,
    /// States created per second at most, all rules together [default: 100k/s].
    #[arg(long)]
    pub new_states: Option<String>,
    /// The clock decisions are made on: precise (exact to the ns) or coarse (the
    /// last scheduler tick: cheaper, at most one tick's worth of rate more).
    #[arg(long, value_enum)]
    pub clock: Option<Clock>,
    /// Doorkeeper slots: how many sources seen once are remembered (a power of
    /// two, 8 bytes each; a load-time setting).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_SEEN_SLOTS)]
    pub doorkeeper_slots: u32,
    /// Share fleet-wide rules with the other daemons through this Redis:
    /// redis://HOST:PORT, redis+unix:///PATH or redis+cluster://HOST:PORT,…
    #[arg(long, value_name = "REDIS_URL")]
    pub fleet: Option<String>,
    /// What fleet-wide rules do while Redis cannot be reached: `share` (each
    /// daemon admits the limit divided by the daemons last seen) or `local`
    /// (each daemon admits the whole limit: the fleet up to N times it).
    #[arg(long, value_enum, default_value_t = crate::fleet::Fallback::Share)]
    pub fleet_fallback: crate::fleet::Fallback,
}

/// The daemon to talk to.
#[derive(Debug, Args)]
pub struct Target {
    /// The daemon's interface (may be left out when one daemon runs).
    #[arg(long)]
    pub iface: Option<String>,
}

/// `ratelimit set`.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// `default` or a CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    pub target: String,
    #[command(flatten)]
    pub matches: MatchArgs,
    /// Rate, e.g. 500/s, 30/min, 10k/s, 100Mbit/s (gcra). Up to three key
    /// levels at once, each a --rate with its --per (and --burst, if any):
    /// `--per 32 --rate 100/s --per 24 --rate 1000/s`.
    #[arg(long)]
    pub rate: Vec<String>,
    /// Algorithm: gcra (default), token-bucket-interval, fixed-window,
    /// sliding-log, sliding-window, rolling-quota.
    #[arg(long)]
    pub algorithm: Option<String>,
    /// Packets per window (fixed-window, sliding-log, sliding-window).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Window, e.g. 1s, 1min, 24h (windows, rolling-quota).
    #[arg(long)]
    pub window: Option<String>,
    /// Refill period, e.g. 1s (token-bucket-interval).
    #[arg(long)]
    pub refill_every: Option<String>,
    /// Tokens per refill (token-bucket-interval).
    #[arg(long)]
    pub refill_amount: Option<u64>,
    /// Bucket size (token-bucket-interval).
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Packets per window (rolling-quota).
    #[arg(long)]
    pub quota: Option<u64>,
    /// Period, e.g. 1h (rolling-quota).
    #[arg(long)]
    pub period: Option<String>,
    /// Packets per period (rolling-quota).
    #[arg(long)]
    pub rate_cap: Option<u64>,
    /// Burst: a count, or a size for byte rates (with several levels, one
    /// per --rate, in the same order).
    #[arg(long)]
    pub burst: Vec<String>,
    /// Key prefix length for the CIDR's family (32 per IPv4 address, 64 per
    /// IPv6 /64); with several levels, one per --rate, in the same order.
    #[arg(long)]
    pub per: Vec<u8>,
    /// Count bytes: with a plain count rate like 1M/s, 1M bytes/s.
    #[arg(long)]
    pub bytes: bool,
    /// Never drop for this rule; count would-drops (`--dry-run false` ends it).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub dry_run: Option<bool>,
    /// Take a byte burst below one full-size frame (1514 bytes), which such
    /// frames can never pass.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub change: ChangeArgs,
    /// Budget for frames from the rule's sources that have no state yet, e.g.
    /// 10k/s, or `unlimited` [default: 10k/s].
    #[arg(long)]
    pub new_sources: Option<String>,
    /// Burst of the new-source budget [default: one second's worth].
    #[arg(long, requires = "new_sources")]
    pub new_sources_burst: Option<String>,
    /// Aggregate level: all the rule's sources together, e.g. 100k/s or 1Gbit/s.
    #[arg(long)]
    pub aggregate: Option<String>,
    /// Burst of the aggregate level [default: one second's worth].
    #[arg(long, requires = "aggregate")]
    pub aggregate_burst: Option<String>,
    /// The part of the aggregate's burst only sources established before a
    /// flood may take: a count, or a share like 50% [default: 50%]; 0 for one
    /// bucket shared alike.
    #[arg(long, requires = "aggregate")]
    pub aggregate_reserve: Option<String>,
    /// The limit holds across the fleet: every daemon run with --fleet keeps
    /// each key in step through Redis (gcra only).
    #[arg(long)]
    pub fleet: bool,
    /// Frames of the host's own connections (established TCP, connected
    /// UDP, on a local port in the ephemeral range): `pass` (never dropped by
    /// this limit) or `limit` [default: pass].
    #[arg(long, value_enum)]
    pub host_connections: Option<crate::model::rules::HostConnections>,
    #[command(flatten)]
    pub target_daemon: Target,
}

/// How a change is made and told.
#[derive(Debug, Args, Default)]
pub struct ChangeArgs {
    /// For this long only, e.g. 10m, 1h, 7d: then the rule ends by itself
    /// (what it replaced comes back), across restarts too.
    #[arg(long = "for", value_name = "DURATION")]
    pub for_: Option<String>,
    /// Print nothing (the exit code tells); `ratelimit list` shows the rules.
    #[arg(long, short)]
    pub quiet: bool,
}

impl ChangeArgs {
    /// `--for` in ms.
    fn for_ms(&self) -> Result<Option<u64>> {
        self.for_
            .as_deref()
            .map(|d| parse_duration("--for", d).map(|ns| ns.div_ceil(1_000_000)))
            .transpose()
    }
}

/// `--quiet` alone, for the changes that are for good.
#[derive(Debug, Args, Default)]
pub struct QuietArgs {
    /// Print nothing (the exit code tells); `ratelimit list` shows the rules.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `ratelimit mode`.
#[derive(Debug, Args)]
pub struct ModeArgs {
    /// `allowlist-only`: only sources under an `allow` rule pass (every other
    /// frame is dropped, counted `not_allowed`); `normal`: every rule does
    /// what it says again.
    #[arg(value_enum)]
    pub mode: crate::model::rules::Mode,
    #[command(flatten)]
    pub quiet: QuietArgs,
    #[command(flatten)]
    pub target: Target,
}

/// What a rule matches besides its source: several rules may share a CIDR
/// with different matches (the most specific wins; `ratelimit list` shows
/// them in the order they are tried).
#[derive(Debug, Args, Default)]
pub struct MatchArgs {
    /// Only frames of this transport protocol: tcp, udp, icmp, icmpv6 or a
    /// number.
    #[arg(long, help_heading = "Match")]
    pub proto: Option<String>,
    /// Only frames to this destination port or range, e.g. 53 or
    /// 27015-27020 (with --proto tcp or udp).
    #[arg(long, help_heading = "Match")]
    pub dport: Option<String>,
    /// Only TCP SYNs without ACK, a connection's first frame (with --proto tcp).
    #[arg(long, help_heading = "Match")]
    pub syn: bool,
    /// Only this ICMP or ICMPv6 type, e.g. 8 for echo requests (with --proto
    /// icmp or icmpv6).
    #[arg(long, help_heading = "Match")]
    pub icmp_type: Option<u8>,
    /// Only frames to this destination address or network (of the CIDR's
    /// family), e.g. 198.18.0.10 on a host that serves several addresses.
    #[arg(long, help_heading = "Match")]
    pub to: Option<String>,
}

impl MatchArgs {
    /// Whether any match was given.
    fn any(&self) -> bool {
        self.proto.is_some()
            || self.dport.is_some()
            || self.syn
            || self.icmp_type.is_some()
            || self.to.is_some()
    }

    /// The selector's text form (the daemon parses and checks it).
    fn selector(&self, cidr: &str) -> String {
        let mut s = cidr.trim().to_string();
        let mut add = |word: &str, value: Option<&str>| {
            s.push(' ');
            s.push_str(word);
            if let Some(v) = value {
                s.push(' ');
                s.push_str(v.trim());
            }
        };
        if let Some(t) = &self.to {
            add("to", Some(t));
        }
        if let Some(p) = &self.proto {
            add("proto", Some(p));
        }
        if let Some(d) = &self.dport {
            add("dport", Some(d));
        }
        if self.syn {
            add("syn", None);
        }
        if let Some(t) = self.icmp_type {
            add("type", Some(&t.to_string()));
        }
        s
    }
}

/// A CIDR command.
#[derive(Debug, Args)]
pub struct CidrArgs {
    /// A CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    pub cidr: String,
    #[command(flatten)]
    pub matches: MatchArgs,
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit allow` and `ratelimit deny`: a CIDR, or a list from a file.
#[derive(Debug, Args)]
pub struct ListableArgs {
    /// A CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    #[arg(required_unless_present = "from", conflicts_with = "from")]
    pub cidr: Option<String>,
    #[command(flatten)]
    pub matches: MatchArgs,
    /// Load a list from FILE (`-`: standard input), applied whole or not at
    /// all: one CIDR or address per line, `#` comments, FireHOL .netset
    /// files, `ipset save` output (its `add` lines). Loading a name again
    /// replaces that list.
    #[arg(long, value_name = "FILE", help_heading = "Lists")]
    pub from: Option<String>,
    /// The list's name [default: the file's stem, e.g. firehol_level1 for
    /// firehol_level1.netset]; `ratelimit unset --list NAME` removes it.
    #[arg(long, requires = "from", help_heading = "Lists")]
    pub name: Option<String>,
    #[command(flatten)]
    pub change: ChangeArgs,
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit unset`.
#[derive(Debug, Args)]
pub struct UnsetArgs {
    /// A CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    #[arg(required_unless_present = "list", conflicts_with = "list")]
    pub cidr: Option<String>,
    #[command(flatten)]
    pub matches: MatchArgs,
    /// Remove the list of this name (a list of the config file: until
    /// `ratelimit reload --replace`).
    #[arg(long, value_name = "NAME")]
    pub list: Option<String>,
    /// Only end the CIDR's temporary rule (what it hid comes back); no
    /// change, and no error, when it has none (its time was up).
    #[arg(long, conflicts_with = "list")]
    pub only_temporary: bool,
    #[command(flatten)]
    pub quiet: QuietArgs,
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit reload`.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// Drop the live changes (set, allow, deny, unset): the config file alone.
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub quiet: QuietArgs,
    #[command(flatten)]
    pub target: Target,
}

/// A read command.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// With each rule's counters: packets passed, dropped at each level, and
    /// would-drops (dry run).
    #[arg(long)]
    pub stats: bool,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `ratelimit stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Refresh every second until interrupted.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `ratelimit top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// How many sources.
    #[arg(short, default_value_t = 10)]
    pub n: usize,
    /// The fleet's use of each key of the fleet-wide rules (all daemons
    /// together, from Redis), this minute and the last.
    #[arg(long)]
    pub fleet: bool,
    #[command(flatten)]
    pub read: ReadArgs,
}

impl RunArgs {
    /// The command line's rule options as a config (only what was given).
    fn rules(&self) -> RawConfig {
        let mut default = RawLimit {
            rate: self.rate.clone(),
            burst: self.burst.clone().map(RawBurst::Text),
            per_v4: self.per_v4,
            per_v6: self.per_v6,
            new_sources: self.new_sources.clone(),
            ..Default::default()
        };
        let any_default = default != RawLimit::default();
        if any_default {
            default.action = None;
        }
        RawConfig {
            dry_run: self.dry_run.then_some(true),
            malformed: self.drop_malformed.then_some(MalformedPolicy::Drop),
            clock: self.clock,
            new_states: self.new_states.clone(),
            default: any_default.then_some(default),
            rules: Vec::new(),
            lists: Vec::new(),
            mode: None,
            unjudged: self.unjudged,
            fragments: self.fragments,
        }
    }

    /// The validated run options: the rule options are checked (alone, and
    /// against the config file) before anything else happens.
    pub fn options(&self) -> Result<RunOptions> {
        if let Some(rate) = &self.rate
            && parse_rate("--rate", rate)?.tokens == 0
        {
            return Err(Error::invalid(
                "--rate",
                "0/s for the default rule would drop every source; to drop a network use `ratelimit deny CIDR`",
            ));
        }
        if !self.doorkeeper_slots.is_power_of_two() || self.doorkeeper_slots < 1024 {
            return Err(Error::invalid(
                "--doorkeeper-slots",
                format!(
                    "{} is not a power of two of at least 1024, like 65536 or 1048576",
                    self.doorkeeper_slots
                ),
            ));
        }
        for (flag, n) in [
            ("--max-sources", self.max_sources),
            ("--max-sources-v6", self.max_sources_v6),
            ("--max-rules", self.max_rules),
            ("--max-list-entries", self.max_list_entries),
            ("--max-wide-sources", self.max_wide_sources),
        ] {
            if n == 0 {
                return Err(Error::invalid(flag, "must be at least 1"));
            }
        }
        // The options alone first, so that an error names the flag typed.
        let cli = self.rules();
        RawConfig::merge(RawConfig::default(), &cli, "")
            .and_then(|alone| alone.validate(&crate::model::rules::RuleSet::default()))
            .map_err(|e| match e {
                Error::Invalid { field, message } => Error::Invalid {
                    field: as_flag(&field),
                    message,
                },
                e => e,
            })?;
        let metrics = self
            .metrics
            .as_deref()
            .map(|m| {
                crate::host::listen::listen_addr(
                    "--metrics",
                    m,
                    crate::daemon::metrics::EXAMPLE_PORT,
                )
            })
            .transpose()?;
        let opts = RunOptions {
            iface: self.iface.clone(),
            config: self.config.clone(),
            cli,
            mode: self.mode,
            keep_attached: self.keep_attached,
            reset: self.reset,
            metrics,
            fleet: self.fleet.clone(),
            fleet_fallback: self.fleet_fallback,
            load: LoadOptions {
                state_capacity: self.max_sources,
                state_capacity_v6: self.max_sources_v6,
                rules_capacity: self.max_rules,
                list_capacity: self.max_list_entries,
                wide_capacity: self.max_wide_sources,
                seen_slots: self.doorkeeper_slots,
            },
        };
        // Checked now: a bad file or a conflicting option changes nothing.
        opts.given()?;
        Ok(opts)
    }
}

/// The run flag of a config key the command line set: `default.burst` is
/// `--burst`, `new-states` is `--new-states`.
fn as_flag(field: &str) -> String {
    let key = field.strip_prefix("default.").unwrap_or(field);
    format!("--{}", key.replace('_', "-"))
}

/// The daemon a change goes to.
fn iface(t: &Target) -> Result<String> {
    match &t.iface {
        Some(i) => Ok(i.clone()),
        None => protocol::only_daemon(),
    }
}

/// After a change found no daemon: for each program of this namespace
/// pinned and enforcing on its own (`want`: the one of `--iface`), says how
/// to adopt it.
fn adopt_hint(want: Option<&str>) {
    for iface in offline::pinned_here()
        .unwrap_or_default()
        .iter()
        .filter(|i| want.is_none_or(|w| w == *i))
    {
        eprintln!(
            "ratelimit: the program pinned for {iface} enforces without a daemon: `ratelimit run --iface {iface}` adopts it (rules and buckets kept), then changes can be made"
        );
    }
}

impl Command {
    /// The `--iface` a change was given; `None` for what is not a change.
    fn change_target(&self) -> Option<Option<&str>> {
        let t = match self {
            Command::Set(a) => &a.target_daemon,
            Command::Allow(a) | Command::Deny(a) => &a.target,
            Command::Unset(a) => &a.target,
            Command::Mode(a) => &a.target,
            Command::Reload(a) => &a.target,
            _ => return None,
        };
        Some(t.iface.as_deref())
    }
}

/// Sends a read-only request to the daemon; with no daemon, answers it from
/// the pinned maps of a program that enforces on its own (and says so on
/// stderr).
async fn read(t: &Target, request: &Request) -> Result<Value> {
    let daemon = match &t.iface {
        Some(i) => Ok(i.clone()),
        None => protocol::only_daemon(),
    };
    let (want, no_daemon) = match daemon {
        Ok(iface) => match protocol::call(&iface, request).await {
            Err(e @ Error::NoDaemon { .. }) => (Some(iface), e),
            answer => return answer,
        },
        Err(e @ Error::NoDaemonHere { .. }) => (None, e),
        // Several daemons (--iface says which), not root, …
        Err(e) => return Err(e),
    };
    let iface = match want {
        Some(i) => i,
        None => {
            let mut pinned = offline::pinned_here().unwrap_or_default();
            match pinned.len() {
                0 => return Err(no_daemon),
                1 => pinned.remove(0),
                _ => {
                    return Err(Error::invalid(
                        "--iface",
                        format!(
                            "no daemon runs in this network namespace, and programs are pinned for {}: say which with --iface",
                            pinned.join(", ")
                        ),
                    ));
                }
            }
        }
    };
    match offline::Pinned::open(&iface)? {
        Some(p) => {
            // Once, also under `stats --watch`.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!("ratelimit: {}", p.note());
            }
            p.answer(request).await
        }
        None => Err(no_daemon),
    }
}

/// Runs the command line.
pub async fn main(cli: Cli) -> Result<()> {
    if !matches!(cli.command, Command::Run(_) | Command::Serve(_)) {
        // A command's output piped into `head` ends quietly when the reader
        // goes, as other tools' do (Rust ignores SIGPIPE, and printing would
        // panic). Not for the daemons, whose sockets' peers may go any time.
        // SAFETY: setting a signal's disposition to the default.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let change = cli.command.change_target().map(|t| t.map(str::to_string));
    let done = run_command(cli.command).await;
    if let (Some(want), Err(Error::NoDaemon { .. } | Error::NoDaemonHere { .. })) = (&change, &done)
    {
        adopt_hint(want.as_deref());
    }
    done
}

async fn run_command(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => {
            let opts = args.options()?;
            daemon::run(opts, shutdown_signal()).await
        }
        Command::Serve(args) => crate::serve::serve(args.options()?, shutdown_signal()).await,
        Command::Check(a) => {
            if !crate::config::check::command(&a.config, a.json, a.max_rules, a.max_list_entries) {
                // The report is printed; 2 is invalid input's exit status.
                std::process::exit(2);
            }
            Ok(())
        }
        Command::Completions(c) => crate::cli::docs::print_completions(c.shell),
        Command::Man(m) => crate::cli::docs::print_man(m.out.as_deref()),
        Command::Set(args) => {
            // `--bytes` with a plain count: the count is bytes.
            let rates: Vec<String> = args
                .rate
                .iter()
                .map(|r| {
                    if args.bytes && !r.contains('B') && !r.contains("bit") {
                        let (amount, per) = r.split_once('/').unwrap_or((r, "s"));
                        format!("{amount}B/{per}")
                    } else {
                        r.clone()
                    }
                })
                .collect();
            let levels = set_levels(&args, &rates)?;
            let limit = RawLimit {
                action: Some("limit".into()),
                rate: rates.first().cloned(),
                algorithm: args.algorithm.clone(),
                limit: args.limit,
                window: args.window.clone(),
                refill_every: args.refill_every.clone(),
                refill_amount: args.refill_amount,
                capacity: args.capacity,
                quota: args.quota,
                period: args.period.clone(),
                rate_cap: args.rate_cap,
                burst: args.burst.first().cloned().map(RawBurst::Text),
                per: if args.target == "default" {
                    None
                } else {
                    args.per.first().copied()
                },
                per_v4: None,
                per_v6: None,
                dry_run: args.dry_run,
                new_sources: args.new_sources.clone(),
                new_sources_burst: args.new_sources_burst.clone().map(RawBurst::Text),
                aggregate: args.aggregate.clone(),
                aggregate_burst: args.aggregate_burst.clone().map(RawBurst::Text),
                aggregate_reserve: args.aggregate_reserve.clone().map(RawBurst::Text),
                fleet: args.fleet.then_some(true),
                host_connections: args.host_connections,
                levels,
            };
            if args.target == "default" && !args.per.is_empty() {
                return Err(Error::invalid(
                    "--per",
                    "the default rule covers both families; restart the daemon with --per-v4/--per-v6",
                ));
            }
            if args.target == "default" && args.matches.any() {
                return Err(Error::invalid(
                    "default",
                    "the default rule matches every frame no rule takes; for a rule with a match give a CIDR, e.g. `ratelimit set 0.0.0.0/0 --proto tcp --syn --rate 20/s`",
                ));
            }
            let target = if args.target == "default" {
                args.target
            } else {
                args.matches.selector(&args.target)
            };
            let for_ms = args.change.for_ms()?;
            let iface = iface(&args.target_daemon)?;
            let data = protocol::call(
                &iface,
                &Request::Set {
                    target,
                    limit: Box::new(limit),
                    for_ms,
                    force: args.force,
                },
            )
            .await?;
            print_changes(&data, args.change.quiet);
            Ok(())
        }
        Command::Allow(a) => {
            listable_command(a, ListAction::Allow, |cidr, for_ms| Request::Allow {
                cidr,
                for_ms,
            })
            .await
        }
        Command::Deny(a) => {
            listable_command(a, ListAction::Deny, |cidr, for_ms| Request::Deny {
                cidr,
                for_ms,
            })
            .await
        }
        Command::Unset(a) => {
            let iface = iface(&a.target)?;
            let request = match (&a.list, &a.cidr) {
                (Some(name), _) => {
                    if a.matches.any() {
                        return Err(Error::invalid(
                            "--list",
                            "a list is removed by its name alone: leave out --proto, --dport, --syn, --icmp-type and --to",
                        ));
                    }
                    Request::UnsetList { name: name.clone() }
                }
                (None, Some(cidr)) => Request::Unset {
                    cidr: a.matches.selector(cidr),
                    only_temporary: a.only_temporary,
                },
                (None, None) => {
                    return Err(Error::invalid("CIDR", "give a CIDR, or --list NAME"));
                }
            };
            print_changes(&protocol::call(&iface, &request).await?, a.quiet.quiet);
            Ok(())
        }
        Command::Mode(m) => {
            let data = protocol::call(&iface(&m.target)?, &Request::Mode { mode: m.mode }).await?;
            print_changes(&data, m.quiet.quiet);
            Ok(())
        }
        Command::Reload(r) => {
            let data =
                protocol::call(&iface(&r.target)?, &Request::Reload { replace: r.replace }).await?;
            print_changes(&data, r.quiet.quiet);
            Ok(())
        }
        Command::List(l) => {
            let request = Request::List { counters: l.stats };
            let data = read(&l.read.target, &request).await?;
            if l.read.json {
                print_json(&data)
            } else {
                print_list(&data);
                if l.stats {
                    print_rule_counters(&data);
                }
            }
            Ok(())
        }
        Command::Status(r) => {
            let data = read(&r.target, &Request::Status).await?;
            if r.json {
                print_json(&data)
            } else if let Value::Object(m) = &data {
                for (k, v) in m {
                    println!("{k:16} {v}");
                }
            }
            Ok(())
        }
        Command::Stats(s) => {
            // On a terminal the screen is refreshed in place; into a pipe or
            // a file each reading follows the last (with --json, one object
            // per line).
            let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
            loop {
                let data = read(&s.read.target, &Request::Stats).await?;
                if s.watch && tty {
                    // Clear the screen and home the cursor.
                    print!("\x1b[2J\x1b[H");
                }
                match (s.read.json, s.watch && !tty) {
                    (true, true) => println!("{data}"),
                    (true, false) => print_json(&data),
                    (false, _) => print_stats(&data),
                }
                if s.watch && !tty {
                    use std::io::Write as _;
                    let _ = std::io::stdout().flush();
                }
                if !s.watch {
                    return Ok(());
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = shutdown_signal() => return Ok(()),
                }
            }
        }
        Command::Top(t) if t.fleet => {
            let data =
                protocol::call(&iface(&t.read.target)?, &Request::FleetTop { n: t.n }).await?;
            if t.read.json {
                print_json(&data)
            } else {
                println!(
                    "fleet-wide use, all daemons (from {}):",
                    data["redis"].as_str().unwrap_or("?")
                );
                println!(
                    "{:<24} {:<44} {:>12} {:>12}",
                    "rule", "key", "this minute", "last minute"
                );
                for rule in data["rules"].as_array().into_iter().flatten() {
                    let name = rule["rule"].as_str().unwrap_or("?");
                    println!(
                        "{:<24} {:<44} {:>12} {:>12}",
                        name,
                        "(all keys shown)",
                        rule["this_minute"].as_u64().unwrap_or(0),
                        rule["last_minute"].as_u64().unwrap_or(0)
                    );
                    for k in rule["keys"].as_array().into_iter().flatten() {
                        println!(
                            "{:<24} {:<44} {:>12} {:>12}",
                            "",
                            k["key"].as_str().unwrap_or("?"),
                            k["this_minute"].as_u64().unwrap_or(0),
                            k["last_minute"].as_u64().unwrap_or(0)
                        );
                    }
                }
            }
            Ok(())
        }
        Command::Top(t) => {
            let data = read(&t.read.target, &Request::Top { n: t.n }).await?;
            if t.read.json {
                print_json(&data)
            } else {
                println!(
                    "{:<40} {:>5} {:>14} {:>14}",
                    "source", "level", "dropped", "dropped/s"
                );
                for row in data["top"].as_array().into_iter().flatten() {
                    println!(
                        "{:<40} {:>5} {:>14} {:>14.0}",
                        row["source"].as_str().unwrap_or("?"),
                        row["level"].as_u64().unwrap_or(1),
                        row["dropped"].as_u64().unwrap_or(0),
                        row["dropped_per_s"].as_f64().unwrap_or(0.0)
                    );
                }
            }
            Ok(())
        }
    }
}

/// The key levels `set` was given beyond the first: the second and third
/// `--rate`, each with its `--per` and `--burst`.
fn set_levels(args: &SetArgs, rates: &[String]) -> Result<Option<Vec<RawLevel>>> {
    if rates.len() > ratelimit_common::MAX_KEY_LEVELS {
        return Err(Error::invalid(
            "--rate",
            format!(
                "{} given; a rule has at most {} key levels, e.g. --per 32 --rate 100/s --per 24 --rate 1000/s --per 16 --rate 10k/s",
                rates.len(),
                ratelimit_common::MAX_KEY_LEVELS
            ),
        ));
    }
    if rates.len() <= 1 {
        for (flag, n) in [("--per", args.per.len()), ("--burst", args.burst.len())] {
            if n > 1 {
                return Err(Error::invalid(
                    flag,
                    format!("given {n} times for one --rate; several levels need a --rate each"),
                ));
            }
        }
        return Ok(None);
    }
    if args.target == "default" {
        return Err(Error::invalid(
            "--rate",
            "the default rule's key levels are set in the config file (`levels` under [default], with per-v4 and per-v6)",
        ));
    }
    if args.per.len() != rates.len() {
        return Err(Error::invalid(
            "--per",
            format!(
                "{} given for {} --rate: with several levels give each its own --per, in the same order (--per 32 --rate 100/s --per 24 --rate 1000/s)",
                args.per.len(),
                rates.len()
            ),
        ));
    }
    if !args.burst.is_empty() && args.burst.len() != rates.len() {
        return Err(Error::invalid(
            "--burst",
            format!(
                "{} given for {} --rate: give one per --rate, in the same order, or none for one second's worth each",
                args.burst.len(),
                rates.len()
            ),
        ));
    }
    Ok(Some(
        rates
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, rate)| RawLevel {
                rate: rate.clone(),
                burst: args.burst.get(i).cloned().map(RawBurst::Text),
                per: Some(args.per[i]),
                per_v4: None,
                per_v6: None,
            })
            .collect(),
    ))
}

/// `allow` or `deny`: one CIDR (`make`), or a list of `action` (`--from`).
async fn listable_command(
    a: ListableArgs,
    action: ListAction,
    make: impl FnOnce(String, Option<u64>) -> Request,
) -> Result<()> {
    let for_ms = a.change.for_ms()?;
    let Some(from) = &a.from else {
        let Some(cidr) = &a.cidr else {
            return Err(Error::invalid("CIDR", "give a CIDR, or --from FILE"));
        };
        let iface = iface(&a.target)?;
        let data = protocol::call(&iface, &make(a.matches.selector(cidr), for_ms)).await?;
        print_changes(&data, a.change.quiet);
        return Ok(());
    };
    if a.matches.any() {
        return Err(Error::invalid(
            "--from",
            "list entries match the source alone: leave out --proto, --dport, --syn, --icmp-type and --to (or give such rules with `ratelimit set`)",
        ));
    }
    // A regular file (or standard input), at most LIST_MAX_BYTES.
    let (source, text) = if from == "-" {
        let text = input::read_stdin(input::Kind::List).map_err(|e| Error::invalid("--from", e))?;
        ("stdin".to_string(), text)
    } else {
        let text = input::read(std::path::Path::new(from), input::Kind::List, from)
            .map_err(|e| Error::invalid("--from", e))?;
        (from.clone(), text)
    };
    let name = match (&a.name, from.as_str()) {
        (Some(n), _) => n.clone(),
        (None, "-") => {
            return Err(Error::invalid(
                "--name",
                "a list read from standard input (--from -) needs a name: add --name NAME",
            ));
        }
        (None, path) => lists::default_name(path).unwrap_or_default(),
    };
    lists::check_name("--name", &name)?;
    // Checked here too, so a bad file is reported before the daemon is asked
    // (the daemon checks it again: it is the one writer).
    lists::parse("--from", &source, &text)?;
    let iface = iface(&a.target)?;
    let data = protocol::call(
        &iface,
        &Request::LoadList {
            name,
            action,
            source,
            text,
            for_ms,
        },
    )
    .await?;
    if !a.change.quiet
        && let Some(loaded) = data.get("loaded")
    {
        println!("{}", loaded["summary"].as_str().unwrap_or("loaded"));
    }
    Ok(())
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("serializes"));
}

/// ` (ends in 9m58s)` for something temporary, else nothing.
fn ends(v: &Value) -> String {
    match v["expires_in_s"].as_f64() {
        // Read from the pins with no daemon to end it.
        Some(s) if s <= 0.0 => {
            "  (its time is up: enforced until a daemon adopts the program and ends it)".into()
        }
        Some(s) => format!(
            "  (ends in {})",
            crate::model::describe::span((s * 1000.0) as u64)
        ),
        None => String::new(),
    }
}

/// What a change command changed, one line each (nothing with `quiet`).
fn print_changes(data: &Value, quiet: bool) {
    if quiet {
        return;
    }
    let changes: Vec<&Value> = data["changes"].as_array().into_iter().flatten().collect();
    if changes.is_empty() {
        println!("no change (`ratelimit list` shows the rules)");
        return;
    }
    let width = changes
        .iter()
        .filter_map(|c| c["cidr"].as_str().or(c["list"].as_str()))
        .map(str::len)
        .max()
        .unwrap_or(0);
    for c in changes {
        if let Some(m) = c.get("mode") {
            println!(
                "mode    {} → {}",
                m["before"].as_str().unwrap_or("?"),
                m["after"].as_str().unwrap_or("?")
            );
            continue;
        }
        let (name, text): (String, fn(&Value) -> String) = match c["list"].as_str() {
            Some(list) => (format!("list {list}"), |v| {
                format!(
                    "{} list, {} entries from {}{}",
                    v["action"].as_str().unwrap_or("?"),
                    v["entries"].as_u64().unwrap_or(0),
                    v["source"].as_str().unwrap_or("?"),
                    ends(v)
                )
            }),
            None => (c["cidr"].as_str().unwrap_or("?").to_string(), |v| {
                format!("{}{}", v["text"].as_str().unwrap_or("?"), ends(v))
            }),
        };
        let width = width + 5;
        match (&c["before"], &c["after"]) {
            (Value::Null, after) => println!("added   {name:<width$} {}", text(after)),
            (before, Value::Null) => println!("removed {name:<width$} {}", text(before)),
            (before, after) => {
                println!("changed {name:<width$} {}", text(after));
                println!("        {:<width$} (was {})", "", text(before));
            }
        }
    }
}

fn print_list(data: &Value) {
    let rules: Vec<&Value> = data["rules"].as_array().into_iter().flatten().collect();
    let width = rules
        .iter()
        .map(|r| r["cidr"].as_str().unwrap_or("?").len())
        .max()
        .unwrap_or(0)
        .max(18);
    println!(
        "{:<width$} {}",
        "default",
        data["default"]["text"].as_str().unwrap_or("?")
    );
    for r in &rules {
        println!(
            "{:<width$} {}{}",
            r["cidr"].as_str().unwrap_or("?"),
            r["text"].as_str().unwrap_or("?"),
            ends(r)
        );
    }
    if rules
        .iter()
        .any(|r| r["match"].as_str().is_some_and(|m| !m.is_empty()))
    {
        println!(
            "(a source's rule: its longest CIDR with a rule that matches the frame; one CIDR's rules are tried top to bottom)"
        );
        let fragments = match data["fragments"].as_str() {
            Some("drop") => "dropped",
            _ => "judged by the next rule",
        };
        println!("(non-first fragments, which show no ports or flags: {fragments})");
    }
    let lists: Vec<&Value> = data["lists"].as_array().into_iter().flatten().collect();
    if !lists.is_empty() {
        println!();
        let width = lists
            .iter()
            .map(|l| l["name"].as_str().unwrap_or("?").len())
            .max()
            .unwrap_or(0)
            .max(20);
        println!(
            "{:<width$} {:<6} {:>9} {:>9}  source",
            "list", "action", "entries", "shadowed"
        );
        for l in &lists {
            println!(
                "{:<width$} {:<6} {:>9} {:>9}  {}{}{}",
                l["name"].as_str().unwrap_or("?"),
                l["action"].as_str().unwrap_or("?"),
                l["entries"].as_u64().unwrap_or(0),
                l["shadowed"].as_u64().unwrap_or(0),
                l["source"].as_str().unwrap_or("?"),
                if l["origin"] == "config" {
                    " (config)"
                } else {
                    ""
                },
                ends(l)
            );
        }
        if lists
            .iter()
            .any(|l| l["shadowed"].as_u64().unwrap_or(0) > 0)
        {
            println!(
                "(shadowed: entries with exactly the CIDR of a rule, which wins, and deny entries equal to or inside an allow list entry, which wins)"
            );
        }
    }
    if data["dry_run"].as_bool() == Some(true) {
        println!("(dry run: nothing is dropped)");
    }
    if data["mode"].as_str() == Some("allowlist-only") {
        println!(
            "(mode allowlist-only: only the allow rules pass, every other frame is dropped; `ratelimit mode normal` ends it)"
        );
    }
    if let Some(clock) = data["clock"].as_str()
        && clock.starts_with("coarse")
    {
        println!("(clock {clock})");
    }
    match data["unjudged"].as_str() {
        Some("next-rule") => println!(
            "(unjudged next-rule: IP the program cannot judge, like a SYN in tiny fragments, is judged by the rules that need nothing it hides; the default, drop, is safe against fragmenting attackers)"
        ),
        Some("pass") => println!(
            "(unjudged pass: IP the program cannot judge, like a SYN in tiny fragments, passes; the default, drop, is safe against fragmenting attackers)"
        ),
        _ => {}
    }
}

/// Each rule's counters (packets), the default rule's first.
fn print_rule_counters(data: &Value) {
    let rows: Vec<&Value> = std::iter::once(&data["default"])
        .chain(data["rules"].as_array().into_iter().flatten())
        .collect();
    let width = rows
        .iter()
        .map(|r| r["cidr"].as_str().unwrap_or("default").len())
        .max()
        .unwrap_or(0)
        .max(18);
    println!();
    println!(
        "{:<width$} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "packets",
        "passed",
        "dropped",
        "level 2",
        "level 3",
        "aggregate",
        "young",
        "new src",
        "would drop"
    );
    for r in rows {
        let c = |k: &str| r["counters"][k]["packets"].as_u64().unwrap_or(0);
        println!(
            "{:<width$} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
            r["cidr"].as_str().unwrap_or("default"),
            c("passed"),
            c("dropped"),
            c("level2_dropped"),
            c("level3_dropped"),
            c("aggregate_dropped"),
            c("aggregate_young_dropped"),
            c("new_source_dropped"),
            c("would_drop"),
        );
    }
    println!(
        "(dropped: at the rule's own key level, or by a deny; a source without state dropped by the budget for new sources counts under new src; aggregate: the aggregate was empty, whatever the source; young: a new or young source refused at the aggregate's reserve)"
    );
}

fn print_stats(data: &Value) {
    println!(
        "{:<18} {:>12} {:>18} {:>14} {:>16}",
        "reason", "packets", "bytes", "packets/s", "bytes/s"
    );
    for r in data["reasons"].as_array().into_iter().flatten() {
        println!(
            "{:<18} {:>12} {:>18} {:>14.0} {:>16.0}",
            r["reason"].as_str().unwrap_or("?"),
            r["packets"].as_u64().unwrap_or(0),
            r["bytes"].as_u64().unwrap_or(0),
            r["packets_per_s"].as_f64().unwrap_or(0.0),
            r["bytes_per_s"].as_f64().unwrap_or(0.0),
        );
    }
    if let Some(events) = data["events"].as_object() {
        println!();
        println!("{:<18} {:>12}", "event", "count");
        for (name, n) in events {
            println!("{:<18} {:>12}", name, n.as_u64().unwrap_or(0));
        }
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default action (exit) applies.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
