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

/// The template with `[swarm] id` and `authority` set.
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
    }
}
