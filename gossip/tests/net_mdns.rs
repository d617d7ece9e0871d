//! mDNS discovery: with `net.mdns` on, peers on one LAN find and authorize each other with no
//! bootstrap address at all.
//!
//! libp2p's mDNS skips loopback interfaces, so these peers listen on every interface and
//! find each other over the host's own multicast-capable interface (multicast loopback is
//! on, so one host hears its own announcements).

#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use support::{Authority, InviteKind, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_mdns_find_and_authorize_each_other_without_a_bootstrap_address() {
    let authority = Authority::new();
    let mut handles = Vec::new();
    let mut inbounds = Vec::new();
    for seed in 1..=3u8 {
        let (mut config, identity) = authority.config(seed, InviteKind::Valid);
        config.mdns = true;
        config.listen_addrs = vec!["/ip4/0.0.0.0/udp/0/quic-v1".to_owned()];
        let (handle, inbound) = murmur_gossip::net::spawn(&config, identity)
            .await
            .expect("start");
        handles.push(handle);
        inbounds.push(inbound);
    }
    eventually(
        Duration::from_secs(10),
        "every peer is connected to and has authorized the 2 others",
        || {
            let handles = handles.clone();
            async move {
                for handle in &handles {
                    if handle.peers().await.unwrap_or_default().len() < 2 {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    for handle in &handles {
        handle.shutdown().await.expect("shutdown");
    }
}
