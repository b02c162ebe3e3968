//! `ratelimit.toml(5)`: the config file of `ratelimit run --config FILE`,
//! read by [`crate::config`]. Every key the parser reads is here, and
//! nothing else (the tests of [`super::file_page`] check both).

use super::file_page::{Example, Key, Page, Table};

/// The page.
pub(super) const PAGE: Page = Page {
    name: "ratelimit.toml",
    summary: "the rules of ratelimit run, in TOML",
    synopsis: &[
        "ratelimit run --iface IFACE --config FILE",
        "ratelimit check --config FILE",
        "/etc/ratelimit/IFACE.toml",
    ],
    description: &[
        "The config file of ratelimit(8): the default rule, the rules by source prefix, the blocklists and allowlists read from files, and the settings that apply to all of them. ratelimit run --config FILE enforces it on an interface; a reload (SIGHUP, systemctl reload ratelimit@IFACE, ratelimit reload) reads it again; ratelimit check --config FILE checks it as they would, touching nothing running. The systemd unit ratelimit@IFACE.service reads /etc/ratelimit/IFACE.toml.",
        "Keys are written in kebab-case, and every one is optional but those said required. A key the reader does not know, or a value of the wrong type or form, is an error: the file is refused whole, every error said as FILE:LINE: KEY: MESSAGE (rule[1] is the file's second [[rule]], counted from 0), and a daemon that was running goes on enforcing what it did.",
        "The file is the base: live changes (ratelimit set, allow, deny, unset, lists loaded with --from) sit on top of it and outlast reloads, until ratelimit reload --replace drops them. A setting given both in the file and as an option of run (dry-run and --dry-run, [default] rate and --rate) is refused, naming both.",
        "A frame is judged by the longest source prefix that has a rule matching it or a list entry, a rule winning over a list entry of exactly its prefix; among one prefix's rules, the most specific match first and the rule without a match last; and by [default] when nothing else takes it. ratelimit list shows the order, ratelimit explain SOURCE which rule judges a frame.",
    ],
    tables: &[
        Table {
            of: &[""],
            heading: "TOP-LEVEL KEYS",
            text: &["Settings of the whole rule set, and the tables of the file."],
            keys: &[
                Key {
                    name: "dry-run",
                    forms: "boolean",
                    default: "false",
                    text: "Drop nothing: what a rule would drop is passed and counted as would_drop (ratelimit stats). The run option --dry-run sets it too.",
                    example: "dry-run = true",
                    ..Key::EMPTY
                },
                Key {
                    name: "malformed",
                    forms: "\"pass\" or \"drop\"",
                    default: "\"pass\"",
                    text: "Truncated or malformed IP frames: passed on to the kernel, whose own checks see them next, or dropped. The run option --drop-malformed sets \"drop\".",
                    example: "malformed = \"drop\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "mode",
                    forms: "\"normal\" or \"allowlist-only\"",
                    default: "\"normal\"",
                    text: "In allowlist-only mode only the sources under an allow rule or an allow list entry pass, and every other frame is dropped (counted not_allowed): for the worst minutes of an attack. ratelimit mode switches it live.",
                    example: "mode = \"allowlist-only\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "unjudged",
                    forms: "\"drop\", \"next-rule\" or \"pass\"",
                    default: "\"drop\"",
                    text: "IP frames the program cannot judge: more than 8 VLAN tags or IPv6 extension headers, a first fragment too short for its transport header, a transport header cut short. \"drop\" is the safe default; \"next-rule\" judges them by the source's rules that need nothing they hide; \"pass\" passes them (in allowlist-only mode, as \"next-rule\").",
                    example: "unjudged = \"next-rule\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "fragments",
                    forms: "\"next-rule\" or \"drop\"",
                    default: "\"next-rule\"",
                    text: "Non-first fragments (they carry no ports and no TCP flags) under a rule whose match needs them: judged by the source's next rule that needs neither (their first fragment was judged whole), or dropped (counted denied), the fragments of datagrams the rules admit too.",
                    example: "fragments = \"drop\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "clock",
                    forms: "\"precise\" or \"coarse\"",
                    default: "\"precise\"",
                    text: "The clock decisions are made on: bpf_ktime_get_ns, exact to the nanosecond, or the cheaper time of the last scheduler tick, under which a key is admitted at most burst + rate times (T + one tick) over any span T.",
                    example: "clock = \"coarse\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "new-states",
                    forms: "RATE, of states",
                    default: "\"100k/s\"",
                    text: "The cap on the states (a source's bucket) created per second, all rules together: what sources that each send a few frames (a botnet) may cost. A source the cap refuses stays judged as a new source (new-sources).",
                    example: "new-states = \"50k/s\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "drop-log",
                    forms: "RATE, of records, or \"off\"",
                    default: "\"100/s\"",
                    text: "The drop log (ratelimit log): at most this many records of dropped frames a second per CPU, from 1/s to 100k/s; \"off\" (or \"0\") logs none.",
                    example: "drop-log = \"1k/s\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "default",
                    forms: "a table, [default], of LIMIT KEYS",
                    default: "a limit of 1000/s, burst 1000, per /32 (IPv4) and /64 (IPv6)",
                    text: "The default rule: what judges the frames of the sources no rule or list takes. Given, it replaces the built-in one whole: a limit needs its rate.",
                    example: "[default]\nrate = \"500/s\"\nburst = 1000",
                    ..Key::EMPTY
                },
                Key {
                    name: "rule",
                    forms: "an array of tables, [[rule]], of RULES keys and LIMIT KEYS",
                    default: "none",
                    text: "The rules, by source prefix and match.",
                    example: "[[rule]]\ncidr = \"198.18.0.0/24\"\nrate = \"100/s\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "list",
                    forms: "an array of tables, [[list]], of LISTS keys",
                    default: "none",
                    text: "Blocklists and allowlists, read from files.",
                    example: "[[list]]\nname = \"blocklist\"\naction = \"deny\"\npath = \"blocklist.txt\"",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["[[rule]]"],
            heading: "RULES: [[rule]]",
            text: &[
                "Each [[rule]] is a rule: a source prefix (cidr), an optional match (to, proto, dport, syn, icmp-type), and what it does (the LIMIT KEYS). Several rules may share a cidr when their matches differ; each has its own buckets. Among one cidr's rules a destination is tried first (the longer first), then ports (fewer first), then syn or an ICMP type, then the protocol alone, and the rule without a match last; a cidr whose rules all have matches hands the frames none of them takes to the prefix around it. At most 8 rules may apply in turn to one source.",
            ],
            keys: &[
                Key {
                    name: "cidr",
                    forms: "PREFIX",
                    default: "required",
                    text: "The source prefix the rule covers. One rule a cidr and match.",
                    example: "cidr = \"2001:db8::/32\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "to",
                    forms: "PREFIX, of cidr's family",
                    default: "any destination",
                    text: "The destination prefix, for a host that serves several addresses.",
                    example: "to = \"198.18.1.2\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "proto",
                    forms: "\"tcp\", \"udp\", \"icmp\", \"icmpv6\" or a protocol number",
                    default: "any protocol",
                    text: "The IP protocol; icmp is IPv4's, icmpv6 IPv6's.",
                    example: "proto = \"udp\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "dport",
                    forms: "a port (53), or a string of a range (\"27015-27020\") or a set (\"22,80,443,8000-8100\")",
                    default: "any port",
                    text: "The destination port. Needs proto \"tcp\" or \"udp\".",
                    example: "proto = \"udp\"\ndport = \"27015-27020\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "syn",
                    forms: "boolean",
                    default: "false",
                    text: "Only TCP frames with SYN and without ACK: a connection's first frame. Needs proto \"tcp\".",
                    example: "proto = \"tcp\"\nsyn = true",
                    ..Key::EMPTY
                },
                Key {
                    name: "icmp-type",
                    forms: "an integer, 0 to 255",
                    default: "any type",
                    text: "The ICMP or ICMPv6 type (8: IPv4's echo request). Needs proto \"icmp\" or \"icmpv6\".",
                    example: "proto = \"icmp\"\nicmp-type = 8",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["[default]", "[[rule]]"],
            heading: "LIMIT KEYS: [default] AND [[rule]]",
            text: &[
                "What a rule does, in [default] and in each [[rule]]. A limit (the default action) keeps a bucket per key, the source address cut to per-v4 or per-v6 bits, and drops what the bucket refuses. Its algorithm takes its own parameters and no others: gcra takes rate and burst; token-bucket-interval takes refill-every, refill-amount and capacity; fixed-window, sliding-log and sliding-window take limit and window; rolling-quota takes quota, window, period and rate-cap. An allow or a deny rule takes no limit key but dry-run (a deny rule only).",
            ],
            keys: &[
                Key {
                    name: "action",
                    forms: "\"limit\", \"allow\" or \"deny\"",
                    default: "\"limit\"",
                    text: "limit: what exceeds the rule's limit is dropped; allow: never limited (counted allowed); deny: always dropped (counted denied).",
                    example: "action = \"deny\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "rate",
                    forms: "RATE",
                    default: "required by a gcra limit",
                    text: "The bucket's refill, per key: packets (\"500/s\") or bytes (\"100Mbit/s\") per period. \"0/s\" drops everything from each key of a rule (refused in [default]: use action = \"deny\").",
                    example: "rate = \"500/s\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "burst",
                    forms: "COUNT, or for a byte rate a SIZE",
                    default: "one second's worth of the rate (at least 64 KiB for a byte rate)",
                    text: "The bucket's size: what a key may send at once after a rest. 1 to 4294967296 (2^32), and at most 1.6 days of the rate (a burst of 39 at most for 1/hour: for longer windows use rolling-quota).",
                    example: "rate = \"1000/s\"\nburst = 2000",
                    ..Key::EMPTY
                },
                Key {
                    name: "per",
                    forms: "a prefix length of the rule's family",
                    default: "per-v4's or per-v6's",
                    text: "The key's prefix length in the family of the rule's cidr: 32 a bucket per IPv4 address, 24 one per /24.",
                    example: "rate = \"100/s\"\nper = 24",
                    refused_in: Some("[default]"),
                },
                Key {
                    name: "per-v4",
                    forms: "an integer, 0 to 32",
                    default: "32",
                    text: "The key's prefix length for IPv4 sources: 32 a bucket per address, 0 one bucket for all.",
                    example: "rate = \"100/s\"\nper-v4 = 24",
                    ..Key::EMPTY
                },
                Key {
                    name: "per-v6",
                    forms: "an integer, 0 to 128",
                    default: "64 (one host owns a /64)",
                    text: "The key's prefix length for IPv6 sources.",
                    example: "rate = \"100/s\"\nper-v6 = 56",
                    ..Key::EMPTY
                },
                Key {
                    name: "dry-run",
                    forms: "boolean",
                    default: "false",
                    text: "Drop nothing by this rule: what it would drop is passed and counted as would_drop. A deny rule takes it too.",
                    example: "rate = \"100/s\"\ndry-run = true",
                    ..Key::EMPTY
                },
                Key {
                    name: "algorithm",
                    forms: "\"gcra\", \"token-bucket-interval\", \"fixed-window\", \"sliding-log\", \"sliding-window\" or \"rolling-quota\"",
                    default: "\"gcra\"",
                    text: "How a key's frames are counted. gcra is a token bucket refilled continuously, the only one that counts bytes, takes levels or is fleet-wide; token-bucket-interval is refilled in steps; fixed-window counts per aligned window (up to twice limit across a boundary), sliding-log holds exactly in every window (limit at most 64), sliding-window weighs the window before; rolling-quota holds a quota over a rolling window with a cap per period.",
                    example: "algorithm = \"sliding-window\"\nlimit = 100\nwindow = \"1min\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "limit",
                    forms: "COUNT",
                    default: "required by fixed-window, sliding-log and sliding-window",
                    text: "Frames a key may send per window.",
                    example: "algorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1min\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "window",
                    forms: "DURATION",
                    default: "required by fixed-window, sliding-log, sliding-window and rolling-quota",
                    text: "The window of the window algorithms; rolling-quota's rolling window.",
                    example: "algorithm = \"sliding-log\"\nlimit = 5\nwindow = \"1min\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "refill-every",
                    forms: "DURATION",
                    default: "required by token-bucket-interval",
                    text: "How often the bucket is refilled, counted from a key's first admitted frame.",
                    example: "algorithm = \"token-bucket-interval\"\nrefill-every = \"1min\"\nrefill-amount = 60\ncapacity = 60",
                    ..Key::EMPTY
                },
                Key {
                    name: "refill-amount",
                    forms: "COUNT",
                    default: "required by token-bucket-interval",
                    text: "The tokens each refill adds.",
                    example: "algorithm = \"token-bucket-interval\"\nrefill-every = \"1s\"\nrefill-amount = 10\ncapacity = 50",
                    ..Key::EMPTY
                },
                Key {
                    name: "capacity",
                    forms: "COUNT",
                    default: "required by token-bucket-interval",
                    text: "The bucket's size: a key starts with it, and never holds more.",
                    example: "algorithm = \"token-bucket-interval\"\nrefill-every = \"1h\"\nrefill-amount = 100\ncapacity = 200",
                    ..Key::EMPTY
                },
                Key {
                    name: "quota",
                    forms: "COUNT",
                    default: "required by rolling-quota",
                    text: "Frames a key may send in any rolling window.",
                    example: "algorithm = \"rolling-quota\"\nquota = 10000\nwindow = \"24h\"\nperiod = \"1h\"\nrate-cap = 1000",
                    ..Key::EMPTY
                },
                Key {
                    name: "period",
                    forms: "DURATION",
                    default: "required by rolling-quota",
                    text: "The step the rolling window moves by, and what rate-cap counts per; at most 64 periods a window.",
                    example: "algorithm = \"rolling-quota\"\nquota = 500\nwindow = \"1h\"\nperiod = \"5min\"\nrate-cap = 100",
                    ..Key::EMPTY
                },
                Key {
                    name: "rate-cap",
                    forms: "COUNT",
                    default: "required by rolling-quota",
                    text: "Frames a key may send per period.",
                    example: "algorithm = \"rolling-quota\"\nquota = 1000\nwindow = \"1d\"\nperiod = \"1h\"\nrate-cap = 100",
                    ..Key::EMPTY
                },
                Key {
                    name: "new-sources",
                    forms: "RATE, or \"unlimited\"",
                    default: "\"10k/s\", burst 10000",
                    text: "The rule's budget for the frames of sources that have no state yet (a source gets one when it is seen again within 2 to 4 s), all of them together: what a spoofed flood can take. \"0/s\" greylists (a new source's first frame is dropped, its retry passes); \"unlimited\" sets no budget. The run option --new-sources sets the default rule's.",
                    example: "rate = \"100/s\"\nnew-sources = \"2k/s\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "new-sources-burst",
                    forms: "COUNT",
                    default: "one second's worth of new-sources",
                    text: "The new-source budget's burst. Needs new-sources, not \"unlimited\".",
                    example: "rate = \"100/s\"\nnew-sources = \"5k/s\"\nnew-sources-burst = 10000",
                    ..Key::EMPTY
                },
                Key {
                    name: "aggregate",
                    forms: "RATE",
                    default: "none",
                    text: "A bucket for all the rule's sources together, against the flood spread over many sources that each stay under their own limit: a frame passes only if its own bucket and the aggregate both admit it.",
                    example: "rate = \"100/s\"\naggregate = \"100k/s\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "aggregate-burst",
                    forms: "COUNT, or for a byte rate a SIZE",
                    default: "one second's worth of aggregate",
                    text: "The aggregate's burst. Needs aggregate.",
                    example: "rate = \"100/s\"\naggregate = \"100k/s\"\naggregate-burst = 200000",
                    ..Key::EMPTY
                },
                Key {
                    name: "aggregate-reserve",
                    forms: "COUNT below the aggregate's burst, or a share of it below 100% (\"25%\")",
                    default: "\"50%\"",
                    text: "The part of the aggregate's burst only the sources established before a flood may take: while the aggregate is under pressure, new and young sources are admitted only if the reserve stays whole. 0 makes one bucket shared alike. Needs aggregate.",
                    example: "rate = \"100/s\"\naggregate = \"100k/s\"\naggregate-reserve = \"25%\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "fleet",
                    forms: "boolean",
                    default: "false",
                    text: "The limit holds across the fleet: every daemon run with --fleet REDIS_URL shares each key's bucket through Redis. gcra only (its aggregate and levels stay per host); a daemon refuses to start without --fleet while its rules have such a limit.",
                    example: "rate = \"100/s\"\nfleet = true",
                    ..Key::EMPTY
                },
                Key {
                    name: "host-connections",
                    forms: "\"pass\" or \"limit\"",
                    default: "\"pass\"",
                    text: "The frames of the host's own connections (replies to its downloads, DNS queries and API calls: an established TCP connection or a connected UDP socket on a local port of the ephemeral range) use their source's tokens but are never dropped by this limit; \"limit\" limits them like any frame.",
                    example: "rate = \"100/s\"\nhost-connections = \"limit\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "levels",
                    forms: "an array of one or two inline tables of KEY LEVELS keys",
                    default: "none",
                    text: "Key levels beyond the rule's own: a bucket per key of another prefix each, so that a network whose hosts each stay under their own limit is limited as a whole. A frame passes only if every level admits it. gcra only.",
                    example: "rate = \"100/s\"\nlevels = [{ rate = \"1000/s\", per-v4 = 24, per-v6 = 48 }]",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["levels"],
            heading: "KEY LEVELS: levels",
            text: &[
                "levels = [{ rate = \"1000/s\", per = 24 }, { rate = \"5000/s\", per = 16 }] beside a gcra limit's own rate and per: up to two levels more (three keys in all), each a token bucket per key of its own prefix. The own level is decided first; a frame refused at one level consumes nothing at the others. A level's key gets its bucket when a frame its own level admits first reaches it. ratelimit stats counts the frames they refuse as level2_limited and level3_limited.",
            ],
            keys: &[
                Key {
                    name: "rate",
                    forms: "RATE, not 0",
                    default: "required",
                    text: "The level's refill, per key.",
                    example: "rate = \"100/s\"\nlevels = [{ rate = \"1000/s\", per-v4 = 24 }]",
                    ..Key::EMPTY
                },
                Key {
                    name: "burst",
                    forms: "COUNT, or for a byte rate a SIZE",
                    default: "one second's worth of the level's rate",
                    text: "The level's bucket size.",
                    example: "rate = \"100/s\"\nlevels = [{ rate = \"1000/s\", burst = 5000, per-v4 = 24 }]",
                    ..Key::EMPTY
                },
                Key {
                    name: "per",
                    forms: "a prefix length of the rule's family",
                    default: "the rule's own",
                    text: "The level's key prefix length in the family of the rule's cidr.",
                    example: "rate = \"100/s\"\nlevels = [{ rate = \"1000/s\", per = 24 }, { rate = \"5000/s\", per = 16 }]",
                    refused_in: Some("[default]"),
                },
                Key {
                    name: "per-v4",
                    forms: "an integer, 0 to 32",
                    default: "the rule's own per-v4",
                    text: "The level's key prefix length for IPv4 sources.",
                    example: "rate = \"100/s\"\nlevels = [{ rate = \"1000/s\", per-v4 = 24 }]",
                    ..Key::EMPTY
                },
                Key {
                    name: "per-v6",
                    forms: "an integer, 0 to 128",
                    default: "the rule's own per-v6",
                    text: "The level's key prefix length for IPv6 sources.",
                    example: "rate = \"100/s\"\nlevels = [{ rate = \"1000/s\", per-v6 = 48 }]",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["[[list]]"],
            heading: "LISTS: [[list]]",
            text: &[
                "Each [[list]] reads a blocklist or an allowlist from a file: one CIDR or address per line (# and ; begin comments), a FireHOL .netset, or ipset save output. The files are read again on every reload; a bad line refuses the whole config, named as LISTFILE:LINE. Between list entries and rules the longest prefix wins; a rule of exactly an entry's prefix wins over it; a deny entry within an allow entry is left out. A list takes one rule of --max-rules, its entries --max-list-entries.",
            ],
            keys: &[
                Key {
                    name: "name",
                    forms: "a string of letters, digits, ., _ and -",
                    default: "required",
                    text: "The list's name, as ratelimit list shows it; one list a name.",
                    example: "name = \"firehol_level1\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "action",
                    forms: "\"deny\" or \"allow\"",
                    default: "required",
                    text: "deny drops every source the list holds; allow passes them, never limited, and wins over the deny entries it covers.",
                    example: "action = \"allow\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "path",
                    forms: "a path",
                    default: "required",
                    text: "The file: a regular file of at most 256 MiB. A relative path is relative to the config file's directory.",
                    example: "path = \"firehol_level1.netset\"",
                    ..Key::EMPTY
                },
            ],
        },
    ],
    values: &[
        (
            "RATE",
            "A count per period: \"500/s\", \"30/min\", \"1/hour\", \"10k/s\", \"2.5M/s\", \"10/second\", \"100/10s\"; or bytes per period: \"100Mbit/s\", \"1Gbit/s\", \"10MB/s\", \"64KiB/s\".",
        ),
        (
            "COUNT",
            "A whole number: 100. Where a burst is meant, also a string with a suffix: \"10k\".",
        ),
        (
            "SIZE",
            "A string: a number of bytes with a unit, \"1500B\", \"64KB\", \"1MiB\".",
        ),
        (
            "DURATION",
            "A string: a number and a unit, \"500ms\", \"1s\", \"1.5s\", \"10m\", \"30min\", \"1h\", \"7d\", \"2w\", \"1y\" (365 days).",
        ),
        (
            "PREFIX",
            "A string: an IPv4 or IPv6 address with an optional /length, \"198.18.0.0/15\", \"198.18.0.1\", \"2001:db8::/32\" (an address alone is a /32 or a /128).",
        ),
    ],
    examples: &[
        Example {
            what: "A web server: 100 packets a second per address; new TCP connections 20 a second per address and 5000 a second in all; a partner's network never limited; a blocklist beside the file:",
            text: r#"[default]
rate = "100/s"
burst = 200

[[rule]]
cidr = "0.0.0.0/0"
proto = "tcp"
syn = true
rate = "20/s"
aggregate = "5k/s"

[[rule]]
cidr = "198.18.0.0/24"
action = "allow"

[[list]]
name = "blocklist"
action = "deny"
path = "blocklist.txt""#,
            is_file: true,
        },
        Example {
            what: "UDP to a game server's ports: 100 packets a second per address, 1000 per /24 and 5000 per /16 at once, 50000 in all, tried in dry run first:",
            text: r#"[[rule]]
cidr = "0.0.0.0/0"
proto = "udp"
dport = "27015-27020"
rate = "100/s"
per = 32
levels = [{ rate = "1000/s", per = 24 }, { rate = "5000/s", per = 16 }]
aggregate = "50k/s"
dry-run = true"#,
            is_file: true,
        },
        Example {
            what: "An API's IPv6 clients: 10000 packets a rolling day per /64, at most 1000 an hour:",
            text: r#"[[rule]]
cidr = "2001:db8:cafe::/48"
algorithm = "rolling-quota"
quota = 10000
window = "24h"
period = "1h"
rate-cap = 1000"#,
            is_file: true,
        },
        Example {
            what: "Check a file, then have the daemon of eth0 read it again:",
            text: "ratelimit check --config /etc/ratelimit/eth0.toml\nsystemctl reload ratelimit@eth0",
            is_file: false,
        },
    ],
    files: &[
        (
            "/etc/ratelimit/IFACE.toml",
            "the rules of IFACE, as the systemd unit ratelimit@IFACE.service reads them",
        ),
        (
            "/etc/ratelimit/ratelimit.toml",
            "the example config, as the Debian package installs it",
        ),
    ],
    see_also: &[
        "ratelimit(8)",
        "ratelimit-run(8)",
        "ratelimit-check(8)",
        "ratelimit-reload(8)",
        "ratelimit-serve.toml(5)",
    ],
};
