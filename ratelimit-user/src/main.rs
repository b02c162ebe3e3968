//! The `ratelimit` binary: wiring only; everything lives in the library.
use std::process::ExitCode;

use clap::Parser as _;
use ratelimit_user::cli::{self, Cli};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("RATELIMIT_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli::main(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratelimit: {:#}", anyhow::Error::new(e));
            ExitCode::FAILURE
        }
    }
}
