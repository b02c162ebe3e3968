//! How a failed command is reported: the human line on stderr (the error and
//! everything it came from, `a: b: c`), the exit code of its [`Kind`], and,
//! when the command line has `--json`, one JSON object on stdout that a script
//! can read without parsing English:
//!
//! ```json
//! {"error": {"kind": "invalid", "message": "--rate: ...", "field": "--rate", "exit_code": 2}}
//! ```
//!
//! `field` is there for invalid input only. `main` calls [`failure`] for the
//! library's errors and [`usage_error`] for clap's.

use std::{ffi::OsString, process::ExitCode};

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Kind};

/// What `--json` prints for a failure.
#[derive(Serialize)]
struct Failure<'a> {
    error: FailureOf<'a>,
}

#[derive(Serialize)]
struct FailureOf<'a> {
    /// [`Kind::name`].
    kind: &'static str,
    /// The error and everything it came from.
    message: &'a str,
    /// The option, key or argument at fault: for invalid input only.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    /// What the process exits with.
    exit_code: u8,
}

/// The JSON object of a failure, its fields sorted by name.
pub fn error_json(kind: Kind, message: &str, field: Option<&str>) -> Value {
    let failure = Failure {
        error: FailureOf {
            kind: kind.name(),
            message,
            field: field.filter(|_| kind == Kind::Invalid),
            exit_code: kind.exit_code(),
        },
    };
    serde_json::to_value(failure).expect("failures serialize")
}

/// Reports `e`; returns the exit code to exit with.
pub fn failure(e: Error, json: bool) -> ExitCode {
    let kind = e.kind();
    let field = match &e {
        Error::Invalid { field, .. } => Some(field.clone()),
        _ => None,
    };
    let message = format!("{:#}", anyhow::Error::new(e));
    eprintln!("ratelimit: {message}");
    if json {
        println!("{}", error_json(kind, &message, field.as_deref()));
    }
    ExitCode::from(kind.exit_code())
}

/// Reports an error of clap's: `--help` and `--version` print and succeed;
/// a usage error is printed as clap renders it and is invalid input (exit
/// code 2, as clap's own), in JSON too when `json` (the raw arguments had
/// `--json`: see [`json_in_args`]).
pub fn usage_error(e: clap::Error, json: bool) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let _ = e.print();
    if json {
        println!(
            "{}",
            error_json(
                Kind::Invalid,
                &usage_message(&e),
                usage_field(&e).as_deref()
            )
        );
    }
    ExitCode::from(Kind::Invalid.exit_code())
}

/// Whether the raw arguments ask for JSON (before `--`, which ends the
/// options): for errors found before the command line could be parsed.
pub fn json_in_args(args: impl IntoIterator<Item = OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

/// clap's message without its usage and tips: its first line, less `error: `.
fn usage_message(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The flag or argument clap's error is about, as typed (`--rate`, not
/// `--rate <RATE>`).
fn usage_field(e: &clap::Error) -> Option<String> {
    match e.get(clap::error::ContextKind::InvalidArg)? {
        clap::error::ContextValue::String(s) => s.split_whitespace().next().map(str::to_string),
        clap::error::ContextValue::Strings(v) => {
            v.first()?.split_whitespace().next().map(str::to_string)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use serde_json::json;

    use super::*;
    use crate::cli::args::Cli;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_json_object_names_kind_field_and_code() {
        let v = error_json(Kind::Invalid, "--rate: bad", Some("--rate"));
        assert_eq!(
            v,
            json!({"error": {"kind": "invalid", "message": "--rate: bad", "field": "--rate", "exit_code": 2}})
        );
        // A field only for invalid input.
        let v = error_json(
            Kind::NoDaemon,
            "no ratelimit daemon runs on eth0",
            Some("x"),
        );
        assert_eq!(
            v,
            json!({"error": {"kind": "no-daemon", "message": "no ratelimit daemon runs on eth0", "exit_code": 3}})
        );
        // As printed: one line, its fields sorted by name.
        assert_eq!(
            v.to_string(),
            r#"{"error":{"exit_code":3,"kind":"no-daemon","message":"no ratelimit daemon runs on eth0"}}"#
        );
    }

    #[test]
    fn json_is_found_in_the_raw_arguments_before_a_double_dash() {
        assert!(json_in_args(args(&[
            "ratelimit",
            "list",
            "--json",
            "--bogus"
        ])));
        assert!(!json_in_args(args(&["ratelimit", "list", "--", "--json"])));
        assert!(!json_in_args(args(&["ratelimit", "list"])));
    }

    #[test]
    fn a_usage_error_names_the_flag_without_its_value_name() {
        let e = Cli::try_parse_from(["ratelimit", "top", "--json", "-n", "many"]).unwrap_err();
        assert_eq!(usage_field(&e).as_deref(), Some("-n"));
        assert!(usage_message(&e).contains("many"), "{}", usage_message(&e));
        assert!(!usage_message(&e).starts_with("error:"));
        let e = Cli::try_parse_from(["ratelimit", "list", "--json", "--colour"]).unwrap_err();
        assert_eq!(usage_field(&e).as_deref(), Some("--colour"));
    }

    #[test]
    fn cli_json_follows_the_flag() {
        let json = |a: &[&str]| Cli::try_parse_from(a).unwrap().json();
        assert!(json(&["ratelimit", "list", "--json"]));
        assert!(json(&["ratelimit", "stats", "--json"]));
        assert!(json(&["ratelimit", "top", "--json"]));
        assert!(!json(&["ratelimit", "status"]));
        assert!(!json(&["ratelimit", "deny", "198.18.0.66/32"]));
    }
}
