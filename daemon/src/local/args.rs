//! The flags of `murmur local` and their validation into a [`LocalPlan`].

use std::path::PathBuf;

use clap::Args;
use murmur_protocol::codec::CodecSpec;
use murmur_trainer::TaskPreset;

use crate::input_error::BadInput;

/// The most peers `murmur local` starts: each is a full training process on this host.
pub(crate) const MAX_PEERS: usize = 64;

/// The largest straggler factor accepted: beyond it a peer contributes next to nothing.
const MAX_STRAGGLER_FACTOR: f64 = 100.0;

#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// Peers to start, 1 to 64.
    #[arg(long, default_value_t = 4)]
    pub(crate) peers: usize,
    /// How the peers average.
    #[arg(long, value_enum, default_value_t = AveragingMode::Sgp)]
    pub(crate) mode: AveragingMode,
    /// The wire codec of averaging, e.g. `f32`, `int8:64`, `int4`, `sign1`, `topk:10000`.
    #[arg(long, default_value = "int8:64")]
    pub(crate) codec: String,
    /// Local steps each peer runs; default: the built-in task's schedule length.
    #[arg(long)]
    pub(crate) steps: Option<u64>,
    /// `PEER:FACTOR`: peer PEER (0-based) takes FACTOR (>= 1) times as long per step.
    /// Repeatable.
    #[arg(long, value_name = "PEER:FACTOR")]
    pub(crate) straggler: Vec<String>,
    /// Every 5 to 10 s, kill -9 one peer other than peer 0 and restart it 2 s later.
    #[arg(long)]
    pub(crate) churn: bool,
    /// Print the summary as one JSON object, and nothing live.
    #[arg(long)]
    pub(crate) json: bool,
    /// The working folder (keys, invites, configs, logs, checkpoints, CSV, plot); it must be
    /// new or empty. Default: a fresh folder under the system's temp folder, kept.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

/// `[averaging] mode` of every peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AveragingMode {
    /// Stochastic Gradient Push: push a share of the parameters every step.
    Sgp,
    /// Accumulate gradients until the swarm reaches a target batch, then butterfly all-reduce.
    Butterfly,
    /// Several local steps, then average parameters.
    LocalSgd,
    /// Synchronous ring all-reduce, the baseline.
    SyncRing,
}

impl AveragingMode {
    /// The mode as the config file spells it.
    pub(crate) fn config_name(self) -> &'static str {
        match self {
            AveragingMode::Sgp => "sgp",
            AveragingMode::Butterfly => "butterfly",
            AveragingMode::LocalSgd => "local-sgd",
            AveragingMode::SyncRing => "sync-ring",
        }
    }
}

/// One slowed-down peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Straggler {
    /// The peer's index, 0-based.
    pub(crate) peer: usize,
    /// How many times its compute time each step is stretched to, at least 1.
    pub(crate) factor: f64,
}

/// A validated `murmur local` run.
#[derive(Debug, Clone)]
pub(crate) struct LocalPlan {
    pub(crate) peers: usize,
    pub(crate) mode: AveragingMode,
    pub(crate) codec: CodecSpec,
    pub(crate) steps: u64,
    pub(crate) stragglers: Vec<Straggler>,
    pub(crate) churn: bool,
    pub(crate) json: bool,
    pub(crate) out: Option<PathBuf>,
}

impl LocalPlan {
    /// Checks every flag; the error names the flag, what was wrong, and what is allowed.
    pub(crate) fn from_args(args: &LocalArgs) -> Result<LocalPlan, BadInput> {
        if !(1..=MAX_PEERS).contains(&args.peers) {
            return Err(BadInput(format!(
                "--peers {}: expected 1 to {MAX_PEERS}",
                args.peers
            )));
        }
        let codec = CodecSpec::parse(&args.codec)
            .map_err(|e| BadInput(format!("--codec {}: {e}", args.codec)))?;
        let steps = args
            .steps
            .unwrap_or(TaskPreset::default_local().schedule.total_steps);
        if steps == 0 {
            return Err(BadInput(
                "--steps 0: every peer must stop on its own; expected at least 1".into(),
            ));
        }
        let mut stragglers: Vec<Straggler> = Vec::with_capacity(args.straggler.len());
        for text in &args.straggler {
            let straggler = parse_straggler(text, args.peers)?;
            if stragglers.iter().any(|s| s.peer == straggler.peer) {
                return Err(BadInput(format!(
                    "--straggler {text}: peer {} is already slowed down; give each peer once",
                    straggler.peer
                )));
            }
            stragglers.push(straggler);
        }
        if args.churn && args.peers < 2 {
            return Err(BadInput(
                "--churn needs --peers 2 or more: peer 0 is never killed".into(),
            ));
        }
        Ok(LocalPlan {
            peers: args.peers,
            mode: args.mode,
            codec,
            steps,
            stragglers,
            churn: args.churn,
            json: args.json,
            out: args.out.clone(),
        })
    }

