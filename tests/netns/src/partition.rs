//! Which traffic a network partition cuts: pure arithmetic over peer indices, which
//! [`crate::Harness::partition`] turns into blackhole rules in the router namespace.
//!
//! A partition is a list of groups of peers. Traffic between two peers of different groups
//! is dropped silently, both ways, as a cut cable or a failed route drops it: no ICMP error
//! tells the sender, so a transport finds out only by its own timeouts. Traffic within a
//! group, and to or from a peer in no group, passes as before.

use crate::HarnessError;

/// One direction of a cut: packets from peer `from` to peer `to` are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cut {
    /// The sending peer.
    pub(crate) from: usize,
    /// The receiving peer.
    pub(crate) to: usize,
}

/// The directed cuts of partitioning `peer_count` peers into `groups`, in a fixed order.
///
/// Fails when a group names a peer the network does not have, or a peer appears twice.
pub(crate) fn cuts(groups: &[&[usize]], peer_count: usize) -> Result<Vec<Cut>, HarnessError> {
    let mut group_of = vec![None; peer_count];
    for (index, group) in groups.iter().enumerate() {
        for &peer in *group {
            let slot = group_of
                .get_mut(peer)
                .ok_or_else(|| HarnessError::InvalidPartition {
                    reason: format!(
                        "group {index} names peer {peer}, but the network has peers 0 to {}",
                        peer_count.saturating_sub(1)
                    ),
                })?;
            if let Some(earlier) = slot.replace(index) {
                return Err(HarnessError::InvalidPartition {
                    reason: format!(
                        "peer {peer} is in group {earlier} and group {index}; \
                         give each peer to one group"
                    ),
                });
            }
        }
    }
    let mut cuts = Vec::new();
    for from in 0..peer_count {
        for to in 0..peer_count {
            if let (Some(a), Some(b)) = (group_of[from], group_of[to])
                && a != b
            {
                cuts.push(Cut { from, to });
            }
        }
    }
    Ok(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_cut_every_pair_across_both_ways_and_none_within() {
        let cuts = cuts(&[&[0, 1], &[2, 3]], 4).unwrap();
        assert_eq!(cuts.len(), 8);
        for from in 0..4 {
            for to in 0..4 {
                let across = (from < 2) != (to < 2);
                assert_eq!(cuts.contains(&Cut { from, to }), across, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn a_peer_in_no_group_reaches_everyone() {
        let cuts = cuts(&[&[0], &[1]], 3).unwrap();
        assert_eq!(
            cuts,
            vec![Cut { from: 0, to: 1 }, Cut { from: 1, to: 0 }],
            "peer 2 belongs to no group"
        );
        assert!(super::cuts(&[&[0, 1, 2]], 3).unwrap().is_empty());
        assert!(super::cuts(&[], 3).unwrap().is_empty());
    }

    #[test]
    fn unknown_or_repeated_peers_are_refused() {
        let error = cuts(&[&[0], &[4]], 4).unwrap_err().to_string();
        assert!(
            error.contains("peer 4") && error.contains("0 to 3"),
            "{error}"
        );
        let error = cuts(&[&[0, 1], &[1, 2]], 4).unwrap_err().to_string();
        assert!(
            error.contains("peer 1 is in group 0 and group 1"),
            "{error}"
        );
    }
}
