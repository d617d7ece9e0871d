//! The conditions `murmur bench quality` measures the modes under, besides IID data:
//!
//! - **non-iid**: each peer draws from its own part of the data. The quality task's chain
//!   gets one community per peer (`data.source.communities`) and each peer its own data
//!   shard (`murmur local --non-iid`), so a peer's sequences stay (almost) within its own
//!   community while the eval set covers all of them. Gap closure as in the IID table,
//!   against a control and a ring trained on the same data.
//! - **straggler**: peer 1 takes 4× as long per step (peer 0 bootstraps the others, so it is
//!   never the one slowed). Every run stops at the wall time an unslowed run needs for its
//!   steps (`murmur local --stop-after`), and each peer reports the eval loss of its model
//!   as it stands then:
//!   asynchronous SGP keeps the fast peers stepping, the synchronous ring waits for the
//!   straggler at every step.
//! - **churn**: one peer other than peer 0 killed with `kill -9` every 5 to 10 s and
//!   restarted 2 s later (`murmur local --churn`). Its final loss is compared with the same
//!   mode's churn-free (IID) runs.

use std::time::Duration;

use murmur_protocol::message::AveragingMode;

use crate::input_error::BadInput;
use crate::local::LocalArgs;

/// A condition the matrix runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scenario {
    Iid,
    NonIid,
    Straggler,
    Churn,
}

/// The slowed-down peer of the straggler scenario, and its slowdown.
pub(crate) const STRAGGLER: (usize, f64) = (1, 4.0);

/// The modes the straggler scenario compares.
pub(crate) const STRAGGLER_MODES: [(AveragingMode, &str); 2] = [
    (AveragingMode::Sgp, "int8:64"),
    (AveragingMode::SyncRing, "f32"),
];

/// The mode the churn scenario runs (and its churn-free reference in the IID matrix).
pub(crate) const CHURN_MODES: [(AveragingMode, &str); 1] = [(AveragingMode::Sgp, "int8:64")];

impl Scenario {
    /// Every scenario, in the order they run.
    pub(crate) const ALL: [Scenario; 4] = [
        Scenario::Iid,
        Scenario::NonIid,
        Scenario::Straggler,
        Scenario::Churn,
    ];

    /// Its name on the command line, in the JSON and the CSVs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Iid => "iid",
            Scenario::NonIid => "non-iid",
            Scenario::Straggler => "straggler",
            Scenario::Churn => "churn",
        }
    }

    /// `--scenarios`: comma-separated names, each at most once, run in [`Scenario::ALL`]'s
    /// order. Churn needs its churn-free reference, so it brings the IID runs of its mode.
    pub(crate) fn parse_list(text: &str) -> Result<Vec<Scenario>, BadInput> {
        let mut chosen = Vec::new();
        for name in text.split(',').map(str::trim) {
            let scenario = Scenario::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .ok_or_else(|| {
                    BadInput(format!(
                        "--scenarios {text}: unknown scenario `{name}`; expected some of iid, \
                         non-iid, straggler, churn"
                    ))
                })?;
            if chosen.contains(&scenario) {
                return Err(BadInput(format!(
                    "--scenarios {text}: `{name}` is given twice"
                )));
            }
            chosen.push(scenario);
        }
        chosen.sort();
        Ok(chosen)
    }

    /// Sets what the scenario changes in one run's `murmur local` flags.
    pub(crate) fn apply(self, local: &mut LocalArgs, step_ms: u64, steps: u64) {
        match self {
            Scenario::Iid => {}
            Scenario::NonIid => {
                local.non_iid = true;
                local
                    .set
                    .push(format!("data.source.communities={}", local.peers));
            }
            Scenario::Straggler => {
                let (peer, factor) = STRAGGLER;
                local.straggler.push(format!("{peer}:{factor}"));
                local.stop_after = Some(straggler_deadline(step_ms, steps).as_secs_f64());
            }
            Scenario::Churn => local.churn = true,
        }
    }
}

/// When the straggler scenario's runs stop: the time its steps take at full speed, plus
/// the few seconds a swarm needs to start (keys, listening, meeting its peers).
pub(crate) fn straggler_deadline(step_ms: u64, steps: u64) -> Duration {
    Duration::from_millis(step_ms.saturating_mul(steps)) + STARTUP_ALLOWANCE
}

/// Start-up time a local swarm needs before its peers step.
const STARTUP_ALLOWANCE: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse_in_their_order_and_refuse_unknown_or_repeated_names() {
        assert_eq!(
            Scenario::parse_list("churn, iid").unwrap(),
            vec![Scenario::Iid, Scenario::Churn]
        );
        assert_eq!(
            Scenario::parse_list("iid,non-iid,straggler,churn").unwrap(),
            Scenario::ALL.to_vec()
        );
        for bad in ["", "iid,iid", "noniid", "iid,"] {
            let e = Scenario::parse_list(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--scenarios {bad}:")), "{e}");
        }
    }

    #[test]
    fn each_scenario_sets_its_flags() {
        let args = || LocalArgs::with_peers(4);
        let mut local = args();
        Scenario::NonIid.apply(&mut local, 100, 400);
        assert!(local.non_iid);
        assert_eq!(local.set, vec!["data.source.communities=4".to_owned()]);
        let mut local = args();
        Scenario::Straggler.apply(&mut local, 100, 400);
        assert_eq!(local.straggler, vec!["1:4".to_owned()]);
        assert_eq!(local.stop_after, Some(45.0));
        let mut local = args();
        Scenario::Churn.apply(&mut local, 100, 400);
        assert!(local.churn && local.stop_after.is_none() && !local.non_iid);
    }
}
