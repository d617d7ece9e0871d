//! The command line.

use clap::{Args, Parser, Subcommand};
use murmur_protocol::message::{AveragingMode, UnknownMode};

/// murmur: decentralized peer-to-peer training.
#[derive(Debug, Parser)]
#[command(name = "murmur", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Join the swarm a config file describes: train, average, and leave cleanly on
    /// SIGINT or SIGTERM (SIGUSR1 pauses training, SIGUSR2 resumes it).
    Run(RunArgs),
    /// Train the built-in model with a swarm of local peers (no files needed): live
    /// progress, then a summary, `progress.csv` and `loss.png` in the working folder.
    Local(crate::local::LocalArgs),
    /// Measure murmur's building blocks on this machine.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Inspect a checkpoint folder.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Run a simulated swarm from a scenario file (see examples/sim/): prints a summary,
    /// writes the per-round records as CSV.
    Sim(SimArgs),
    /// Create this peer's key (`murmur.key`) and a commented config (`murmur.toml`).
    Init(InitArgs),
    /// Create a swarm, or invite a peer to one (for the run organizer).
    #[command(subcommand)]
    Swarm(SwarmCommand),
    /// Check a config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Show a running daemon's status: step, loss, peers, last averaging rounds (from its
    /// `/status` endpoint).
    Status(StatusArgs),
    /// Print this command line's completions for a shell on stdout, e.g.
    /// `murmur completions bash > /etc/bash_completion.d/murmur`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages: `murmur.1` and one per command (`murmur-run.1`, …).
    Man {
        /// The folder to write them to (created if missing).
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
    },
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The daemon's metrics and status address (`[metrics] listen` in its config).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub(crate) addr: String,
    /// Print the daemon's JSON document as it is.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The config file (see examples/swarm.toml and docs/config.md).
    #[arg(long)]
    pub(crate) config: std::path::PathBuf,
    /// Print progress as JSON lines on stdout (see docs/progress.md); logs go to stderr.
    #[arg(long)]
    pub(crate) progress: bool,
    /// No status line in the log (step, loss, peers, samples/s, bytes/s every 5 s).
    #[arg(long)]
    pub(crate) quiet: bool,
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
    /// N peer processes on loopback average a vector with butterfly, ring or SGP: per
    /// round time, bytes per peer, error against the exact mean, and efficiency against
    /// one tensor stream measured in the same run.
    Allreduce(AllreduceArgs),
    /// One peer of `bench allreduce` (started by it).
    #[command(hide = true)]
    AllreducePeer(AllreducePeerArgs),
    /// What the run loop's metric and status updates cost per training step, against the
    /// same calls with metrics disabled and against a real step of the default task.
    Metrics(MetricsBenchArgs),
    /// One peer's training speed on one device (tokens per second of full local steps of
    /// the built-in GPT at a chosen size): run with `--device cuda` and with `--device cpu`
    /// to compare a GPU with one CPU core.
    Train(TrainBenchArgs),
    /// Training quality against the solo control: the quality task in every averaging mode
    /// and with no averaging (`none`), real local swarms at fixed step times; prints each
    /// mode's gap closure and writes quality.csv, curves.csv and quality.png.
    Quality(QualityArgs),
    /// Writing a checkpoint of a model's parameters and AdamW state against a plain write
    /// and fsync of as many bytes, in the same run, and the peak resident memory it adds.
    Checkpoint(CheckpointBenchArgs),
    /// A joiner's download of a served state against one tensor stream carrying as many
    /// bytes between the same two network stacks, in the same run.
    StateSync(StateSyncBenchArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StateSyncBenchArgs {
    /// MiB of parameters in the served state (values zstd cannot shrink).
    #[arg(long, default_value_t = 512)]
    pub(crate) mib: u64,
    /// Downloads and transfers each; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,
    /// Network stacks that serve the same state, 1 to 4; the joiner downloads from all of
    /// them at once, and the tensor stream comes from the first.
    #[arg(long, default_value_t = 1)]
    pub(crate) servers: usize,
    /// The folder the served and downloaded states are written in; a fresh temporary
    /// folder in it is removed at the end.
    #[arg(long, default_value = ".")]
    pub(crate) dir: std::path::PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CheckpointBenchArgs {
    /// Model parameters; the state written is three times as many values (parameters and
    /// AdamW's two moments). The default is GPT-2 small's count.
    #[arg(long, default_value_t = 124_439_808)]
    pub(crate) params: usize,
    /// Timed repetitions of each write; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// The folder written to (on the disk to measure); a fresh temporary folder in it is
    /// removed at the end.
    #[arg(long, default_value = ".")]
    pub(crate) dir: std::path::PathBuf,
    /// Time the way checkpoints were written before they were streamed instead: a copy of
    /// the state, encoded whole in memory at zstd level 3, then written and synced.
    #[arg(long)]
    pub(crate) in_memory: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct QualityArgs {
    /// The CI-sized run: `none`, `sync-ring`+f32 and `butterfly`+int8, 4 peers, one seed,
    /// IID data only.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Swarm sizes, comma-separated.
    #[arg(long, default_value = "4,8")]
    pub(crate) peers: String,
    /// Runs per mode and size (each with fresh keys, so fresh data and initial weights).
    #[arg(long, default_value_t = 3)]
    pub(crate) seeds: u32,
    /// Every step padded to this many milliseconds (`training.synthetic_step_ms`) in swarms
    /// of up to four peers; larger swarms scale it with their size (8 peers: twice), since
    /// their peers share the same cores.
    #[arg(long, default_value_t = 100)]
    pub(crate) step_ms: u64,
    /// Which conditions to run, comma-separated: `iid` (every mode at every size and seed),
    /// `non-iid` (each peer its own part of the data), `straggler` (peer 1 4× slower, every
    /// run stopped at the same wall time) and `churn` (a peer killed and restarted every 5
    /// to 10 s); the last three at the smallest size with one seed.
    #[arg(long, default_value = "iid,non-iid,straggler,churn")]
    pub(crate) scenarios: String,
    /// One JSON object per mode and size on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// The folder for the runs, the CSVs and the plot (created if missing); default: a new
    /// folder under the system's temp folder.
    #[arg(long)]
    pub(crate) out: Option<std::path::PathBuf>,
}

impl QualityArgs {
    /// `--peers` as numbers, each 2 to 16.
    pub(crate) fn peer_counts(&self) -> Result<Vec<usize>, crate::input_error::BadInput> {
        self.peers
            .split(',')
            .map(|p| match p.trim().parse::<usize>() {
                Ok(n) if (2..=16).contains(&n) => Ok(n),
                _ => Err(crate::input_error::BadInput(format!(
                    "--peers {:?}: expected swarm sizes of 2 to 16, comma-separated",
                    self.peers
                ))),
            })
            .collect()
    }
}

#[derive(Debug, Args)]
pub(crate) struct TrainBenchArgs {
    /// Where the forward and backward passes run: `cpu`, or `cuda` for GPU 0 (needs a
    /// murmur built with `--features cuda`).
    #[arg(long, value_enum, default_value_t = BenchDevice::Cpu)]
    pub(crate) device: BenchDevice,
    /// candle's CPU threads (`1` = one core, for the per-core comparison).
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    pub(crate) layers: usize,
    /// Embedding width.
    #[arg(long, default_value_t = 512)]
    pub(crate) width: usize,
    /// Attention heads (must divide the width).
    #[arg(long, default_value_t = 8)]
    pub(crate) heads: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub(crate) context: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch: usize,
    /// Timed steps (one more runs first, untimed); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) steps: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct MetricsBenchArgs {
    /// Timed repetitions per measurement; medians are reported.
    #[arg(long, default_value_t = 7)]
    pub(crate) repeats: usize,
    /// A step's worth of updates per timed repetition.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) updates: usize,
    /// Training steps per timed repetition.
    #[arg(long, default_value_t = 20)]
    pub(crate) steps: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
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

/// Where `bench codecs` and `bench train` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BenchDevice {
    /// The CPU: one thread for `bench codecs`, `--threads` for `bench train`.
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

// Identity, swarm and config commands: `murmur init`, `murmur swarm …`, `murmur config …`.

/// Where `murmur init` writes.
#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// The folder to write `murmur.key` and `murmur.toml` into (created if missing).
    #[arg(long, default_value = ".")]
    pub(crate) dir: std::path::PathBuf,
    /// Replace an existing `murmur.key` and `murmur.toml` (the old key is lost).
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SwarmCommand {
    /// Create a swarm: an authority key (`authority.key`) and a commented `swarm.toml` that
    /// names the swarm and its authority.
    New(SwarmNewArgs),
    /// Sign an invite admitting one peer to the swarm.
    Invite(SwarmInviteArgs),
    /// Revoke peers' invites: sign a new revocation list naming them and every peer the
    /// previous list named; copy it to any member's `swarm.revocation_file`.
    Revoke(SwarmRevokeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct SwarmRevokeArgs {
    /// Peers to revoke (`12D3KooW…`).
    pub(crate) peer_ids: Vec<String>,
    /// Peers to take off the list: their invites count again while valid.
    #[arg(long = "lift", value_name = "PEER_ID")]
    pub(crate) lift: Vec<String>,
    /// The swarm authority's key file (`authority.key` from `murmur swarm new`).
    #[arg(long)]
    pub(crate) authority_key: std::path::PathBuf,
    /// The swarm's config (`swarm.toml`), for the swarm id and authority.
    #[arg(long)]
    pub(crate) swarm_config: std::path::PathBuf,
    /// The list to replace (its peers stay revoked unless lifted); created if missing.
    #[arg(long, default_value = "revocations")]
    pub(crate) out: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct SwarmNewArgs {
    /// The folder to write `authority.key` and `swarm.toml` into (created if missing).
    #[arg(long, default_value = ".")]
    pub(crate) dir: std::path::PathBuf,
    /// The swarm's id: 1 to 64 of `a-z 0-9 . _ -`; default: `swarm-` and the start of the
    /// authority's peer id.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Replace an existing `authority.key` and `swarm.toml` (invites signed by the old key
    /// stop being accepted), and the first peer's files.
    #[arg(long)]
    pub(crate) force: bool,
    /// Do not set up the organizer's own first peer in `DIR/peer`.
    #[arg(long)]
    pub(crate) no_peer: bool,
    /// The UDP and TCP port the first peer listens on, so that its address stays the same
    /// across restarts.
    #[arg(long, default_value_t = 7600)]
    pub(crate) peer_port: u16,
    /// The first peer's public IP address or DNS name: `swarm.toml` then bootstraps from
    /// it. Without it, `swarm new` prints the addresses to add to `[net] bootstrap`.
    #[arg(long)]
    pub(crate) public_host: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SwarmInviteArgs {
    /// The peer to admit (`12D3KooW…`, as `murmur init` printed it).
    pub(crate) peer_id: String,
    /// The swarm authority's key file (`authority.key` from `murmur swarm new`).
    #[arg(long)]
    pub(crate) authority_key: std::path::PathBuf,
    /// The swarm's config (`swarm.toml`), for the swarm id and authority.
    #[arg(long)]
    pub(crate) swarm_config: std::path::PathBuf,
    /// Days the invite is valid, from now.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub(crate) valid_days: u64,
    /// Where to write the invite; send it to the peer, who puts it next to its config.
    #[arg(long, default_value = "invite")]
    pub(crate) out: std::path::PathBuf,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Load a config as `murmur run` would (key, invite and all), print a summary, run
    /// nothing. Exits 2 naming the file, line and key of the first problem.
    Check {
        /// The config file.
        file: std::path::PathBuf,
    },
}

/// A `--mode` or `--algo` value: an averaging mode by its config name (`ring` is taken for
/// `sync-ring`, as benchmarks have long spelled it).
pub(crate) fn parse_mode(text: &str) -> Result<AveragingMode, String> {
    match text {
        "ring" => Ok(AveragingMode::SyncRing),
        _ => text.parse().map_err(|e: UnknownMode| e.to_string()),
    }
}

#[derive(Debug, Args)]
pub(crate) struct AllreduceArgs {
    /// Peer processes.
    #[arg(long, default_value_t = 4)]
    pub(crate) peers: usize,
    /// Elements (f32) of the averaged vector.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) elements: usize,
    /// Wire codec (f32, f16, bf16, int8:64, ...); several, comma-separated, run one after
    /// the other in the same run and are compared.
    #[arg(long, default_value = "f32")]
    pub(crate) codec: String,
    /// The collective: `butterfly`, `sync-ring` (or `ring`) or `sgp` (push-sum gossip; a
    /// round is log2(N) push steps).
    #[arg(long, default_value = "butterfly", value_parser = parse_mode)]
    pub(crate) algo: AveragingMode,
    /// Rounds; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Fault injection: `kill -9` this peer (by index) as round `--kill-at-round` starts;
    /// the survivors' rounds report what coverage they got.
    #[arg(long)]
    pub(crate) kill_peer: Option<usize>,
    /// The round during which `--kill-peer` is killed (at least 1): as the first peer has
    /// finished the round before it.
    #[arg(long, default_value_t = 1)]
    pub(crate) kill_at_round: u64,
    /// Kill `--kill-peer` this many milliseconds after that moment instead (mid-round).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(crate) kill_delay_ms: u64,
    /// Butterfly and sync-ring: the largest group (`averaging.butterfly.target_group`).
    /// Default: every peer.
    #[arg(long, value_name = "N")]
    pub(crate) target_group: Option<usize>,
    /// Where each peer runs: a TOML file of `[[peer]]` tables, each with a `launch` command
    /// prefix (such as `ip netns exec NAME`) and the `listen_ip` it listens on. Default:
    /// children of this process on loopback.
    #[arg(long, value_name = "FILE")]
    pub(crate) hosts: Option<std::path::PathBuf>,
    /// The butterfly's sender timeout in milliseconds (`averaging.butterfly.chunk_timeout_ms`;
    /// default 10000). A round gives up after the reducer timeout plus twice this, so a large
    /// vector on slow links needs more.
    #[arg(long)]
    pub(crate) chunk_timeout_ms: Option<u64>,
    /// The butterfly's reducer timeout in milliseconds
    /// (`averaging.butterfly.reducer_timeout_ms`; default 15000), more than the sender's.
    #[arg(long)]
    pub(crate) reducer_timeout_ms: Option<u64>,
    /// Every peer's QUIC receive windows, per stream and per connection, in bytes
    /// (`net.quic_stream_receive_window`, `net.quic_connection_receive_window`; defaults
    /// 10 MB and 15 MB): how far a sender's writes may run ahead of what has arrived.
    #[arg(long, value_name = "BYTES")]
    pub(crate) quic_receive_window: Option<u32>,
    /// How butterfly parts are sized: `bandwidth` (by the upload each member declares and
    /// measures, as in training) or `equal`; several, comma-separated, run one after the
    /// other in the same run and are compared.
    #[arg(long, default_value = "bandwidth", value_name = "LIST")]
    pub(crate) parts: String,
    /// Each peer's upload cap in bytes per second (`[volunteer] max_upload_bytes_per_s`),
    /// one per peer in order, comma-separated; 0 = none. Default: no caps.
    #[arg(long, value_name = "LIST")]
    pub(crate) upload_caps: Option<String>,
    /// Keep the peers' folder (configs, keys, logs) after a run that succeeded; one that
    /// failed always keeps it and says where.
    #[arg(long)]
    pub(crate) keep_logs: bool,
    /// Runtime threads of each peer process. With 1 the network and the round share one
    /// thread and hand nothing between threads: faster where four or more peers share each
    /// core (measured with eight on two), slower where fewer do (four on two).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub(crate) peer_threads: u8,
}

#[derive(Debug, Args)]
pub(crate) struct AllreducePeerArgs {
    /// The peer's config file.
    #[arg(long)]
    pub(crate) config: std::path::PathBuf,
    /// The peer's index, 0-based.
    #[arg(long)]
    pub(crate) index: usize,
    /// Peers in the benchmark.
    #[arg(long)]
    pub(crate) peers: usize,
    /// Elements of the vector.
    #[arg(long)]
    pub(crate) elements: usize,
    /// The collective.
    #[arg(long, value_parser = parse_mode)]
    pub(crate) algo: AveragingMode,
    /// Rounds.
    #[arg(long)]
    pub(crate) rounds: u64,
    /// Begin each round as soon as the last one ended here, without waiting until every
    /// peer is ready for it.
    /// Size butterfly parts equally instead of by bandwidth.
    #[arg(long)]
    pub(crate) equal_parts: bool,
    /// Runtime threads: 1 runs everything on one thread.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub(crate) threads: u8,
}
