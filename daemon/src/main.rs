//! `murmur`: join a peer-to-peer training swarm, train, average, and report.
//!
//! Today the binary carries the researcher's tools; the daemon proper (`run`, `local`)
//! builds on them.

mod bench;
mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Bench(bench) => bench::run(bench),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("murmur: {err:#}");
            ExitCode::FAILURE
        }
    }
}
