//! The churn schedule of a run: the scenario's explicit events plus its random ones.

use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;

use super::scenario::{ChurnEvent, Scenario};

/// The scenario's explicit churn plus its random churn, drawn from `rng`.
pub(crate) fn expand_churn(scenario: &Scenario, rng: &mut Xoshiro256PlusPlus) -> Vec<ChurnEvent> {
    let mut churn = scenario.churn.clone();
    if let Some(random) = &scenario.random_churn {
        let when = |rng: &mut Xoshiro256PlusPlus| {
            if random.to_ms > random.from_ms {
                rng.random_range(random.from_ms..random.to_ms)
            } else {
                random.from_ms
            }
        };
        // Distinct victims: a partial Fisher–Yates shuffle of the founders.
        let mut founders: Vec<u32> = (0..scenario.peers as u32).collect();
        let victims = random.leaves + random.crashes;
        for i in 0..victims {
            let j = rng.random_range(i..founders.len());
            founders.swap(i, j);
        }
        for (i, &peer) in founders[..victims].iter().enumerate() {
            let at_ms = when(rng);
            churn.push(if i < random.leaves {
                ChurnEvent::Leave { at_ms, peer }
            } else {
                ChurnEvent::Crash { at_ms, peer }
            });
        }
        for _ in 0..random.joins {
            let at_ms = when(rng);
            churn.push(ChurnEvent::Join { at_ms });
        }
        // Restarts come last, so that adding them leaves the other draws of a seed as they
        // were. `validate` keeps at least one founder that neither leaves nor crashes.
        let stayers = &founders[victims..];
        if !stayers.is_empty() {
            for _ in 0..random.restarts {
                let at_ms = when(rng);
                let peer = stayers[rng.random_range(0..stayers.len())];
                churn.push(ChurnEvent::Restart { at_ms, peer });
            }
        }
    }
    churn.sort_by(|a, b| a.at_ms().total_cmp(&b.at_ms()));
    churn
}
