//! [`AveragingMetrics`]: what each averaging round achieved, by mode and outcome.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use murmur_protocol::identity::PeerId;
use murmur_protocol::message::AveragingMode;
use prometheus::{
    Counter, CounterVec, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::ObserveError;
use super::busy::BusyTime;
use super::registry::{named, register};
use super::stragglers::StragglerReading;

/// What became of a push-sum share refused for a stale reference (SGP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Refusal {
    /// This peer refused a share and told its sender.
    Refused,
    /// A share this peer sent was refused, and it took the share back.
    TakenBack,
    /// A share this peer sent was refused too late to take back; its mass is lost.
    Lost,
    /// A share this peer sent was never applied (its connection died first): asked, the
    /// receiver cancelled it, and this peer took it back.
    Cancelled,
}

impl Refusal {
    /// Every kind, in label order.
    pub(crate) const ALL: [Refusal; 4] = [
        Refusal::Refused,
        Refusal::TakenBack,
        Refusal::Lost,
        Refusal::Cancelled,
    ];

    /// The label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::Refused => "refused",
            Refusal::TakenBack => "taken_back",
            Refusal::Lost => "lost",
            Refusal::Cancelled => "cancelled",
        }
    }

    fn index(self) -> usize {
        match self {
            Refusal::Refused => 0,
            Refusal::TakenBack => 1,
            Refusal::Lost => 2,
            Refusal::Cancelled => 3,
        }
    }
}

/// How a round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RoundOutcome {
    /// The whole vector was averaged.
    Complete,
    /// Some parts kept local values (a reducer or sender timed out).
    Partial,
    /// Nothing was averaged.
    Failed,
}

impl RoundOutcome {
    /// Every outcome, in label order.
    pub(crate) const ALL: [RoundOutcome; 3] = [
        RoundOutcome::Complete,
        RoundOutcome::Partial,
        RoundOutcome::Failed,
    ];

    /// The `outcome` label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            RoundOutcome::Complete => "complete",
            RoundOutcome::Partial => "partial",
            RoundOutcome::Failed => "failed",
        }
    }

    fn index(self) -> usize {
        match self {
            RoundOutcome::Complete => 0,
            RoundOutcome::Partial => 1,
            RoundOutcome::Failed => 2,
        }
    }
}

/// The position of `mode` in [`AveragingMode::ALL`], the metrics' array index.
fn mode_index(mode: AveragingMode) -> usize {
    match mode {
        AveragingMode::Sgp => 0,
        AveragingMode::Butterfly => 1,
        AveragingMode::LocalSgd => 2,
        AveragingMode::SyncRing => 3,
        AveragingMode::Solo => 4,
    }
}

const MODES: usize = AveragingMode::ALL.len();
const OUTCOMES: usize = RoundOutcome::ALL.len();

/// What one finished averaging round reports, to the metrics and to the status board.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RoundSummary {
    /// The averaging mode the round ran in.
    pub(crate) mode: AveragingMode,
    /// How it ended.
    pub(crate) outcome: RoundOutcome,
    /// From the round's start until its result was applied.
    pub(crate) duration: Duration,
    /// Fraction of the vector averaged with at least one other peer, in `[0, 1]`.
    pub(crate) coverage: f64,
    /// Peers whose contribution entered the round, this one included.
    pub(crate) group_size: u32,
    /// The peer this one pushed to (SGP), if any.
    pub(crate) out_peer: Option<PeerId>,
    /// Members dropped for not sending in time.
    pub(crate) stragglers_dropped: u32,
    /// Parts whose reducer did not answer in time.
    pub(crate) parts_timed_out: u32,
}

