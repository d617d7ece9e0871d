//! Discovery: peers that know one bootstrap address find the whole swarm through the DHT.

#[path = "net_support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use support::{Authority, InviteKind, address_of, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_peers_find_each_other_from_one_bootstrap_address_within_10_s() {
    let authority = Authority::new();
    let (bootstrap, _bootstrap_inbound) = authority.spawn(1, InviteKind::Valid).await;
    let bootstrap_addr = address_of(&bootstrap).await;

    let mut handles = vec![bootstrap];
    let mut inbounds = Vec::new();
    let start = Instant::now();
    for seed in 2..=8u8 {
        let (mut config, identity) = authority.config(seed, InviteKind::Valid);
        config.bootstrap = vec![bootstrap_addr.clone()];
        let (handle, inbound) = murmur_gossip::net::spawn(&config, identity)
            .await
            .expect("network starts");
        handles.push(handle);
        inbounds.push(inbound);
    }
    let everyone: HashSet<_> = handles.iter().map(|h| h.local_peer_id()).collect();

    eventually(
        Duration::from_secs(10).saturating_sub(start.elapsed()),
        "every peer has the 7 others in its DHT routing table",
        || {
            let handles = handles.clone();
            let everyone = everyone.clone();
            async move {
                for handle in &handles {
                    let known: HashSet<_> = handle
                        .known_peers()
                        .await
                        .unwrap_or_default()
                        .into_iter()
                        .collect();
                    let mut others = everyone.clone();
                    others.remove(&handle.local_peer_id());
                    if !others.is_subset(&known) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    let found_in = start.elapsed();

    // The DHT holds only authorized peers, and each is connected and verified.
    for handle in &handles {
        let known: HashSet<_> = handle
            .known_peers()
            .await
            .expect("known")
            .into_iter()
            .collect();
        assert_eq!(
            known.len(),
            7,
            "{} knows exactly the 7 others",
            handle.local_peer_id()
        );
        assert_eq!(handle.metrics().snapshot().auth_rejected, 0);
    }
    eprintln!("8 peers found each other in {found_in:?}");
    for handle in &handles {
        handle.shutdown().await.expect("shutdown");
    }
}
