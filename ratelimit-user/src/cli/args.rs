//! The command line as clap parses it: one struct per command, strings as
//! typed. `cli::lower` turns them into validated options and requests;
//! [`super::docs`] makes the man pages and completions from them; `main`
//! parses [`Cli`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
pub use ratelimit_host::serve_args::ServeArgs;

use super::help;
use crate::kernel::AttachMode;
use crate::model::rules::Clock;

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
    /// A clean slate: remove every rule and list (or only the live ones, or
    /// only the config file's), leaving the default rule; says what it
    /// removed.
    #[command(after_help = help::RESET)]
    Reset(ResetArgs),
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
    /// Show dropped frames the program logged (sampled: at most --drop-log
    /// records a second per CPU): source, rule, reason, protocol, port.
    #[command(after_help = help::LOG)]
    Log(LogArgs),
    /// Say which rule judges a frame from SOURCE (with the match fields
    /// given), which rules it beat and why, and the source's state under it.
    #[command(after_help = help::EXPLAIN)]
    Explain(ExplainArgs),
    /// Show SOURCE's state under every limit rule that may judge it: tracked
    /// or not, what is left, when a frame is admitted again.
    #[command(after_help = help::GET)]
    Get(GetArgs),
    /// Serve the throttling service (HTTP and JSON, and Envoy's rate limit
    /// service API over gRPC) for other programs, on Redis.
    #[command(after_help = ratelimit_host::serve_args::EXAMPLES)]
    Serve(ServeArgs),
    /// Check a config file as `run` and `reload` would read it, without
    /// touching anything running: every error with its line; exit status 2
    /// if there is any.
    #[command(after_help = help::CHECK)]
    Check(CheckArgs),
    /// Remove the pins of network namespaces that are gone (a daemon killed,
    /// or run with --keep-attached, in a namespace deleted since): they
    /// enforce nothing and hold kernel memory. Daemons do it as they start.
    #[command(after_help = help::GC)]
    Gc(GcArgs),
    /// Stop a program left enforcing without a daemon (run with
    /// --keep-attached, or a daemon killed): detach it and remove its pins.
    /// With a daemon running, stop the daemon instead.
    #[command(after_help = help::DETACH)]
    Detach(DetachArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = help::COMPLETIONS)]
    Completions(CompletionsArgs),
    /// Print the man page ratelimit(8), or the one named, or write every page
    /// into a directory.
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

