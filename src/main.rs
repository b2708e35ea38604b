//! The `toolrouter` binary: parses the command line and hands it to the library.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    toolrouter::cli::run(toolrouter::cli::Cli::parse()).await
}
