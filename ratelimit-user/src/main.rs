//! The `ratelimit` binary: wiring only; everything lives in the library.
use std::process::ExitCode;

use clap::Parser as _;
use ratelimit_user::{
    cli::report,
    cli::{self, Cli},
    host::logs,
};

fn main() -> ExitCode {
    logs::init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return report::usage_error(e, report::json_in_args(std::env::args_os())),
    };
    if let cli::Command::Serve(_) = cli.command {
        // The service is its own binary: this process becomes it.
        return report::failure(cli::serve::exec(), false);
    }
    let json = cli.json();
    let runtime = match cli.runtime() {
        Ok(r) => r,
        Err(e) => return report::failure(e, json),
    };
    match runtime.block_on(cli::main(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(e, json),
    }
}
