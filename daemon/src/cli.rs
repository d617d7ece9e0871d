//! The command line.

use clap::{Args, Parser, Subcommand};

/// murmur: decentralized peer-to-peer training.
#[derive(Debug, Parser)]
#[command(name = "murmur", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Measure murmur's building blocks on this machine.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Inspect a checkpoint folder.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Run a simulated swarm from a scenario file (see examples/sim/): prints a summary,
    /// writes the per-round records as CSV.
    Sim(SimArgs),
}

#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// The scenario, a TOML file.
    pub(crate) file: std::path::PathBuf,
    /// Print the summary as one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Only check that the scenario parses and is valid; run nothing.
    #[arg(long)]
    pub(crate) check: bool,
    /// Where to write the per-round CSV; default: the scenario's name with `.rounds.csv`,
    /// in the current directory.
    #[arg(long)]
    pub(crate) csv: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Encode and decode-accumulate speed and error of every tensor codec, one thread,
    /// against memcpy measured in the same run.
    Codecs(CodecsArgs),
    /// One libp2p tensor stream against raw quinn on loopback, in the same run.
    Stream(StreamArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StreamArgs {
    /// Payload MiB moved per transfer.
    #[arg(long, default_value_t = 256)]
    pub(crate) mib: u64,
    /// Payload KiB per frame (libp2p) and per write (quinn).
    #[arg(long, default_value_t = 1024)]
    pub(crate) chunk_kib: usize,
    /// Transfers per transport; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CodecsArgs {
    /// Elements per tensor (f32). The default, 16 Mi, is far larger than any cache.
    #[arg(long, default_value_t = 1 << 24)]
    pub(crate) elements: usize,
    /// Block size of the blockwise codecs (int8, int4, sign1), a multiple of 8 in 32..=4096.
    #[arg(long, default_value_t = 64)]
    pub(crate) block: u32,
    /// Timed repetitions per measurement; the median is reported.
    #[arg(long, default_value_t = 7)]
    pub(crate) repeats: usize,
    /// Codecs to measure, comma-separated (e.g. `f16,int8,topk:10000`); all by default.
    #[arg(long, value_delimiter = ',')]
    pub(crate) codecs: Vec<String>,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where the tensors live: `cpu`, or `cuda` for device memory on GPU 0 (device GB/s next
    /// to a device-to-device copy measured in the same run).
    #[arg(long, value_enum, default_value_t = BenchDevice::Cpu)]
    pub(crate) device: BenchDevice,
}

/// Where `bench codecs` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BenchDevice {
    /// One CPU thread.
    Cpu,
    /// The first CUDA device.
    Cuda,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CheckpointCommand {
    /// Show the newest valid checkpoint in a folder, and every newer one that is torn or
    /// corrupt, with the reason it was skipped.
    Show {
        /// The checkpoint folder.
        dir: std::path::PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}
