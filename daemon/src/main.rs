//! `murmur`: join a peer-to-peer training swarm, train, average, and report.
//!
//! Today the binary carries the researcher's tools; the daemon proper (`run`, `local`)
//! builds on them.

mod allocator;
mod bench;
mod checkpoint;
mod cli;
mod clock;
mod config;
mod error_text;
mod first_peer;
mod hosts;
mod input_error;
mod instance_lock;
mod local;
mod manual;
mod observe;
mod revoke_cmd;
mod run;
mod run_cmd;
mod sim;
mod status_cmd;
mod swarm_cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Output piped into `head` and the like: a command whose reader has gone stops, as
    // `cat` does, instead of panicking on the broken pipe (Rust ignores SIGPIPE, so every
    // `println!` after the reader left would panic). `run` keeps ignoring it: it is a
    // daemon whose sockets must report a closed peer as an error, not kill the process, and
    // its progress writer already carries on when its stdout is closed.
    set_sigpipe(libc::SIG_DFL);
    if !allocator::return_large_buffers_to_the_kernel() {
        eprintln!(
            "murmur: warning: the allocator refused a fixed mmap threshold; freed buffers may stay resident"
        );
    }
    if !allocator::share_one_arena() {
        eprintln!(
            "murmur: warning: the allocator refused to keep one arena; freed buffers may stay resident in each thread's"
        );
    }
    let cli = cli::Cli::parse();
    if matches!(cli.command, cli::Command::Run(_)) {
        set_sigpipe(libc::SIG_IGN);
    }
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
            eprintln!("murmur: {}", error_text::describe(&err));
            if err.downcast_ref::<input_error::BadInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Sets what SIGPIPE does to this process. Called from `main` before any thread starts.
fn set_sigpipe(action: libc::sighandler_t) {
    // SAFETY: changing a signal's disposition to SIG_DFL or SIG_IGN installs no handler
    // code; it happens before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, action);
    }
}