impl RoundSummary {
    /// The coverage clamped to `[0, 1]`; a non-finite value reads as nothing averaged.
    pub(crate) fn clamped_coverage(&self) -> f64 {
        if self.coverage.is_finite() {
            self.coverage.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// The `murmur_averaging_*` metrics. A no-op when made by [`AveragingMetrics::disabled`].
///
/// Every `(mode, outcome)` series is created up front, so dashboards see zeros rather than
/// missing series, and an update indexes an array instead of hashing label values.
#[derive(Debug, Clone)]
pub(crate) struct AveragingMetrics {
    inner: Option<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    rounds: [[IntCounter; OUTCOMES]; MODES],
    durations: [[Histogram; OUTCOMES]; MODES],
    busy_seconds: [Counter; MODES],
    /// The union of the rounds' intervals so far, per mode, in seconds since `origin`.
    busy: Arc<[Mutex<BusyTime>; MODES]>,
    origin: Instant,
    coverage: [Gauge; MODES],
    group_size: [IntGauge; MODES],
    stragglers: [IntCounter; MODES],
    parts_timed_out: [IntCounter; MODES],
    push_sum_weight: Gauge,
    consensus_drift: Gauge,
    feedback_carried: [Gauge; MODES],
    refusals: [IntCounter; 4],
    weights_capped: IntCounter,
    contributions_rejected: IntCounter,
    /// Has no labels: its one series exists only while the ratio is known.
    step_rate_ratio: GaugeVec,
    /// Has no labels: its one series exists once a reading was made (SGP).
    slow_peers: IntGaugeVec,
}

/// Round durations from 5 ms to about 160 s, doubling.
fn duration_buckets() -> Vec<f64> {
    (0..16).map(|k| 0.005 * f64::from(1u32 << k)).collect()
}

impl AveragingMetrics {
    pub(super) fn register(registry: &Registry) -> Result<AveragingMetrics, ObserveError> {
        let by_outcome = ["mode", "outcome"];
        let by_mode = ["mode"];
        let name = "murmur_averaging_rounds_total";
        let rounds = IntCounterVec::new(Opts::new(name, "Averaging rounds finished."), &by_outcome);
        let rounds = named(name, rounds)?;
        let name = "murmur_averaging_round_duration_seconds";
        let opts = HistogramOpts::new(name, "Wall time of one averaging round, start to applied.")
            .buckets(duration_buckets());
        let durations = named(name, HistogramVec::new(opts, &by_outcome))?;
        let name = "murmur_averaging_busy_seconds_total";
        let help = "Wall time during which at least one averaging round or push-sum share \
                    was in flight; overlapping ones count once.";
        let busy_seconds = named(name, CounterVec::new(Opts::new(name, help), &by_mode))?;
        let name = "murmur_averaging_coverage_ratio";
        let help = "Fraction of the vector averaged with at least one other peer, last round.";
        let coverage = named(
            name,
            prometheus::GaugeVec::new(Opts::new(name, help), &by_mode),
        )?;
        let name = "murmur_averaging_group_size";
        let help = "Peers whose contribution entered the last round, this one included.";
        let group_size = named(name, IntGaugeVec::new(Opts::new(name, help), &by_mode))?;
        let name = "murmur_averaging_stragglers_dropped_total";
        let help = "Group members dropped from a round for not sending in time.";
        let stragglers = named(name, IntCounterVec::new(Opts::new(name, help), &by_mode))?;
        let name = "murmur_averaging_parts_timed_out_total";
        let help = "Parts whose reducer did not answer in time; they kept local values.";
        let parts_timed_out = named(name, IntCounterVec::new(Opts::new(name, help), &by_mode))?;
        let name = "murmur_averaging_push_sum_weight";
        let help = "This peer's push-sum weight w (SGP).";
        let push_sum_weight = named(name, Gauge::new(name, help))?;
        let name = "murmur_averaging_consensus_drift";
        let help = "Relative L2 distance between this peer's parameters and the last average \
                    it saw.";
        let consensus_drift = named(name, Gauge::new(name, help))?;
        let name = "murmur_averaging_feedback_carried_ratio";
        let help = "With averaging.error_feedback and a lossy codec, the fraction of what this \
                    peer sent in its last round that the codec lost and error feedback \
                    carries into the next (the residuals' L2 norm over the sent values'); 0 \
                    when nothing is carried.";
        let feedback_carried = named(name, GaugeVec::new(Opts::new(name, help), &by_mode))?;
        let name = "murmur_averaging_share_refusals_total";
        let help = "Push-sum shares refused for a reference the receiver did not hold (SGP): \
                    refused here, or sent from here and taken back or lost.";
        let refusals = named(name, IntCounterVec::new(Opts::new(name, help), &["event"]))?;
        let name = "murmur_averaging_weights_capped_total";
        let help = "Senders whose declared weight this peer's reductions cut to \
                    averaging.butterfly.max_weight_ratio times the median.";
        let weights_capped = named(name, IntCounter::new(name, help))?;
        let name = "murmur_averaging_contributions_rejected_total";
        let help = "Contributions this peer's CenteredClip reductions set aside as outliers, \
                    summed over chunks.";
        let contributions_rejected = named(name, IntCounter::new(name, help))?;
        let name = "murmur_averaging_step_rate_ratio";
        let help = "This peer's step rate over the median step rate of the peers it hears, \
                    from their heartbeat steps over the last 30 s (SGP).";
        let step_rate_ratio = named(name, GaugeVec::new(Opts::new(name, help), &[]))?;
        let name = "murmur_averaging_slow_peers";
        let help = "Peers, this one included, stepping at under half the median step rate \
                    of all of them, from heartbeat steps over the last 30 s (SGP).";
        let slow_peers = named(name, IntGaugeVec::new(Opts::new(name, help), &[]))?;

        let modes = AveragingMode::ALL.map(AveragingMode::name);
        let outcomes = RoundOutcome::ALL.map(RoundOutcome::name);
        let inner = Inner {
            rounds: modes.map(|m| outcomes.map(|o| rounds.with_label_values(&[m, o]))),
            durations: modes.map(|m| outcomes.map(|o| durations.with_label_values(&[m, o]))),
            busy_seconds: modes.map(|m| busy_seconds.with_label_values(&[m])),
            busy: Arc::new(std::array::from_fn(|_| Mutex::new(BusyTime::default()))),
            origin: Instant::now(),
            coverage: modes.map(|m| coverage.with_label_values(&[m])),
            group_size: modes.map(|m| group_size.with_label_values(&[m])),
            stragglers: modes.map(|m| stragglers.with_label_values(&[m])),
            parts_timed_out: modes.map(|m| parts_timed_out.with_label_values(&[m])),
            push_sum_weight,
            consensus_drift,
            feedback_carried: modes.map(|m| feedback_carried.with_label_values(&[m])),
            refusals: Refusal::ALL.map(|r| refusals.with_label_values(&[r.name()])),
            weights_capped,
            contributions_rejected,
            step_rate_ratio,
            slow_peers,
        };
        register(registry, rounds)?;
        register(registry, durations)?;
        register(registry, busy_seconds)?;
        register(registry, coverage)?;
        register(registry, group_size)?;
        register(registry, stragglers)?;
        register(registry, parts_timed_out)?;
        register(registry, inner.push_sum_weight.clone())?;
        register(registry, inner.consensus_drift.clone())?;
        register(registry, feedback_carried)?;
        register(registry, refusals)?;
        register(registry, inner.weights_capped.clone())?;
        register(registry, inner.contributions_rejected.clone())?;
        register(registry, inner.step_rate_ratio.clone())?;
        register(registry, inner.slow_peers.clone())?;
        Ok(AveragingMetrics { inner: Some(inner) })
    }

    pub(super) fn disabled() -> AveragingMetrics {
        AveragingMetrics { inner: None }
    }

    /// One round finished, now.
    pub(crate) fn record_round(&self, round: &RoundSummary) {
        self.record_round_at(round, Instant::now());
    }

    /// One round finished at `at`; it started `round.duration` before.
    pub(crate) fn record_round_at(&self, round: &RoundSummary, at: Instant) {
        let Some(m) = &self.inner else { return };
        let (mode, outcome) = (mode_index(round.mode), round.outcome.index());
        m.rounds[mode][outcome].inc();
        let took = round.duration.as_secs_f64();
        m.durations[mode][outcome].observe(took);
        let end = at.saturating_duration_since(m.origin).as_secs_f64();
        // A round a second: the lock is never contended for long.
        let added = m.busy[mode]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(end, took);
        m.busy_seconds[mode].inc_by(added);
        m.coverage[mode].set(round.clamped_coverage());
        m.group_size[mode].set(i64::from(round.group_size));
        m.stragglers[mode].inc_by(u64::from(round.stragglers_dropped));
        m.parts_timed_out[mode].inc_by(u64::from(round.parts_timed_out));
    }

    /// This peer's push-sum weight after its last push or receive (SGP).
    pub(crate) fn set_push_sum_weight(&self, weight: f64) {
        if let Some(m) = &self.inner {
            m.push_sum_weight.set(weight);
        }
    }

    /// A push-sum share refused for a stale reference, on either side.
    pub(crate) fn count_refusal(&self, refusal: Refusal) {
        if let Some(m) = &self.inner {
            m.refusals[refusal.index()].inc();
        }
    }

    /// What this peer's reductions did against bad contributions in a round: senders whose
    /// declared weight was cut to the bound, and contributions CenteredClip set aside.
    pub(crate) fn count_defences(&self, weights_capped: u64, contributions_rejected: u64) {
        if let Some(m) = &self.inner {
            m.weights_capped.inc_by(weights_capped);
            m.contributions_rejected.inc_by(contributions_rejected);
        }
    }

    /// What the step rates say about stragglers (SGP); `None` removes the series until
    /// there is a reading again.
    pub(crate) fn set_stragglers(&self, reading: Option<StragglerReading>) {
        let Some(m) = &self.inner else { return };
        match reading.and_then(|r| r.ratio) {
            Some(ratio) => m.step_rate_ratio.with_label_values::<&str>(&[]).set(ratio),
            None => {
                let _ = m.step_rate_ratio.remove_label_values::<&str>(&[]);
            }
        }
        match reading {
            Some(r) => m
                .slow_peers
                .with_label_values::<&str>(&[])
                .set(i64::try_from(r.slow_peers).unwrap_or(i64::MAX)),
            None => {
                let _ = m.slow_peers.remove_label_values::<&str>(&[]);
            }
        }
    }

    /// What error feedback carries from this peer's last round of `mode` into its next:
    /// the residuals' norm over the sent values' (`None`: nothing, it is off or the codec
    /// is lossless).
    pub(crate) fn set_feedback_carried(&self, mode: AveragingMode, carried: Option<f64>) {
        if let Some(m) = &self.inner {
            m.feedback_carried[mode_index(mode)].set(carried.unwrap_or(0.0));
        }
    }

    /// The latest estimate of how far this peer's parameters are from the swarm's average.
    pub(crate) fn set_consensus_drift(&self, drift: f64) {
        if let Some(m) = &self.inner {
            m.consensus_drift.set(drift);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        super::super::registry::exposition(registry)
    }

    fn round(mode: AveragingMode, outcome: RoundOutcome, seconds: f64) -> RoundSummary {
        RoundSummary {
            mode,
            outcome,
            duration: Duration::from_secs_f64(seconds),
            coverage: 0.75,
            group_size: 4,
            out_peer: None,
            stragglers_dropped: 1,
            parts_timed_out: 2,
        }
    }

    #[test]
    fn a_round_lands_in_its_own_mode_and_outcome_series_only() {
        let registry = Registry::new();
        let m = AveragingMetrics::register(&registry).expect("registers");
        m.record_round(&round(AveragingMode::Butterfly, RoundOutcome::Partial, 0.3));
        m.record_round(&round(AveragingMode::Butterfly, RoundOutcome::Partial, 0.5));
        let text = text(&registry);
        let expect = [
            r#"murmur_averaging_rounds_total{mode="butterfly",outcome="partial"} 2"#,
            r#"murmur_averaging_rounds_total{mode="butterfly",outcome="complete"} 0"#,
            r#"murmur_averaging_rounds_total{mode="sgp",outcome="partial"} 0"#,
            r#"murmur_averaging_round_duration_seconds_count{mode="butterfly",outcome="partial"} 2"#,
            r#"murmur_averaging_round_duration_seconds_sum{mode="butterfly",outcome="partial"} 0.8"#,
            r#"murmur_averaging_round_duration_seconds_bucket{mode="butterfly",outcome="partial",le="0.32"} 1"#,
            r#"murmur_averaging_coverage_ratio{mode="butterfly"} 0.75"#,
            r#"murmur_averaging_group_size{mode="butterfly"} 4"#,
            r#"murmur_averaging_stragglers_dropped_total{mode="butterfly"} 2"#,
            r#"murmur_averaging_parts_timed_out_total{mode="butterfly"} 4"#,
            r#"murmur_averaging_stragglers_dropped_total{mode="local-sgd"} 0"#,
        ];
        for line in expect {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    /// The value of the one sample of `name` (with its labels, as written) in `text`.
    fn value(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn overlapping_sgp_shares_never_make_averaging_time_outrun_the_clock() {
        let registry = Registry::new();
        let m = AveragingMetrics::register(&registry).expect("registers");
        let start = Instant::now();
        // An upload-capped SGP peer: a share every second, each taking 3 s in its queue.
        for k in 3..=12 {
            let share = round(AveragingMode::Sgp, RoundOutcome::Complete, 3.0);
            m.record_round_at(&share, start + Duration::from_secs(k));
        }
        let page = text(&registry);
        let summed = value(
            &page,
            r#"murmur_averaging_round_duration_seconds_sum{mode="sgp",outcome="complete"}"#,
        );
        assert_eq!(summed, Some(30.0), "the durations themselves are kept");
        let busy = value(&page, r#"murmur_averaging_busy_seconds_total{mode="sgp"}"#);
        assert!(
            busy.is_some_and(|b| (b - 12.0).abs() < 1e-6),
            "busy from 0 s to 12 s, no more than the 12 s that passed: {busy:?}\n{page}"
        );
        // Sequential rounds (butterfly) count their whole durations.
        for k in 1..=3 {
            let r = round(AveragingMode::Butterfly, RoundOutcome::Complete, 0.5);
            m.record_round_at(&r, start + Duration::from_secs(k));
        }
        let page = text(&registry);
        let busy = value(
            &page,
            r#"murmur_averaging_busy_seconds_total{mode="butterfly"}"#,
        );
        assert!(busy.is_some_and(|b| (b - 1.5).abs() < 1e-6), "{busy:?}");
    }

    #[test]
    fn straggler_gauges_exist_only_while_there_is_a_reading() {
        let registry = Registry::new();
        let m = AveragingMetrics::register(&registry).expect("registers");
        assert!(!text(&registry).contains("murmur_averaging_step_rate_ratio "));
        m.set_stragglers(Some(StragglerReading {
            ratio: Some(0.25),
            slow_peers: 1,
        }));
        let text_now = text(&registry);
        assert_eq!(
            value(&text_now, "murmur_averaging_step_rate_ratio"),
            Some(0.25)
        );
        assert_eq!(value(&text_now, "murmur_averaging_slow_peers"), Some(1.0));
        m.set_stragglers(Some(StragglerReading {
            ratio: None,
            slow_peers: 0,
        }));
        let text_now = text(&registry);
        assert_eq!(value(&text_now, "murmur_averaging_step_rate_ratio"), None);
        assert_eq!(value(&text_now, "murmur_averaging_slow_peers"), Some(0.0));
        m.set_stragglers(None);
        let text_now = text(&registry);
        assert_eq!(value(&text_now, "murmur_averaging_slow_peers"), None);
    }

    #[test]
    fn coverage_outside_zero_to_one_is_clamped() {
        let mut r = round(AveragingMode::Sgp, RoundOutcome::Complete, 0.1);
        r.coverage = 1.5;
        assert_eq!(r.clamped_coverage(), 1.0);
        r.coverage = f64::NAN;
        assert_eq!(r.clamped_coverage(), 0.0);
        r.coverage = -0.5;
        assert_eq!(r.clamped_coverage(), 0.0);
    }

    #[test]
    fn gauges_for_push_sum_and_drift_are_set() {
        let registry = Registry::new();
        let m = AveragingMetrics::register(&registry).expect("registers");
        m.set_push_sum_weight(0.125);
        m.set_consensus_drift(0.03);
        m.set_feedback_carried(AveragingMode::Butterfly, Some(0.004));
        m.set_feedback_carried(AveragingMode::SyncRing, None);
        m.count_refusal(Refusal::TakenBack);
        m.count_refusal(Refusal::TakenBack);
        m.count_refusal(Refusal::Lost);
        let text = text(&registry);
        for (event, count) in [
            ("refused", 0),
            ("taken_back", 2),
            ("lost", 1),
            ("cancelled", 0),
        ] {
            let line =
                format!("murmur_averaging_share_refusals_total{{event=\"{event}\"}} {count}\n");
            assert!(text.contains(&line), "{line}{text}");
        }
        assert!(
            text.contains("murmur_averaging_push_sum_weight 0.125\n"),
            "{text}"
        );
        assert!(
            text.contains("murmur_averaging_consensus_drift 0.03\n"),
            "{text}"
        );
        for (mode, carried) in [("butterfly", "0.004"), ("sync-ring", "0"), ("sgp", "0")] {
            let line =
                format!("murmur_averaging_feedback_carried_ratio{{mode=\"{mode}\"}} {carried}\n");
            assert!(text.contains(&line), "{line}{text}");
        }
    }
}
