//! The `ratelimit` binary: wiring only; everything lives in the library.
use std::process::ExitCode;

use clap::Parser as _;
use ratelimit_user::{
    cli::report,
    cli::{self, Cli},
    host::logs,
};

#[tokio::main]
async fn main() -> ExitCode {
    logs::init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return report::usage_error(e, report::json_in_args(std::env::args_os())),
    };
    let json = cli.json();
    match cli::main(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(e, json),
    }
}
