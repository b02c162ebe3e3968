//! The `ratelimit-serve` binary (also run by `ratelimit serve`): wiring
//! only; everything lives in the library.
use std::process::ExitCode;

use clap::Parser as _;
use ratelimit_host::serve_args::{EXAMPLES, ServeArgs};
use ratelimit_serve::{Error, options, serve};

/// A throttling service for other programs, on Redis: HTTP and JSON, and
/// Envoy's rate limit service API over gRPC (the same service as `ratelimit
/// serve`).
#[derive(Debug, clap::Parser)]
#[command(name = "ratelimit-serve", version, after_help = EXAMPLES)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn main() -> ExitCode {
    ratelimit_host::logs::init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version succeed; a usage error is invalid input.
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratelimit serve: {}", ratelimit_host::chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// The runtime with `--threads` workers, and the service on it until SIGINT
/// or SIGTERM.
fn run(args: &ratelimit_host::serve_args::ServeArgs) -> Result<(), Error> {
    let threads = args.worker_threads()?;
    let opts = options(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    runtime.block_on(serve(opts, ratelimit_host::shutdown_signal()))
}