    /// The slowdown of peer `peer`: its straggler factor, or 1.
    pub(crate) fn slowdown(&self, peer: usize) -> f64 {
        self.stragglers
            .iter()
            .find(|s| s.peer == peer)
            .map_or(1.0, |s| s.factor)
    }

    /// The largest slowdown of any peer.
    pub(crate) fn max_slowdown(&self) -> f64 {
        self.stragglers.iter().map(|s| s.factor).fold(1.0, f64::max)
    }
}

/// Parses `PEER:FACTOR` for a swarm of `peers`.
fn parse_straggler(text: &str, peers: usize) -> Result<Straggler, BadInput> {
    let bad = |why: String| BadInput(format!("--straggler {text}: {why}"));
    let (peer, factor) = text
        .split_once(':')
        .ok_or_else(|| bad("expected PEER:FACTOR, e.g. 2:4".into()))?;
    let peer: usize = peer
        .trim()
        .parse()
        .map_err(|_| bad(format!("peer {peer:?} is not a peer index")))?;
    if peer >= peers {
        return Err(bad(format!(
            "there is no peer {peer}; with --peers {peers} peers are 0 to {}",
            peers - 1
        )));
    }
    let factor: f64 = factor
        .trim()
        .parse()
        .map_err(|_| bad(format!("factor {factor:?} is not a number")))?;
    if !(1.0..=MAX_STRAGGLER_FACTOR).contains(&factor) {
        return Err(bad(format!(
            "factor {factor} is out of range; expected 1 to {MAX_STRAGGLER_FACTOR} \
             (the times a step is stretched)"
        )));
    }
    Ok(Straggler { peer, factor })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> LocalArgs {
        LocalArgs {
            peers: 4,
            mode: AveragingMode::Sgp,
            codec: "int8:64".into(),
            steps: None,
            straggler: Vec::new(),
            churn: false,
            json: false,
            out: None,
        }
    }

    fn error(args: &LocalArgs) -> String {
        LocalPlan::from_args(args).unwrap_err().0
    }

    #[test]
    fn defaults_take_the_presets_schedule_length() {
        let plan = LocalPlan::from_args(&args()).unwrap();
        assert_eq!(plan.peers, 4);
        assert_eq!(plan.steps, TaskPreset::default_local().schedule.total_steps);
        assert_eq!(plan.codec, CodecSpec::Int8 { block: 64 });
        assert_eq!(plan.slowdown(0), 1.0);
        assert_eq!(plan.max_slowdown(), 1.0);
    }

    #[test]
    fn stragglers_are_parsed_per_peer() {
        let mut a = args();
        a.straggler = vec!["1:4".into(), "3:1.5".into()];
        let plan = LocalPlan::from_args(&a).unwrap();
        assert_eq!(plan.slowdown(1), 4.0);
        assert_eq!(plan.slowdown(3), 1.5);
        assert_eq!(plan.slowdown(2), 1.0);
        assert_eq!(plan.max_slowdown(), 4.0);
    }

    #[test]
    fn a_straggler_beyond_the_last_peer_is_refused() {
        let mut a = args();
        a.straggler = vec!["9:4".into()];
        let e = error(&a);
        assert!(e.contains("--straggler 9:4") && e.contains("0 to 3"), "{e}");
    }

    #[test]
    fn straggler_factors_below_one_or_garbled_are_refused() {
        for (text, needle) in [
            ("1:0.5", "out of range"),
            ("1:NaN", "out of range"),
            ("1:inf", "out of range"),
            ("1:x", "not a number"),
            ("x:2", "not a peer index"),
            ("12", "PEER:FACTOR"),
        ] {
            let mut a = args();
            a.straggler = vec![text.into()];
            let e = error(&a);
            assert!(
                e.starts_with("--straggler") && e.contains(needle),
                "{text}: {e}"
            );
        }
        let mut a = args();
        a.straggler = vec!["1:2".into(), "1:3".into()];
        assert!(error(&a).contains("already slowed down"));
    }

    #[test]
    fn bad_codec_peers_steps_and_churn_name_their_flag() {
        let mut a = args();
        a.codec = "int9".into();
        assert!(error(&a).starts_with("--codec int9"));
        a.codec = "int8:7".into();
        assert!(error(&a).starts_with("--codec int8:7"));

        let mut a = args();
        a.peers = 0;
        assert!(error(&a).starts_with("--peers 0"));
        a.peers = MAX_PEERS + 1;
        assert!(error(&a).starts_with("--peers"));

        let mut a = args();
        a.steps = Some(0);
        assert!(error(&a).starts_with("--steps 0"));

        let mut a = args();
        a.peers = 1;
        a.churn = true;
        assert!(error(&a).starts_with("--churn"));
    }

    #[test]
    fn modes_have_their_config_spelling() {
        use clap::ValueEnum;
        for mode in AveragingMode::value_variants() {
            let flag = mode.to_possible_value().unwrap();
            assert_eq!(flag.get_name(), mode.config_name());
        }
    }
}