/// `ratelimit explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The source address.
    pub source: String,
    /// The transport protocol: tcp, udp, icmp, icmpv6 or a number.
    #[arg(long)]
    pub proto: Option<String>,
    /// The destination port (TCP, UDP).
    #[arg(long)]
    pub dport: Option<u16>,
    /// A TCP SYN without ACK (a new connection).
    #[arg(long)]
    pub syn: bool,
    /// The ICMP or ICMPv6 type.
    #[arg(long)]
    pub icmp_type: Option<u8>,
    /// The destination address.
    #[arg(long)]
    pub to: Option<String>,
    /// How the reading is printed (`--json`, …).
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `ratelimit get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The source address.
    pub source: String,
    /// How the reading is printed (`--json`, …).
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `ratelimit detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// `--quiet`.
    #[command(flatten)]
    pub quiet: QuietArgs,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Print JSON: {"removed": [{"dir", "layout", "bytes"}]}.
    #[arg(long)]
    pub json: bool,
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
    /// The page to print instead of ratelimit(8): ratelimit-COMMAND (section
    /// 8), or a file format's, ratelimit.toml or ratelimit-serve.toml
    /// (section 5).
    #[arg(value_name = "PAGE", conflicts_with = "out")]
    pub page: Option<String>,
    /// Write ratelimit.8, one ratelimit-COMMAND.8 per command,
    /// ratelimit.toml.5 and ratelimit-serve.toml.5 into DIR (created if
    /// missing) instead of printing ratelimit.8.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl Cli {
    /// The runtime the command runs on: one worker per CPU (`serve` runs
    /// none here: `main` hands it to the service's binary first).
    pub fn runtime(&self) -> crate::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(crate::error::Error::io("starting the async runtime"))
    }

    /// Whether the command asked for JSON output (`--json`): a failure is then
    /// reported as JSON on stdout too.
    pub fn json(&self) -> bool {
        match &self.command {
            Command::List(l) => l.read.json,
            Command::Status(r) => r.json,
            Command::Check(c) => c.json,
            Command::Gc(g) => g.json,
            Command::Explain(e) => e.read.json,
            Command::Get(g) => g.read.json,
            Command::Stats(s) => s.read.json,
            Command::Top(t) => t.read.json,
            Command::Log(l) => l.json,
            Command::Run(_)
            | Command::Set(_)
            | Command::Allow(_)
            | Command::Deny(_)
            | Command::Unset(_)
            | Command::Mode(_)
            | Command::Reset(_)
            | Command::Detach(_)
            | Command::Reload(_)
            | Command::Serve(_)
            | Command::Completions(_)
            | Command::Man(_) => false,
        }
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
    // The help text shows brackets as written; they are not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Serve Prometheus metrics over HTTP on this address: HOST:PORT like
    /// 127.0.0.1:9477, [::1]:9477, localhost:9477, or :9477 (every IPv4
    /// address).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// IPv4 sources tracked at once (a load-time setting): the state table
    /// has two slots for each, rounded up to a power of two of 64-byte lines
    /// (48 bytes a source with the birth stamps). A new source that finds
    /// both of its lines full of active sources gets no state (`state_full`).
    #[arg(long, default_value_t = ratelimit_common::DEFAULT_STATE_CAPACITY)]
    pub max_sources: u32,
    /// IPv6 sources (per key prefix, /64 by default) tracked at once (a
    /// load-time setting): lines of their own in the state table, sized as
    /// for `--max-sources` (48 bytes a source).
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
    /// The drop log (`ratelimit log`): dropped frames the program writes for
    /// the daemon, at most RATE records a second per CPU (e.g. 100/s, 1k/s),
    /// the rest counted; `off` (or 0) writes none [default: 100/s].
    #[arg(long, value_name = "RATE")]
    pub drop_log: Option<String>,
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
    /// Start without --fleet even though the rules have fleet-wide limits
    /// (saved live changes, or the config file): those rules are removed (a
    /// config file's until `reload --replace`), and a fleet-wide default
    /// rule becomes a limit of this host alone; the start says which.
    #[arg(long, conflicts_with = "fleet")]
    pub drop_fleet_rules: bool,
    /// Enforce a CrowdSec Local API's decisions.
    #[command(flatten)]
    pub crowdsec: super::crowdsec::Args,
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
    /// What the rule matches besides its source.
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
    /// How the change is made and told.
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
    /// The daemon it goes to (`--iface`).
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
    /// `--quiet`.
    #[command(flatten)]
    pub quiet: QuietArgs,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// Only the live changes (set with the CLI, temporary ones too): the
    /// config file's rules and lists are enforced again.
    #[arg(long, conflicts_with = "config")]
    pub live: bool,
    /// Only the config file's rules and lists (until `reload --replace`);
    /// the live changes stay.
    #[arg(long)]
    pub config: bool,
    /// `--quiet`.
    #[command(flatten)]
    pub quiet: QuietArgs,
    /// The daemon it goes to (`--iface`).
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
    /// Only frames to this destination port, range or set, e.g. 53,
    /// 27015-27020 or 22,80,443,8000-8100 (at most 16 ranges; with --proto
    /// tcp or udp).
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

/// A CIDR command.
#[derive(Debug, Args)]
pub struct CidrArgs {
    /// A CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    pub cidr: String,
    /// What the rule matches besides its source.
    #[command(flatten)]
    pub matches: MatchArgs,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit allow` and `ratelimit deny`: a CIDR, or a list from a file.
#[derive(Debug, Args)]
pub struct ListableArgs {
    /// A CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    #[arg(required_unless_present = "from", conflicts_with = "from")]
    pub cidr: Option<String>,
    /// What the rule matches besides its source.
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
    /// How the change is made and told.
    #[command(flatten)]
    pub change: ChangeArgs,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit unset`.
#[derive(Debug, Args)]
pub struct UnsetArgs {
    /// A CIDR such as 198.18.0.0/15 or 2001:db8::/32.
    #[arg(required_unless_present = "list", conflicts_with = "list")]
    pub cidr: Option<String>,
    /// What the rule matches besides its source.
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
    /// `--quiet`.
    #[command(flatten)]
    pub quiet: QuietArgs,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
}

/// `ratelimit reload`.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// Drop the live changes (set, allow, deny, unset): the config file alone.
    #[arg(long)]
    pub replace: bool,
    /// `--quiet`.
    #[command(flatten)]
    pub quiet: QuietArgs,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
}

/// A read command.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The daemon it goes to (`--iface`).
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
    /// How the reading is printed (`--json`, …).
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `ratelimit stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Refresh every second until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// How the reading is printed (`--json`, …).
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `ratelimit log`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// The last N entries (the daemon keeps the last 4096).
    #[arg(short, default_value_t = 20)]
    pub n: usize,
    /// Then print new entries as they come (every 250 ms), until
    /// interrupted, the daemon stops, or the output is closed.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// One JSON object per entry, a line each.
    #[arg(long)]
    pub json: bool,
    /// The daemon it goes to (`--iface`).
    #[command(flatten)]
    pub target: Target,
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
    /// How the reading is printed (`--json`, …).
    #[command(flatten)]
    pub read: ReadArgs,
}

impl Command {
    /// The `--iface` a change was given; `None` for what is not a change.
    pub(super) fn change_target(&self) -> Option<Option<&str>> {
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
