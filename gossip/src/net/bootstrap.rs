//! What became of each dial to a bootstrap address (`net.bootstrap`), for the log and for
//! `/status`.
//!
//! A peer whose bootstrap address is wrong or unreachable would otherwise train alone
//! forever with no word said about why. Every dial to a configured address is followed
//! to its end: the first failure of an address, and every later one whose count of
//! failures in a row is a power of two, is logged at warn with the address and the
//! transport's reason (the rest at debug, so that redials while the peer is alone do not
//! flood the log); the first connection after failures is logged at info. The last result
//! of every address is kept for [`crate::net::NetHandle::bootstrap_dials`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use libp2p::Multiaddr;
use libp2p::swarm::ConnectionId;

/// The last result of the dials to one bootstrap address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapDial {
    /// The address, as configured.
    pub address: String,
    /// Dials made to it.
    pub attempts: u64,
    /// Dials that failed in a row, up to the last one (0 after a connection).
    pub failures_in_a_row: u64,
    /// What the last finished dial gave; `None` while the first is under way.
    pub last: Option<DialResult>,
    /// When the last dial finished, in seconds since the Unix epoch.
    pub last_at_unix_s: u64,
}

/// How a dial ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialResult {
    /// Connected to this peer (its invite is checked next).
    Connected {
        /// The peer at the address.
        peer: String,
    },
    /// The dial failed.
    Failed {
        /// The transport's reason.
        reason: String,
    },
}

/// The bootstrap addresses' dials: written by the network task, read through handles.
#[derive(Debug)]
pub(crate) struct BootstrapDials {
    addresses: Vec<Multiaddr>,
    /// Dials under way to a configured address: the address's index.
    pending: HashMap<ConnectionId, usize>,
    shared: Arc<Mutex<Vec<BootstrapDial>>>,
}

impl BootstrapDials {
    pub(crate) fn new(addresses: &[Multiaddr]) -> BootstrapDials {
        let dials = addresses
            .iter()
            .map(|address| BootstrapDial {
                address: address.to_string(),
                attempts: 0,
                failures_in_a_row: 0,
                last: None,
                last_at_unix_s: 0,
            })
            .collect();
        BootstrapDials {
            addresses: addresses.to_vec(),
            pending: HashMap::new(),
            shared: Arc::new(Mutex::new(dials)),
        }
    }

    /// What the handles read.
    pub(crate) fn shared(&self) -> Arc<Mutex<Vec<BootstrapDial>>> {
        Arc::clone(&self.shared)
    }

    /// Whether `address` is one of the bootstrap addresses.
    pub(crate) fn is_bootstrap(&self, address: &Multiaddr) -> bool {
        self.addresses.contains(address)
    }

    /// A dial to `address` started as `connection`; followed if `address` is a bootstrap
    /// address.
    pub(crate) fn dialing(&mut self, connection: ConnectionId, address: &Multiaddr) {
        let Some(index) = self.addresses.iter().position(|a| a == address) else {
            return;
        };
        self.pending.insert(connection, index);
        self.update(index, |dial| dial.attempts += 1);
    }

    /// `connection` reached `peer`.
    pub(crate) fn connected(&mut self, connection: ConnectionId, peer: &libp2p::PeerId) {
        let Some(index) = self.pending.remove(&connection) else {
            return;
        };
        let address = &self.addresses[index];
        let mut failed_before = 0;
        self.update(index, |dial| {
            failed_before = dial.failures_in_a_row;
            dial.failures_in_a_row = 0;
            dial.last = Some(DialResult::Connected {
                peer: peer.to_string(),
            });
        });
        if failed_before > 0 {
            tracing::info!(%address, %peer, failed_before, "bootstrap address reached");
        } else {
            tracing::debug!(%address, %peer, "bootstrap address reached");
        }
    }

    /// `connection` failed with `reason`.
    pub(crate) fn failed(&mut self, connection: ConnectionId, reason: &str) {
        let Some(index) = self.pending.remove(&connection) else {
            return;
        };
        let address = &self.addresses[index];
        let mut failures = 0;
        self.update(index, |dial| {
            dial.failures_in_a_row += 1;
            failures = dial.failures_in_a_row;
            dial.last = Some(DialResult::Failed {
                reason: reason.to_owned(),
            });
        });
        if failures.is_power_of_two() {
            tracing::warn!(
                %address,
                failures_in_a_row = failures,
                %reason,
                "cannot reach bootstrap address (net.bootstrap): this peer finds the swarm \
                 only through its bootstrap peers"
            );
        } else {
            tracing::debug!(%address, failures_in_a_row = failures, %reason, "bootstrap dial failed");
        }
    }

    fn update(&self, index: usize, change: impl FnOnce(&mut BootstrapDial)) {
        let mut dials = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(dial) = dials.get_mut(index) {
            change(dial);
            dial.last_at_unix_s = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address() -> Multiaddr {
        "/ip4/127.0.0.1/tcp/9".parse().unwrap()
    }

    #[test]
    fn only_dials_to_bootstrap_addresses_are_followed() {
        let mut dials = BootstrapDials::new(&[address()]);
        let other: Multiaddr = "/ip4/127.0.0.1/tcp/10".parse().unwrap();
        dials.dialing(ConnectionId::new_unchecked(1), &other);
        dials.failed(ConnectionId::new_unchecked(1), "refused");
        let shared = dials.shared();
        assert_eq!(shared.lock().unwrap()[0].attempts, 0);
        assert_eq!(shared.lock().unwrap()[0].last, None);
    }

    #[test]
    fn failures_in_a_row_count_until_a_connection() {
        let mut dials = BootstrapDials::new(&[address()]);
        let shared = dials.shared();
        for id in 1..=3 {
            dials.dialing(ConnectionId::new_unchecked(id), &address());
            dials.failed(ConnectionId::new_unchecked(id), "connection refused");
        }
        {
            let dial = &shared.lock().unwrap()[0];
            assert_eq!((dial.attempts, dial.failures_in_a_row), (3, 3));
            assert_eq!(
                dial.last,
                Some(DialResult::Failed {
                    reason: "connection refused".into()
                })
            );
            assert!(dial.last_at_unix_s > 0);
        }
        let peer = libp2p::PeerId::random();
        dials.dialing(ConnectionId::new_unchecked(4), &address());
        dials.connected(ConnectionId::new_unchecked(4), &peer);
        let dial = &shared.lock().unwrap()[0];
        assert_eq!((dial.attempts, dial.failures_in_a_row), (4, 0));
        assert_eq!(
            dial.last,
            Some(DialResult::Connected {
                peer: peer.to_string()
            })
        );
    }
}
