//! The commented config every new swarm and peer starts from: `examples/swarm.toml`,
//! compiled in, so `murmur init`, `murmur swarm new` and the example never differ.

use murmur_protocol::identity::{PeerId, SwarmId};

/// `examples/swarm.toml`: every key, commented, at its default.
pub(crate) const TEMPLATE: &str = include_str!("../../../examples/swarm.toml");

/// The `[swarm] id` line of the template.
const ID_LINE: &str = "id = \"demo-swarm\"\n";
/// The `[swarm] authority` line of the template (a placeholder whose secret is unknown).
const AUTHORITY_LINE: &str =
    "authority = \"12D3KooWKMPKDb9vXN7kWtpG9q5RoKya3w6P6BtnbTtSUFxcdFPR\"\n";

/// The commented-out `[metrics] listen` line of the template.
const METRICS_LINE: &str = "# listen = \"127.0.0.1:9464\"\n";

/// What `murmur init` writes: the template with the metrics endpoint on loopback, where
/// `murmur status` looks for it by default, so a new volunteer can watch the peer at once.
pub(crate) fn for_init() -> String {
    TEMPLATE.replacen(METRICS_LINE, "listen = \"127.0.0.1:9464\"\n", 1)
}

/// What `murmur swarm new` writes as the swarm's config: [`for_init`]'s, with `[swarm] id`
/// and `authority` set.
pub(crate) fn for_swarm(swarm: &SwarmId, authority: &PeerId) -> String {
    for_init()
        .replacen(ID_LINE, &format!("id = \"{swarm}\"\n"), 1)
        .replacen(AUTHORITY_LINE, &format!("authority = \"{authority}\"\n"), 1)
}

/// The template with `[swarm] id` and `authority` set.
#[cfg(test)]
pub(crate) fn with_swarm(swarm: &SwarmId, authority: &PeerId) -> String {
    TEMPLATE
        .replacen(ID_LINE, &format!("id = \"{swarm}\"\n"), 1)
        .replacen(AUTHORITY_LINE, &format!("authority = \"{authority}\"\n"), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_swarm_lines_appear_once_so_filling_them_in_is_unambiguous() {
        assert_eq!(TEMPLATE.matches(ID_LINE).count(), 1);
        assert_eq!(TEMPLATE.matches(AUTHORITY_LINE).count(), 1);
        assert_eq!(TEMPLATE.matches(METRICS_LINE).count(), 1);
    }

    #[test]
    fn init_turns_the_metrics_endpoint_on_at_the_address_status_reads() {
        let text = for_init();
        assert!(
            text.contains(&format!(
                "\nlisten = \"127.0.0.1:{}\"\n",
                crate::observe::DEFAULT_PORT
            )),
            "{text}"
        );
        assert_eq!(text.lines().count(), TEMPLATE.lines().count());
    }
}
