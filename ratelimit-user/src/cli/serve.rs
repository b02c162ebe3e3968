//! `ratelimit serve`: the throttling service is a program of its own,
//! `ratelimit-serve`, with nothing of the packet limiter (and this binary,
//! which loads BPF as root, nothing of the service: no HTTP/2, gRPC or
//! Envoy's types). The command stays for users: it was parsed here with the
//! service's own definition of its options ([`ratelimit_host::serve_args`]),
//! so `--help`, bad options and completions answer as before; then this
//! process becomes `ratelimit-serve` with the same arguments (the same pid,
//! for a supervisor or a unit).

use std::{
    ffi::OsString,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use crate::error::Error;

/// The service's binary, as installed beside this one.
pub const BINARY: &str = "ratelimit-serve";

/// Where the service's binary is: beside this one's (`/usr/bin/ratelimit`,
/// `/usr/bin/ratelimit-serve`; `target/release/` in a build), else its name,
/// for `PATH`.
pub fn binary(this: Option<&Path>) -> PathBuf {
    this.and_then(Path::parent)
        .map(|dir| dir.join(BINARY))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(BINARY))
}

/// The arguments after `serve` in `args` (the whole command line, the
/// program's name first).
pub fn arguments(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .skip(1)
        .skip_while(|a| a != "serve")
        .skip(1)
        .collect()
}

/// Becomes `ratelimit-serve` with this command line's arguments; returns
/// only if that failed, with the error to report.
pub fn exec() -> Error {
    let this = std::env::current_exe().ok();
    let bin = binary(this.as_deref());
    let e = Command::new(&bin)
        .args(arguments(std::env::args_os()))
        .exec();
    Error::Io {
        what: format!(
            "`ratelimit serve` runs the service's own binary, {}, which could not be started (it is installed beside ratelimit: `cargo xtask install` and the .deb put both in place)",
            bin.display()
        ),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_after_serve_are_handed_on_as_typed() {
        let line = [
            "/usr/bin/ratelimit",
            "serve",
            "--redis",
            "redis://127.0.0.1:6379",
            "--listen",
            "serve",
        ];
        assert_eq!(
            arguments(line.map(OsString::from)),
            ["--redis", "redis://127.0.0.1:6379", "--listen", "serve"].map(OsString::from)
        );
    }

    #[test]
    fn the_service_is_found_beside_this_binary_or_on_the_path() {
        let dir = std::env::temp_dir().join(format!("ratelimit-serve-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let this = dir.join("ratelimit");
        assert_eq!(
            binary(Some(&this)),
            PathBuf::from(BINARY),
            "nothing beside it: PATH"
        );
        std::fs::write(dir.join(BINARY), b"").unwrap();
        assert_eq!(binary(Some(&this)), dir.join(BINARY));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
