//! `murmur`: join a peer-to-peer training swarm, train, average, and report.
//!
//! Today the binary carries the researcher's tools; the daemon proper (`run`, `local`)
//! builds on them.

mod bench;
mod checkpoint;
mod cli;
mod input_error;
mod sim;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Bench(bench) => bench::run(bench),
        cli::Command::Sim(args) => sim::run(&args),
        cli::Command::Checkpoint(command) => checkpoint::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("murmur: {err:#}");
            if err.downcast_ref::<input_error::BadInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
