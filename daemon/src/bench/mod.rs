//! `murmur bench`: measurements whose results go into BENCHMARKS.md.

mod codecs;
mod stream;
mod timing;

use crate::cli::BenchCommand;

pub(crate) fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Codecs(args) => codecs::run(&args),
        BenchCommand::Stream(args) => stream::run(&args),
    }
}
