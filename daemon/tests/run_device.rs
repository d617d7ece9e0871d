//! `training.device` in `murmur run`, on a build without the `cuda` feature (the build CI
//! tests): a GPU the config demands makes the peer exit 2 naming the key before it joins
//! anything, and `auto` trains on the CPU after one log line saying why. The device in use
//! is in the `ready` log line, in `/status` and in `/metrics`.
//!
//! The `cuda` build's side (`device = "cuda"` training on GPU 0) needs a GPU host:
//! `scripts/gpu-check.sh` runs it.

#![cfg(not(feature = "cuda"))]

mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::time::Duration;

use run_support::{PeerSettings, Swarm};
use swarm::{exclusive, http_get};

/// How long a peer refusing its config may take to exit.
const EXIT_PATIENCE: Duration = Duration::from_secs(30);

/// A GPU on a build without CUDA: exit 2, and the message names the key, its line and how
/// to get a build that can.
#[test]
fn a_gpu_on_a_build_without_cuda_exits_2_naming_the_key() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    for device in ["cuda", "cuda:1"] {
        let peer = swarm.add_peer(&format!("p-{}", device.replace(':', "-")));
        peer.write_config(&PeerSettings {
            device: device.to_owned(),
            ..PeerSettings::default()
        });
        let mut running = peer.start();
        let status = running.wait_exit(EXIT_PATIENCE);
        let log = running.log();
        assert_eq!(status.code(), Some(2), "device = {device:?}: {log}");
        let config = peer.config_path();
        let at = format!("{}:", config.display());
        let named = format!("training.device = \"{device}\": ");
        assert!(log.contains(&at) && log.contains(&named), "{log}");
        assert!(log.contains("built without CUDA"), "{log}");
        assert!(!log.contains("ready"), "the peer started anyway: {log}");
    }
}

/// `auto` on a build without CUDA: one log line says the peer trains on the CPU and why,
/// and the `ready` line, `/status` and `/metrics` all say `cpu`.
#[test]
fn auto_trains_on_the_cpu_after_one_log_line() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let peer = swarm.add_peer("p0");
    peer.write_config(&PeerSettings {
        device: "auto".to_owned(),
        metrics: true,
        ..PeerSettings::default()
    });
    let mut running = peer.start();
    let ready = running.ready();
    let addr: SocketAddr = ready
        .str("metrics_addr")
        .parse()
        .expect("the ready line has the metrics address");

    let (code, status) = http_get(addr, "/status").unwrap_or_else(|e| running.fail(&e));
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).expect("/status is JSON");
    assert_eq!(status["device"], "cpu", "{status}");

    let (code, metrics) = http_get(addr, "/metrics").unwrap_or_else(|e| running.fail(&e));
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains("murmur_training_device_info{device=\"cpu\"} 1\n"),
        "{metrics}"
    );

    let log = running.log_once("the ready log line", Duration::from_secs(10), |log| {
        log.lines()
            .any(|line| line.contains("ready") && line.contains("device=cpu"))
    });
    let about_the_device: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("training.device"))
        .collect();
    assert_eq!(about_the_device.len(), 1, "{log}");
    assert!(
        about_the_device[0].contains("training on the CPU")
            && about_the_device[0].contains("without CUDA"),
        "{log}"
    );
}
