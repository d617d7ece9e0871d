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
    }
    churn.sort_by(|a, b| a.at_ms().total_cmp(&b.at_ms()));
    churn
}
