//! The command line's names for the lower floors' choices: `clap`'s
//! [`ValueEnum`] for each enum a flag takes ([`Clock`], [`HostConnections`],
//! [`Mode`], [`Unjudged`], [`Fragments`], [`AttachMode`], [`Fallback`]),
//! with the help each value shows in `--help` and the man pages. The enums
//! themselves know nothing of clap; their `serde` names (the config file's)
//! are the same words.

use clap::{ValueEnum, builder::PossibleValue};

use crate::{
    fleet::Fallback,
    kernel::AttachMode,
    model::rules::{Clock, Fragments, HostConnections, Mode, Unjudged},
};

/// `impl ValueEnum for $ty`: each variant, its name on the command line, its
/// help.
macro_rules! value_enum {
    ($ty:ty { $($variant:ident => $name:literal : $help:expr),+ $(,)? }) => {
        impl ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$(<$ty>::$variant),+]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(match self {
                    $(<$ty>::$variant => PossibleValue::new($name).help($help)),+
                })
            }
        }
    };
}

value_enum!(Clock {
    Precise => "precise": "`bpf_ktime_get_ns`: decisions exact to the nanosecond",
    Coarse => "coarse": "The time of the last scheduler tick (`bpf_ktime_get_coarse_ns`): cheaper; over any span T a key is admitted at most burst + rate × (T + one tick)",
});

value_enum!(HostConnections {
    Pass => "pass": "Never dropped by the limit (the default): they are counted against their source while it has room, and pass as `host_connection` when it has none",
    Limit => "limit": "Limited like every other frame",
});

value_enum!(Mode {
    Normal => "normal": "Every rule does what it says",
    AllowlistOnly => "allowlist-only": "Only sources under an `allow` rule pass; every other frame is dropped (counted `not_allowed`). For the worst minutes of an attack",
});

value_enum!(Unjudged {
    Drop => "drop": "Dropped (counted `unjudged`, `tiny_fragment`, or `denied` under a match). The default: what cannot be judged cannot walk past a rule",
    NextRule => "next-rule": "Judged by the rules that need nothing it hides (a match that needs what it hides is skipped: the next rule of its source judges it); a frame with too many tags has no source to judge by and is dropped. Unsafe against a fragmenting attacker: a tiny fragment's SYN is then judged by the rule after a `--syn` rule",
    Pass => "pass": "Passed (counted `allowed`); in allowlist-only mode, as `next-rule`",
});

value_enum!(Fragments {
    NextRule => "next-rule": "The rules that need ports or flags are skipped: the next rule of its source judges it (in the end its rule without matches, or the default rule). The default, and safe: the datagram's first fragment carries the transport header and is judged whole (a tiny one is dropped), so a datagram a rule refuses is never completed, and fragments are never unlimited",
    Drop => "drop": "Dropped (counted `denied`): also the fragments of datagrams a rule admits (large UDP answers, for one)",
});

value_enum!(AttachMode {
    Auto => "auto": "Native (driver) mode, falling back to generic with a warning",
    Native => "native": "Native (driver) mode only",
    Generic => "generic": "Generic (skb) mode only",
});

value_enum!(Fallback {
    Share => "share": "Each daemon charges what it admits `N` times (`N` the daemons last seen): the fleet stays near the limit",
    Local => "local": "Each daemon admits the whole limit alone",
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value's name on the command line is its name in the config file
    /// (serde's), so `--clock coarse` and `clock = "coarse"` are one word.
    #[test]
    fn the_command_lines_names_are_the_config_files() {
        fn same<T: ValueEnum + serde::Serialize>() {
            for v in T::value_variants() {
                let cli = v
                    .to_possible_value()
                    .expect("a name")
                    .get_name()
                    .to_string();
                let file = serde_json::to_value(v).expect("serialized");
                assert_eq!(serde_json::Value::String(cli.clone()), file, "{cli}");
            }
        }
        same::<Clock>();
        same::<HostConnections>();
        same::<Mode>();
        same::<Unjudged>();
        same::<Fragments>();
        same::<Fallback>();
    }

    /// Nothing below `cli` depends on clap: the floors under it take typed
    /// values, and their enums get their command-line names here.
    #[test]
    fn only_the_command_line_uses_clap() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).expect("the crate's sources") {
                let p = e.expect("an entry").path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src, &mut files);
        let users: Vec<String> = files
            .iter()
            .filter(|p| !p.starts_with(src.join("cli")) && *p != &src.join("main.rs"))
            .filter(|p| {
                let text = std::fs::read_to_string(p).expect("a source file");
                text.lines()
                    .any(|l| !l.trim_start().starts_with("//") && l.contains("clap::"))
            })
            .map(|p| p.strip_prefix(&src).unwrap_or(p).display().to_string())
            .collect();
        assert!(
            users.is_empty(),
            "clap used below cli/ in {users:?}: derive nothing of clap there; give the enum its names in cli/values.rs, and take a flag's struct into cli/"
        );
        // The walk read the crate: its floors are there.
        assert!(
            files.len() > 50 && files.contains(&src.join("daemon/mod.rs")),
            "the walk found {} files",
            files.len()
        );
    }
}
