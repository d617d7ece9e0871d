//! Who may open a connection: limits per source address and bans with backoff.
//!
//! libp2p's own connection limits count connections of all sources together, so one host
//! that opens sockets and never finishes their handshake fills `net.max_pending_incoming`
//! and locks every invited joiner out until the handshake deadline frees the slots. This
//! module counts per source IP instead:
//!
//! - at most `net.max_pending_incoming_per_ip` incoming connections of one source may be
//!   in their handshake at once; more are closed at once, before any byte of theirs is read;
//! - at most `net.max_incoming_connections_per_ip` established incoming connections of one
//!   source, authorized or not;
//!
//! A source is an IPv4 address, or the /64 network of an IPv6 address: a host is commonly
//! given a whole /64, and counted address by address it could open the limit 2^64 times.
//! - a peer refused for its invite `net.ban_after_refusals` times is banned for
//!   `net.ban_backoff_ms`, doubled on each later refusal up to 64 times that; its connections
//!   (incoming and outgoing) are closed as soon as its key is known, and counted.
//!
//! [`AdmissionTable`] decides (sans-IO: every call takes `now`); [`Admission`] is the thin
//! libp2p behaviour that asks it and tells it what happened.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use libp2p::core::transport::{PortUse, TransportError};
use libp2p::core::{Endpoint, Multiaddr, multiaddr::Protocol};
use libp2p::swarm::{
    ConnectionClosed, ConnectionDenied, ConnectionId, FromSwarm, ListenError, ListenFailure,
    NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm, dummy,
};
use thiserror::Error;

use super::metrics::NetMetrics;

/// A ban lasts at most this many times `net.ban_backoff_ms`.
pub(crate) const MAX_BAN_FACTOR: u32 = 64;
/// No ban lasts longer than this, whatever the config says.
const LONGEST_BAN: Duration = Duration::from_secs(30 * 24 * 3600);
/// Peers whose refusals are remembered; past this the record whose ban ends first (or that
/// has none) is forgotten, so a flood of fresh keys cannot grow the table.
const MAX_REFUSAL_RECORDS: usize = 4096;

/// The limits [`AdmissionTable`] keeps, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdmissionLimits {
    /// `net.max_pending_incoming_per_ip`.
    pub(crate) pending_per_ip: u32,
    /// `net.max_incoming_connections_per_ip`.
    pub(crate) established_per_ip: u32,
    /// `net.ban_after_refusals`.
    pub(crate) ban_after_refusals: u32,
    /// `net.ban_backoff_ms`.
    pub(crate) ban_backoff: Duration,
}

/// Why a connection was not let in.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub(crate) enum AdmissionRefusal {
    /// Its address already has `net.max_pending_incoming_per_ip` handshakes under way.
    #[error(
        "{ip} already has {limit} incoming handshakes under way (net.max_pending_incoming_per_ip)"
    )]
    PendingPerSource {
        /// The source.
        ip: Source,
        /// The limit.
        limit: u32,
    },
    /// Its address already has `net.max_incoming_connections_per_ip` connections.
    #[error("{ip} already has {limit} incoming connections (net.max_incoming_connections_per_ip)")]
    EstablishedPerSource {
        /// The source.
        ip: Source,
        /// The limit.
        limit: u32,
    },
    /// The peer was refused for its invite too often and its ban has not ended.
    #[error("{peer} is banned for {remaining:?} more after repeated invite refusals")]
    Banned {
        /// The banned peer.
        peer: PeerId,
        /// How long its ban still runs.
        remaining: Duration,
    },
}

/// Where incoming connections come from, as the limits count them: an IPv4 address, or
/// the /64 network of an IPv6 address (an IPv4-mapped IPv6 address counts as its IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Source(IpAddr);

impl Source {
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(_) => Source(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source(IpAddr::V4(v4)),
                None => Source(IpAddr::V6(Ipv6Addr::from(
                    u128::from(v6) & !u128::from(u64::MAX),
                ))),
            },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(ip) => write!(f, "{ip}"),
            IpAddr::V6(net) => write!(f, "{net}/64"),
        }
    }
}

/// How often one peer was refused for its invite, and until when it is banned.
#[derive(Debug, Clone, Copy)]
struct RefusalRecord {
    refusals: u32,
    banned_until: Option<Instant>,
}

/// Counts per source address and refusals per peer; decides who gets in.
#[derive(Debug)]
pub(crate) struct AdmissionTable {
    limits: AdmissionLimits,
    pending: HashMap<ConnectionId, Source>,
    established: HashMap<ConnectionId, Source>,
    pending_per_ip: HashMap<Source, u32>,
    established_per_ip: HashMap<Source, u32>,
    refusals: HashMap<PeerId, RefusalRecord>,
}

