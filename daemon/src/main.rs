//! `murmur`: join a peer-to-peer training swarm, train, average, and report.
//!
//! Today the binary carries the researcher's tools; the daemon proper (`run`, `local`)
//! builds on them.

mod bench;
mod checkpoint;
mod cli;
mod clock;
mod config;
mod first_peer;
mod hosts;
mod input_error;
mod instance_lock;
mod local;
mod manual;
mod observe;
mod run;
mod run_cmd;
mod sim;
mod status_cmd;
mod swarm_cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Run(args) => run_cmd::run(&args.config, args.progress, !args.quiet),
        cli::Command::Local(args) => local::run(&args),
        cli::Command::Bench(bench) => bench::run(bench),
        cli::Command::Sim(args) => sim::run(&args),
        cli::Command::Checkpoint(command) => checkpoint::run(command),
        cli::Command::Init(args) => swarm_cmd::init(&args),
        cli::Command::Swarm(command) => swarm_cmd::swarm(command),
        cli::Command::Config(command) => swarm_cmd::config(command),
        cli::Command::Status(args) => status_cmd::run(&args),
        cli::Command::Completions { shell } => manual::completions(shell),
        cli::Command::Man { out } => manual::man_pages(&out),
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
