//! `ratelimit-serve.toml(5)`: the config file of `ratelimit serve --config
//! FILE`, read by `ratelimit_serve::config` (a crate this one does not
//! link: its tests do). Every key the parser reads is
//! here, and nothing else (the tests of [`super::file_page`] check both).

use super::file_page::{Example, Key, Page, Table};

/// The page.
pub(super) const PAGE: Page = Page {
    name: "ratelimit-serve.toml",
    summary: "the tenants, domains and limits of ratelimit serve, in TOML",
    synopsis: &["ratelimit serve --redis URL --config FILE"],
    description: &[
        "The config file of the throttling service, ratelimit serve: its limits, by domain and descriptor as Envoy's rate limit service keeps them, and its callers, the tenants, with their tokens. With it every caller is a tenant that sends its bearer token (Authorization: Bearer TOKEN over HTTP, the metadata authorization: Bearer TOKEN over gRPC), uses only the domains the file gives its tenant, and names a limit, not its numbers (unless its tenant has inline-limits). Without --config the service is open: any caller names any key and the limit's numbers.",
        "The file is read when the service starts. Keys are written in kebab-case, and every one is optional but those said required. A key the reader does not know, or a value of the wrong type or form, is an error; a file with errors is refused before anything starts, every error said as FILE:LINE: KEY: MESSAGE (domain[0].limit[1].rate), and the service exits 2.",
        "A request names what it limits in one of three forms, each counted in the same bucket: a limit by name and the value of its descriptor's entry without one ({\"limit\": \"per-user\", \"key\": \"42\"}); a domain and a descriptor, matched entry by entry as Envoy's service matches one, an entry with that key and value first, else the key alone ({\"domain\": \"checkout\", \"descriptor\": [{\"key\": \"user\", \"value\": \"42\"}]}; no limit matching: not limited); or numbers, from a tenant with inline-limits ({\"key\": \"k\", \"limit\": {\"rate\": \"100/s\"}}).",
    ],
    tables: &[
        Table {
            of: &[""],
            heading: "TOP-LEVEL KEYS",
            text: &["The file holds tables only."],
            keys: &[
                Key {
                    name: "tenant",
                    forms: "an array of tables, [[tenant]], of TENANTS keys",
                    default: "required: one at least",
                    text: "The callers.",
                    example: "[[tenant]]\nname = \"checkout\"\ntokens = [\"sha256:34cf2003145c33da1dfd5cc1b1a9e2f13355c5b513b8f4631f33227f324df01a\"]",
                    ..Key::EMPTY
                },
                Key {
                    name: "domain",
                    forms: "an array of tables, [[domain]], of DOMAINS keys",
                    default: "none",
                    text: "The namespaces of limits (Envoy's domain), each with the tenants that may use its keys.",
                    example: "[[domain]]\nname = \"checkout\"\ntenants = [\"checkout\"]",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["[[tenant]]"],
            heading: "TENANTS: [[tenant]]",
            text: &[
                "Each [[tenant]] is a caller: its name, and its tokens, or the callers that send none. A token names one tenant. A request without a token, or with one no tenant has, is answered 401; one for a domain, limit or grant not its tenant's 403.",
            ],
            keys: &[
                Key {
                    name: "name",
                    forms: "a string of 1 to 128 characters, none a control character",
                    default: "required",
                    text: "The tenant's name, as [[domain]] tenants names it; one tenant a name.",
                    example: "name = \"edge\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "tokens",
                    forms: "an array of strings, \"sha256:\" and 64 hex digits",
                    default: "none",
                    text: "The SHA-256 of each of the tenant's tokens, as printf %s \"$TOKEN\" | sha256sum prints it: the file holds no token itself. A tenant needs tokens, a token-file, or anonymous.",
                    example: "tokens = [\"sha256:34cf2003145c33da1dfd5cc1b1a9e2f13355c5b513b8f4631f33227f324df01a\"]",
                    ..Key::EMPTY
                },
                Key {
                    name: "token-file",
                    forms: "a path",
                    default: "none",
                    text: "A file of the tokens themselves, one a line (# begins a comment), each of 16 characters at least (head -c 24 /dev/urandom | base64 makes one). A relative path is relative to the config file's directory.",
                    example: "token-file = \"checkout.token\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "inline-limits",
                    forms: "boolean",
                    default: "false",
                    text: "The tenant may name a limit's numbers in a request (its keys are then its own), and a descriptor's limit override over gRPC; otherwise such a request is refused.",
                    example: "inline-limits = true",
                    ..Key::EMPTY
                },
                Key {
                    name: "anonymous",
                    forms: "boolean",
                    default: "false",
                    text: "The tenant of the callers that send no token; one tenant at most.",
                    example: "anonymous = true",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["[[domain]]"],
            heading: "DOMAINS: [[domain]]",
            text: &[
                "Each [[domain]] is a namespace of limits, as Envoy's rate limit filter names one (its domain), and the tenants that may use it.",
            ],
            keys: &[
                Key {
                    name: "name",
                    forms: "a string of 1 to 128 characters, none a control character",
                    default: "required",
                    text: "The domain's name; one domain a name.",
                    example: "name = \"api\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "tenants",
                    forms: "an array of tenant names",
                    default: "required: one at least",
                    text: "The tenants that may use the domain's limits and keys.",
                    example: "tenants = [\"checkout\"]",
                    ..Key::EMPTY
                },
                Key {
                    name: "failure-mode",
                    forms: "\"allow\" or \"deny\"",
                    default: "none",
                    text: "What the answer advises when Redis cannot decide: the 503's failure_mode, \"allow\" (fail open) or \"deny\" (fail closed); over gRPC, OK or OVER_LIMIT. Without it a 503 advises nothing, and gRPC answers UNAVAILABLE (Envoy's failure_mode_deny chooses).",
                    example: "failure-mode = \"allow\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "limit",
                    forms: "an array of tables, [[domain.limit]], of LIMITS keys",
                    default: "none",
                    text: "The domain's limits: a descriptor no limit matches is not limited.",
                    example: "[[domain.limit]]\ndescriptor = [{ key = \"user\" }]\nrate = \"100/s\"",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["[[domain.limit]]"],
            heading: "LIMITS: [[domain.limit]]",
            text: &[
                "Each [[domain.limit]], after its [[domain]], is a limit of that domain: the descriptor it matches and its numbers. A key's bucket lives in Redis, shared by every replica of the service.",
            ],
            keys: &[
                Key {
                    name: "name",
                    forms: "a string of 1 to 128 characters, none a control character",
                    default: "the domain and the descriptor's entries, \"checkout/user\" or \"checkout/user=42\"",
                    text: "The limit's name, as a request names it ({\"limit\": \"per-user\", \"key\": \"42\"}); one limit a name in the whole file.",
                    example: "name = \"per-user\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "descriptor",
                    forms: "an array of 1 to 16 inline tables of DESCRIPTOR ENTRIES keys",
                    default: "required",
                    text: "The descriptor the limit matches, entry by entry; one limit a descriptor in a domain.",
                    example: "descriptor = [{ key = \"user\" }, { key = \"path\", value = \"/pay\" }]",
                    ..Key::EMPTY
                },
                Key {
                    name: "rate",
                    forms: "RATE, of requests or units",
                    default: "required",
                    text: "What a key may take per period. For the window algorithms the period is the window, and the count a whole number (\"3/2min\", not \"1.5/min\").",
                    example: "rate = \"10/min\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "burst",
                    forms: "an integer, 1 to 4294967296 (2^32)",
                    default: "one second's worth of the rate",
                    text: "The bucket's size: what a key may take at once after a rest. gcra only.",
                    example: "burst = 20",
                    ..Key::EMPTY
                },
                Key {
                    name: "algorithm",
                    forms: "\"gcra\", \"fixed-window\" or \"sliding-window\"",
                    default: "\"gcra\"",
                    text: "gcra is a token bucket refilled continuously; fixed-window counts per aligned window; sliding-window weighs the window before.",
                    example: "rate = \"100/min\"\nalgorithm = \"fixed-window\"",
                    ..Key::EMPTY
                },
                Key {
                    name: "shadow",
                    forms: "boolean",
                    default: "false",
                    text: "The limit decides and takes what it would, and the answer always allows, with what the limit decided beside it (\"shadow\"); over gRPC it answers OK. Counted in ratelimit_serve_shadow_decisions_total.",
                    example: "shadow = true",
                    ..Key::EMPTY
                },
                Key {
                    name: "lease",
                    forms: "1 to the limit's burst",
                    default: "none (every acquire is decided in Redis)",
                    text: "A key of this limit asked for at least this many units within a second is leased: the service takes this many units from Redis at once and decides that key's next acquires that ask for no grant (gRPC's, and HTTP's with \"grant\": false) from them, without asking Redis, for up to a second; what the lease did not use then goes back. With C replicas of the service the limit admits at most B + R·t + min(2·C·lease, R·1 s) over any time t (burst B, rate R). A gcra limit only. Counted in ratelimit_serve_leases_total, ratelimit_serve_leased_decisions_total and ratelimit_serve_leased_units.",
                    example: "lease = 50",
                    ..Key::EMPTY
                },
            ],
        },
        Table {
            of: &["descriptor"],
            heading: "DESCRIPTOR ENTRIES: descriptor",
            text: &[
                "descriptor = [{ key = \"user\" }, { key = \"path\", value = \"/pay\" }]: the entries of a limit's descriptor, in the order a request's descriptor has them.",
            ],
            keys: &[
                Key {
                    name: "key",
                    forms: "a string",
                    default: "required",
                    text: "The entry's key, as Envoy's descriptor names it (user, remote_address, path).",
                    example: "descriptor = [{ key = \"remote_address\" }]",
                    ..Key::EMPTY
                },
                Key {
                    name: "value",
                    forms: "a string",
                    default: "none: each value of the key counted apart",
                    text: "The entry's value: the limit matches that value only, before any limit of the key alone.",
                    example: "descriptor = [{ key = \"user\", value = \"42\" }]",
                    ..Key::EMPTY
                },
            ],
        },
    ],
    values: &[(
        "RATE",
        "A count per period: \"100/s\", \"30/min\", \"50/hour\", \"10k/s\", \"3/2min\". Bytes are not counted here.",
    )],
    examples: &[
        Example {
            what: "A tenant with a token (this hash is of checkout-token-0123456789), another whose callers send none, and a domain of two limits, one of them in shadow mode:",
            text: r#"[[tenant]]
name = "checkout"
tokens = ["sha256:34cf2003145c33da1dfd5cc1b1a9e2f13355c5b513b8f4631f33227f324df01a"]
inline-limits = true

[[tenant]]
name = "public"
anonymous = true

[[domain]]
name = "checkout"
tenants = ["checkout", "public"]
failure-mode = "allow"

[[domain.limit]]
name = "per-user"
descriptor = [{ key = "user" }]
rate = "100/s"
burst = 20

[[domain.limit]]
name = "per-user-path"
descriptor = [{ key = "user" }, { key = "path", value = "/pay" }]
rate = "10/min"
algorithm = "sliding-window"
shadow = true"#,
            is_file: true,
        },
        Example {
            what: "Serve it, then take 5 units of user 42's bucket:",
            text: "ratelimit serve --redis redis://127.0.0.1:6379 --config /etc/ratelimit/serve.toml\ncurl -s localhost:9478/v1/acquire -H 'Authorization: Bearer checkout-token-0123456789' \\\n  -d '{\"limit\": \"per-user\", \"key\": \"42\", \"amount\": 5}'",
            is_file: false,
        },
    ],
    files: &[],
    see_also: &["ratelimit(8)", "ratelimit-serve(8)", "ratelimit.toml(5)"],
};