impl AdmissionTable {
    pub(crate) fn new(limits: AdmissionLimits) -> AdmissionTable {
        AdmissionTable {
            limits,
            pending: HashMap::new(),
            established: HashMap::new(),
            pending_per_ip: HashMap::new(),
            established_per_ip: HashMap::new(),
            refusals: HashMap::new(),
        }
    }

    /// A new incoming handshake from `ip`: let in (and counted) or refused.
    pub(crate) fn pending_incoming(
        &mut self,
        connection: ConnectionId,
        ip: IpAddr,
    ) -> Result<(), AdmissionRefusal> {
        let ip = Source::of(ip);
        let count = self.pending_per_ip.entry(ip).or_insert(0);
        if *count >= self.limits.pending_per_ip {
            return Err(AdmissionRefusal::PendingPerSource {
                ip,
                limit: self.limits.pending_per_ip,
            });
        }
        *count += 1;
        self.pending.insert(connection, ip);
        Ok(())
    }

    /// An incoming handshake finished with `peer`: it leaves the pending count, and is let
    /// in (and counted per address) unless its address is full or the peer is banned.
    pub(crate) fn established_incoming(
        &mut self,
        connection: ConnectionId,
        peer: PeerId,
        ip: Option<IpAddr>,
        now: Instant,
    ) -> Result<(), AdmissionRefusal> {
        self.end_pending(connection);
        self.check_ban(peer, now)?;
        let Some(ip) = ip.map(Source::of) else {
            return Ok(());
        };
        let count = self.established_per_ip.entry(ip).or_insert(0);
        if *count >= self.limits.established_per_ip {
            return Err(AdmissionRefusal::EstablishedPerSource {
                ip,
                limit: self.limits.established_per_ip,
            });
        }
        *count += 1;
        self.established.insert(connection, ip);
        Ok(())
    }

    /// Refuses `peer` if it is banned now.
    pub(crate) fn check_ban(&self, peer: PeerId, now: Instant) -> Result<(), AdmissionRefusal> {
        match self.refusals.get(&peer).and_then(|r| r.banned_until) {
            Some(until) if until > now => Err(AdmissionRefusal::Banned {
                peer,
                remaining: until - now,
            }),
            _ => Ok(()),
        }
    }

    /// The connection ended (closed, failed or denied): it leaves every count.
    pub(crate) fn connection_gone(&mut self, connection: ConnectionId) {
        self.end_pending(connection);
        if let Some(ip) = self.established.remove(&connection) {
            decrement(&mut self.established_per_ip, ip);
        }
    }

    /// `peer` was refused for its invite. Returns the ban it now serves, if this refusal
    /// started one: the `net.ban_after_refusals`-th refusal bans it for `net.ban_backoff_ms`,
    /// each later one for twice the one before, at most [`MAX_BAN_FACTOR`] times the first.
    pub(crate) fn refused_for_invite(&mut self, peer: PeerId, now: Instant) -> Option<Duration> {
        if !self.refusals.contains_key(&peer) && self.refusals.len() >= MAX_REFUSAL_RECORDS {
            self.forget_one(now);
        }
        let record = self.refusals.entry(peer).or_insert(RefusalRecord {
            refusals: 0,
            banned_until: None,
        });
        record.refusals = record.refusals.saturating_add(1);
        let over = record
            .refusals
            .checked_sub(self.limits.ban_after_refusals)?;
        let factor = 1u32
            .checked_shl(over)
            .unwrap_or(MAX_BAN_FACTOR)
            .min(MAX_BAN_FACTOR);
        let ban = self
            .limits
            .ban_backoff
            .saturating_mul(factor)
            .min(LONGEST_BAN);
        record.banned_until = Some(now + ban);
        Some(ban)
    }

    /// Handshakes from `ip` under way now.
    #[cfg(test)]
    pub(crate) fn pending_from(&self, ip: IpAddr) -> u32 {
        self.pending_per_ip
            .get(&Source::of(ip))
            .copied()
            .unwrap_or(0)
    }

    fn end_pending(&mut self, connection: ConnectionId) {
        if let Some(ip) = self.pending.remove(&connection) {
            decrement(&mut self.pending_per_ip, ip);
        }
    }

