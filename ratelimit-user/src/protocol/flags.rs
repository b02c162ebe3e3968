//! The one translator between the fields a validated config names (the
//! config file's keys: `default.burst`, `levels[1].rate`) and the options
//! the user typed (`--burst`, `--rate (the second one)`). `run`'s rule
//! options are validated as the config's default rule and global keys; `set`'s
//! patch is validated under [`SET`] by the daemon, once laid over the rule it
//! has. Both say the error with the flag typed: the CLI for `run`, the daemon
//! for `set`.

use crate::error::Error;

/// The field `set`'s limit is validated under: its errors name `set.rate`,
/// `set.levels[1].per-v4`, … and [`flag`] turns them into `set`'s options.
pub const SET: &str = "set";

/// The option of the command line a field stands for: under [`SET`], `set`'s
/// (`set.rate` is `--rate`, `set.levels[1].rate` the second `--rate`,
/// `set.per-v4` `--per`, as `set` has one `--per` for the rule's family);
/// else `run`'s (`default.burst` is `--burst`, `default.per-v4` `--per-v4`,
/// `new-states` `--new-states`).
pub fn flag(field: &str) -> String {
    match field.strip_prefix(SET) {
        Some(path) => set_flag(path.trim_start_matches('.')),
        None => {
            let key = field.strip_prefix("default.").unwrap_or(field);
            format!("--{}", key.replace('_', "-"))
        }
    }
}

/// `e` with its field as the option typed (see [`flag`]); other errors as
/// they are.
pub fn flagged(e: Error) -> Error {
    match e {
        Error::Invalid { field, message } => Error::Invalid {
            field: flag(&field),
            message,
        },
        e => e,
    }
}

/// `set`'s option for `path`, a field below [`SET`].
fn set_flag(path: &str) -> String {
    let (level, key) = match path.strip_prefix("levels[") {
        Some(rest) => {
            let (n, key) = rest.split_once(']').unwrap_or((rest, ""));
            (n.parse::<usize>().ok(), key.trim_start_matches('.'))
        }
        None => (None, path),
    };
    let flag = match key {
        "" | "rate" => "--rate",
        "rate-burst" | "burst" => "--burst",
        "per" | "per-v4" | "per-v6" => "--per",
        "new-sources" => "--new-sources",
        "new-sources-burst" => "--new-sources-burst",
        "aggregate" => "--aggregate",
        "aggregate-burst" => "--aggregate-burst",
        other => return format!("--{}", other.split('.').next_back().unwrap_or(other)),
    };
    nth(flag, level.unwrap_or(0))
}

/// The `index`th of a repeated option of `set` (from 0): `--rate` for the
/// first (the rule's own level), `--rate (the second one)` for the next.
pub fn nth(flag: &str, index: usize) -> String {
    match index {
        0 => flag.to_string(),
        n => format!("{flag} (the {} one)", ordinal(n + 1)),
    }
}

fn ordinal(n: usize) -> &'static str {
    match n {
        1 => "first",
        2 => "second",
        3 => "third",
        _ => "next",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_fields_are_sets_options() {
        assert_eq!(flag("set.rate"), "--rate");
        assert_eq!(flag("set"), "--rate");
        assert_eq!(flag("set.burst"), "--burst");
        assert_eq!(flag("set.per-v4"), "--per");
        assert_eq!(flag("set.per-v6"), "--per");
        assert_eq!(flag("set.levels[1].rate"), "--rate (the second one)");
        assert_eq!(flag("set.levels[2].per-v4"), "--per (the third one)");
        assert_eq!(flag("set.levels[1].rate-burst"), "--burst (the second one)");
        assert_eq!(flag("set.window"), "--window");
        assert_eq!(flag("set.aggregate-reserve"), "--aggregate-reserve");
        assert_eq!(flag("set.algorithm"), "--algorithm");
    }

    #[test]
    fn run_fields_are_runs_options() {
        assert_eq!(flag("default.rate"), "--rate");
        assert_eq!(flag("default.burst"), "--burst");
        assert_eq!(flag("default.per-v4"), "--per-v4");
        assert_eq!(flag("default.new-sources"), "--new-sources");
        assert_eq!(flag("new-states"), "--new-states");
    }

    #[test]
    fn only_invalid_input_is_renamed() {
        let e = flagged(Error::invalid("set.levels[1].per", "bad"));
        assert!(
            matches!(&e, Error::Invalid { field, .. } if field == "--per (the second one)"),
            "{e}"
        );
        assert!(matches!(
            flagged(Error::Refused("no".into())),
            Error::Refused(_)
        ));
    }
}
