//! `murmur bench`: measurements whose results go into BENCHMARKS.md.

mod allreduce;
mod allreduce_peer;
mod checkpoint;
mod codecs;
mod metrics;
mod quality;
mod quality_plot;
mod quality_scenarios;
mod state_sync;
mod stream;
mod timing;
mod train;

use crate::cli::BenchCommand;

pub(crate) fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Codecs(args) => codecs::run(&args),
        BenchCommand::Stream(args) => stream::run(&args),
        BenchCommand::Allreduce(args) => allreduce::run(&args),
        BenchCommand::AllreducePeer(args) => allreduce_peer::run(&args),
        BenchCommand::Metrics(args) => metrics::run(&args),
        BenchCommand::Train(args) => train::run(&args),
        BenchCommand::Quality(args) => quality::run(&args),
        BenchCommand::Checkpoint(args) => checkpoint::run(&args),
        BenchCommand::StateSync(args) => state_sync::run(&args),
    }
}