    /// Drops the record least worth keeping: one without a ban running, else the one whose
    /// ban ends first.
    fn forget_one(&mut self, now: Instant) {
        let victim = self
            .refusals
            .iter()
            .min_by_key(|(_, r)| r.banned_until.filter(|u| *u > now))
            .map(|(peer, _)| *peer);
        if let Some(peer) = victim {
            self.refusals.remove(&peer);
        }
    }
}

fn decrement(counts: &mut HashMap<Source, u32>, ip: Source) {
    if let Some(count) = counts.get_mut(&ip) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(&ip);
        }
    }
}

/// The IP address a multiaddr starts with, if any.
pub(crate) fn source_ip(addr: &Multiaddr) -> Option<IpAddr> {
    match addr.iter().next()? {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    }
}

/// Counts an incoming connection that failed before it was established: over a limit of
/// all sources together, or past the handshake deadline. (Refusals per source and bans are
/// counted where [`Admission`] makes them.)
pub(crate) fn count_incoming_failure(metrics: &NetMetrics, error: &ListenError) {
    match error {
        ListenError::Denied { cause }
            if cause
                .downcast_ref::<libp2p_connection_limits::Exceeded>()
                .is_some() =>
        {
            metrics.connection_refused_limit();
        }
        ListenError::Transport(TransportError::Other(e)) if is_timeout(e) => {
            metrics.handshake_timeout();
        }
        _ => {}
    }
}

/// Whether a transport error is a handshake deadline: libp2p's upgrade timeout (which says
/// so only in its message) or QUIC's handshake timeout, anywhere in the chain of sources.
fn is_timeout(error: &std::io::Error) -> bool {
    if error.kind() == std::io::ErrorKind::TimedOut {
        return true;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    // Bounded: error chains are a handful of links deep.
    for _ in 0..16 {
        let Some(e) = next else {
            return false;
        };
        if matches!(
            e.downcast_ref::<libp2p::quic::Error>(),
            Some(libp2p::quic::Error::HandshakeTimedOut)
        ) || e.to_string() == "Timeout has been reached"
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The libp2p behaviour over an [`AdmissionTable`]; it opens no streams of its own.
pub(crate) struct Admission {
    table: AdmissionTable,
    metrics: Arc<NetMetrics>,
}

impl Admission {
    pub(crate) fn new(limits: AdmissionLimits, metrics: Arc<NetMetrics>) -> Admission {
        Admission {
            table: AdmissionTable::new(limits),
            metrics,
        }
    }

    /// `peer` was refused for its invite; see [`AdmissionTable::refused_for_invite`].
    pub(crate) fn refused_for_invite(&mut self, peer: PeerId) -> Option<Duration> {
        let ban = self.table.refused_for_invite(peer, Instant::now());
        if ban.is_some() {
            self.metrics.peer_banned();
        }
        ban
    }

    fn deny(&self, refusal: AdmissionRefusal) -> ConnectionDenied {
        match refusal {
            AdmissionRefusal::PendingPerSource { .. } => {
                self.metrics.connection_refused_pending_per_ip();
            }
            AdmissionRefusal::EstablishedPerSource { .. } => {
                self.metrics.connection_refused_per_ip();
            }
            AdmissionRefusal::Banned { .. } => self.metrics.connection_refused_banned(),
        }
        tracing::debug!(reason = %refusal, "connection refused");
        ConnectionDenied::new(refusal)
    }
}

impl NetworkBehaviour for Admission {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        _local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        let Some(ip) = source_ip(remote_addr) else {
            return Ok(());
        };
        self.table
            .pending_incoming(connection_id, ip)
            .map_err(|r| self.deny(r))
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        _local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.table
            .established_incoming(connection_id, peer, source_ip(remote_addr), Instant::now())
            .map_err(|r| self.deny(r))?;
        Ok(dummy::ConnectionHandler)
    }

    fn handle_pending_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        maybe_peer: Option<PeerId>,
        _addresses: &[Multiaddr],
        _effective_role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        if let Some(peer) = maybe_peer {
            self.table
                .check_ban(peer, Instant::now())
                .map_err(|r| self.deny(r))?;
        }
        Ok(Vec::new())
    }

    fn handle_established_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        peer: PeerId,
        _addr: &Multiaddr,
        _role_override: Endpoint,
        _port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.table
            .check_ban(peer, Instant::now())
            .map_err(|r| self.deny(r))?;
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm<'_>) {
        match event {
            FromSwarm::ConnectionClosed(ConnectionClosed { connection_id, .. })
            | FromSwarm::ListenFailure(ListenFailure { connection_id, .. }) => {
                self.table.connection_gone(connection_id);
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _peer: PeerId,
        _connection: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        libp2p::core::util::unreachable(event)
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
