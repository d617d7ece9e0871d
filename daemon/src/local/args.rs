//! The flags of `murmur local` and their validation into a [`LocalPlan`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use murmur_protocol::codec::CodecSpec;
pub(crate) use murmur_protocol::message::AveragingMode;
use murmur_trainer::TaskPreset;

use crate::hosts::Hosts;
use crate::input_error::BadInput;

use super::overrides::Override;

/// The most peers `murmur local` starts: each is a full training process on this host.
pub(crate) const MAX_PEERS: usize = 64;

/// The largest straggler factor accepted: beyond it a peer contributes next to nothing.
const MAX_STRAGGLER_FACTOR: f64 = 100.0;

/// The longest synthetic step, as `[training] synthetic_step_ms` allows it.
const MAX_SYNTHETIC_STEP_MS: u64 = 60_000;

/// The longest `--stop-after`, in seconds.
const MAX_STOP_AFTER_S: f64 = 86_400.0;

/// The longest `--churn-every` interval, in seconds.
const MAX_CHURN_EVERY_S: f64 = 3600.0;

#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// Peers to start, 1 to 64.
    #[arg(long, default_value_t = 4)]
    pub(crate) peers: usize,
    /// How the peers average: `sgp`, `butterfly`, `local-sgd`, `sync-ring`, or `none` (each
    /// peer trains alone: the control).
    #[arg(long, default_value = "sgp", value_parser = crate::cli::parse_mode)]
    pub(crate) mode: AveragingMode,
    /// The wire codec of averaging, e.g. `f32`, `int8:64`, `int4`, `sign1`, `topk:10000`.
    #[arg(long, default_value = "int8:64")]
    pub(crate) codec: String,
    /// The built-in task: `markov-gpt` (a small GPT on a synthetic Markov chain, AdamW),
    /// `teacher-mlp` (an MLP learning a teacher network's labels, SGD with Nesterov momentum)
    /// or `quality` (the quality benchmark's: a GPT on a 256-state chain with 16 branches per
    /// state, where a peer alone falls clearly short).
    #[arg(long, default_value = "markov-gpt", value_parser = parse_task)]
    pub(crate) task: TaskPreset,
    /// Local steps each peer runs; default: the built-in task's schedule length.
    #[arg(long)]
    pub(crate) steps: Option<u64>,
    /// `PEER:FACTOR`: peer PEER (0-based) takes FACTOR (>= 1) times as long per step.
    /// Repeatable.
    #[arg(long, value_name = "PEER:FACTOR")]
    pub(crate) straggler: Vec<String>,
    /// Every 5 to 10 s (see `--churn-every`), kill -9 one peer other than peer 0 and
    /// restart it 2 s later.
    #[arg(long)]
    pub(crate) churn: bool,
    /// `MIN-MAX`: with `--churn`, kill a peer every MIN to MAX seconds (drawn uniformly each
    /// time), e.g. `2-5`. Default: 5-10.
    #[arg(long, value_name = "MIN-MAX")]
    pub(crate) churn_every: Option<String>,
    /// Non-IID data: peer K of N draws only from data shard K of N (`data.shard`,
    /// `data.shards`). For the Markov tasks, its sequences start in the K-th of N ranges of
    /// the states; add `--set data.source.communities=N` to make those ranges parts of the
    /// chain a sequence seldom leaves.
    #[arg(long)]
    pub(crate) non_iid: bool,
    /// Stop every peer SECONDS after the start, as Ctrl-C would: each evaluates its model as
    /// it stands and reports it, for comparisons at equal wall time (a straggler that holds
    /// a synchronous swarm back shows here). Up to 86400.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) stop_after: Option<f64>,
    /// Print the summary as one JSON object, and nothing live.
    #[arg(long)]
    pub(crate) json: bool,
    /// The working folder (keys, invites, configs, logs, checkpoints, CSV, plot); it must be
    /// new or empty. Default: a fresh folder under the system's temp folder, kept.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Where each peer runs: a TOML file of `[[peer]]` tables, each with a `launch` command
    /// prefix (such as `ip netns exec NAME`) and the `listen_ip` it listens on. Default:
    /// children of this process on loopback.
    #[arg(long, value_name = "FILE")]
    pub(crate) hosts: Option<PathBuf>,
    /// Pad every step to at least MS milliseconds by sleeping (`[training]
    /// synthetic_step_ms`), so step time follows the flag rather than the shared CPU; a
    /// straggler's padded step is stretched by its factor. 0 = off.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(crate) synthetic_step_ms: u64,
    /// Send lossy codecs' error in full each round instead of carrying it into the next
    /// (`averaging.error_feedback = false`; butterfly, sync-ring, local-sgd).
    #[arg(long)]
    pub(crate) no_error_feedback: bool,
    /// CenteredClip at every reducer with this radius per element (`[averaging.butterfly.clip]
    /// tau`; 3 iterations, outliers past 4 median distances set aside).
    #[arg(long, value_name = "TAU")]
    pub(crate) clip: Option<f32>,
    /// `KEY=VALUE`: set any key of the peers' config (`docs/config.md`), e.g.
    /// `averaging.sgp.out_degree=2` or `schedule.peak_lr=0.006`, after the other flags.
    /// Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// `PEER:KEY=VALUE`: set a config key in peer PEER's config only (0-based), after every
    /// `--set`, e.g. `0:training.device=cuda` for one GPU peer among CPU peers. Repeatable.
    #[arg(long = "set-peer", value_name = "PEER:KEY=VALUE")]
    pub(crate) set_peer: Vec<String>,
    /// Test only: `PEER:SPEC` runs peer PEER with `MURMUR_TEST_FAULT=SPEC` (`flip:S` sends
    /// gradients as −S × themselves, `inflate:K` declares K × the samples). Repeatable.
    #[arg(long, value_name = "PEER:SPEC", hide = true)]
    pub(crate) fault: Vec<String>,
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
    /// The built-in task every peer trains.
    pub(crate) task: TaskPreset,
    pub(crate) mode: AveragingMode,
    pub(crate) codec: CodecSpec,
    pub(crate) steps: u64,
    pub(crate) stragglers: Vec<Straggler>,
    pub(crate) churn: bool,
    /// Each peer its own data shard.
    pub(crate) non_iid: bool,
    /// Stop every peer this long after the start (`--stop-after`).
    pub(crate) stop_after: Option<Duration>,
    pub(crate) json: bool,
    pub(crate) out: Option<PathBuf>,
    /// Where each peer runs and listens.
    pub(crate) hosts: Hosts,
    /// Every peer's `[training] synthetic_step_ms`; 0 = off.
    pub(crate) synthetic_step_ms: u64,
    /// Every peer's `averaging.error_feedback`.
    pub(crate) error_feedback: bool,
    /// Every peer's CenteredClip radius, if clipping.
    pub(crate) clip: Option<f32>,
    /// Peers run with the test-only fault switch, and its value.
    pub(crate) faults: Vec<(usize, String)>,
    /// `--set` overrides, applied to every peer's config in order, then the `--set-peer`
    /// ones, each to its peer's.
    pub(crate) overrides: Vec<Override>,
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
            .unwrap_or(args.task.config().schedule.total_steps);
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
        args.churn_every()?;
        if args.synthetic_step_ms > MAX_SYNTHETIC_STEP_MS {
            return Err(BadInput(format!(
                "--synthetic-step-ms {}: expected 0 (off) to {MAX_SYNTHETIC_STEP_MS}",
                args.synthetic_step_ms
            )));
        }
        let hosts = Hosts::from_flag(args.hosts.as_deref(), args.peers)?;
        if let Some(tau) = args.clip
            && !(tau.is_finite() && tau > 0.0)
        {
            return Err(BadInput(format!("--clip {tau}: expected a radius above 0")));
        }
        let mut faults = Vec::new();
        for text in &args.fault {
            let parsed = text
                .split_once(':')
                .and_then(|(peer, spec)| Some((peer.parse::<usize>().ok()?, spec.to_owned())))
                .filter(|(peer, _)| *peer < args.peers);
            match parsed {
                Some(fault) => faults.push(fault),
                None => {
                    return Err(BadInput(format!(
                        "--fault {text}: expected PEER:SPEC with PEER below --peers"
                    )));
                }
            }
        }
        let plan = LocalPlan {
            peers: args.peers,
            task: args.task,
            mode: args.mode,
            codec,
            steps,
            stragglers,
            churn: args.churn,
            non_iid: args.non_iid,
            stop_after: args.stop_after.map(parse_stop_after).transpose()?,
            json: args.json,
            out: args.out.clone(),
            hosts,
            synthetic_step_ms: args.synthetic_step_ms,
            error_feedback: !args.no_error_feedback,
            clip: args.clip,
            faults,
            overrides: args
                .set
                .iter()
                .map(|text| Override::parse(text))
                .chain(
                    args.set_peer
                        .iter()
                        .map(|text| Override::parse_for_peer(text, args.peers)),
                )
                .collect::<Result<_, _>>()?,
        };
        super::swarm_dir::check_overrides(&plan)?;
        Ok(plan)
    }

    /// The test-only fault of peer `peer`, if it has one.
    pub(crate) fn fault(&self, peer: usize) -> Option<&str> {
        self.faults
            .iter()
            .find(|(p, _)| *p == peer)
            .map(|(_, spec)| spec.as_str())
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

impl LocalArgs {
    /// Every flag at its default but `--peers`, for runs built in code (`bench quality`).
    pub(crate) fn with_peers(peers: usize) -> LocalArgs {
        LocalArgs {
            peers,
            mode: AveragingMode::Sgp,
            codec: "int8:64".into(),
            task: TaskPreset::MarkovGpt,
            steps: None,
            straggler: Vec::new(),
            churn: false,
            churn_every: None,
            non_iid: false,
            stop_after: None,
            json: false,
            out: None,
            hosts: None,
            synthetic_step_ms: 0,
            no_error_feedback: false,
            clip: None,
            set: Vec::new(),
            set_peer: Vec::new(),
            fault: Vec::new(),
        }
    }

    /// `--churn-every`, checked: `None` when not given (the supervisor's default applies).
    pub(crate) fn churn_every(&self) -> Result<Option<(Duration, Duration)>, BadInput> {
        match &self.churn_every {
            None => Ok(None),
            Some(_) if !self.churn => Err(BadInput(
                "--churn-every only applies with --churn; add --churn or drop it".into(),
            )),
            Some(text) => parse_churn_every(text).map(|(min, max)| {
                Some((Duration::from_secs_f64(min), Duration::from_secs_f64(max)))
            }),
        }
    }
}

/// Parses `--churn-every MIN-MAX`, in seconds.
fn parse_churn_every(text: &str) -> Result<(f64, f64), BadInput> {
    let bad = |why: &str| BadInput(format!("--churn-every {text}: {why}"));
    let (min, max) = text
        .split_once('-')
        .ok_or_else(|| bad("expected MIN-MAX in seconds, e.g. 2-5"))?;
    let seconds = |part: &str| {
        part.trim()
            .parse::<f64>()
            .map_err(|_| bad(&format!("{part:?} is not a number of seconds")))
    };
    let (min, max) = (seconds(min)?, seconds(max)?);
    let in_range = min > 0.0 && min <= max && max <= MAX_CHURN_EVERY_S;
    if !in_range {
        return Err(bad(&format!(
            "expected 0 < MIN <= MAX <= {MAX_CHURN_EVERY_S} seconds"
        )));
    }
    Ok((min, max))
}

/// Parses `PEER:FACTOR` for a swarm of `peers`.
/// A `--task` value: a built-in task by its name.
fn parse_task(text: &str) -> Result<TaskPreset, String> {
    TaskPreset::ALL
        .into_iter()
        .find(|t| t.name() == text)
        .ok_or_else(|| {
            let names: Vec<&str> = TaskPreset::ALL.iter().map(|t| t.name()).collect();
            format!("unknown task {text:?}: expected {}", names.join(" or "))
        })
}

/// `--stop-after SECONDS`: more than 0 and at most a day.
fn parse_stop_after(seconds: f64) -> Result<Duration, BadInput> {
    if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_STOP_AFTER_S {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(BadInput(format!(
            "--stop-after {seconds}: expected seconds above 0, at most {MAX_STOP_AFTER_S}"
        )))
    }
}

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
        LocalArgs::with_peers(4)
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

        let mut a = args();
        a.churn_every = Some("2-5".into());
        assert!(error(&a).starts_with("--churn-every"));

        let mut a = args();
        a.synthetic_step_ms = MAX_SYNTHETIC_STEP_MS + 1;
        assert!(error(&a).starts_with("--synthetic-step-ms 60001"));
    }

    #[test]
    fn churn_intervals_are_parsed_in_seconds() {
        let mut a = args();
        a.churn = true;
        assert_eq!(a.churn_every().unwrap(), None);
        a.churn_every = Some("2-5".into());
        LocalPlan::from_args(&a).unwrap();
        assert_eq!(
            a.churn_every().unwrap(),
            Some((Duration::from_secs(2), Duration::from_secs(5)))
        );
        a.churn_every = Some("0.5 - 0.5".into());
        assert_eq!(
            a.churn_every().unwrap(),
            Some((Duration::from_millis(500), Duration::from_millis(500)))
        );
        for bad in ["5", "5-2", "0-2", "-1-2", "x-2", "2-NaN", "1-inf", "1-4000"] {
            a.churn_every = Some(bad.into());
            let e = error(&a);
            assert!(e.starts_with(&format!("--churn-every {bad}")), "{bad}: {e}");
        }
    }

    #[test]
    fn a_hosts_file_must_name_every_peer() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("hosts.toml");
        std::fs::write(&path, "[[peer]]\nlisten_ip = \"10.0.0.2\"\n").unwrap();
        let mut a = args();
        a.hosts = Some(path.clone());
        let e = error(&a);
        assert!(e.starts_with("--hosts") && e.contains("4 peers"), "{e}");

        a.peers = 1;
        let plan = LocalPlan::from_args(&a).unwrap();
        assert_eq!(plan.hosts.listen_ip(0).to_string(), "10.0.0.2");
        assert_eq!(
            LocalPlan::from_args(&args()).unwrap().hosts,
            Hosts::loopback(4)
        );
    }

    #[test]
    fn every_mode_is_taken_by_its_config_name() {
        for mode in AveragingMode::ALL {
            assert_eq!(crate::cli::parse_mode(mode.name()), Ok(mode));
        }
        assert_eq!(crate::cli::parse_mode("ring"), Ok(AveragingMode::SyncRing));
        assert!(crate::cli::parse_mode("gossip").is_err());
    }
}
