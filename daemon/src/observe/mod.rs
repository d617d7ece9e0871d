//! Observability: Prometheus metrics, the JSON status board, the HTTP endpoints that serve
//! them, and logging.
//!
//! The run loop owns one [`Metrics`] (one registry; every metric registered once) and one
//! [`StatusBoard`], updates them as it trains and averages, and hands clones of both to
//! [`serve`], which answers on the configured address:
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /metrics` | every metric below, Prometheus text format 0.0.4 |
//! | `GET /status` | the [`StatusReport`] as JSON (what `murmur status` prints) |
//! | `GET /healthz` | `200 ok` while the daemon runs |
//! | `POST /pause`, `POST /resume` | sets the paused flag the run loop reads; answers `{"paused":…}` |
//!
//! # Metrics
//!
//! Label values come from closed sets: `mode` is `sgp`, `butterfly`, `local-sgd` or
//! `sync-ring`; `outcome` is `complete` (the whole vector averaged), `partial` (some parts
//! kept local values) or `failed` (nothing averaged); `codec` is a codec name (`f32`, `f16`,
//! `bf16`, `int8`, `int4`, `sign1`, `topk`) or `none` for messages that carry no tensor;
//! `kind` is a frame kind (`tensor_part_chunk`, `averaged_chunk`, `push_sum_share`,
//! `state_sync_response`, …); `direction` is `upload` or `download`; `peer` is a peer id
//! (at most [`network::MAX_PEER_SERIES`] peers are exported); `device` is `cpu` or `cuda:N`.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `murmur_build_info` | gauge | version, swarm, peer, mode, codec, device | always 1; what this daemon runs: murmur's version, the swarm id, this peer's id, the averaging mode, the wire codec (`averaging.codec` as written, e.g. `int8:64`) and the training device. Dashboards and alerts join on it (`on (job, instance)`) to filter by swarm, peer and mode |
//! | `murmur_paused` | gauge | | 1 while training is paused (SIGUSR1 or `POST /pause`), else 0 |
//! | `murmur_checkpoint_writes_total` | counter | | checkpoints written |
//! | `murmur_checkpoint_failures_total` | counter | | checkpoints that could not be written (training goes on) |
//! | `murmur_checkpoint_corrupt_total` | counter | | checkpoint files that failed their check and were moved aside to `<name>.corrupt` |
//! | `murmur_training_step` | gauge | | optimizer step this peer is at |
//! | `murmur_training_samples_total` | counter | | samples trained on since the daemon started |
//! | `murmur_training_loss` | gauge | | training loss of the last step |
//! | `murmur_training_eval_loss` | gauge | | loss of the last evaluation |
//! | `murmur_training_samples_per_second` | gauge | | recent training throughput |
//! | `murmur_training_learning_rate` | gauge | | learning rate of the last step |
//! | `murmur_training_device_info` | gauge | device | always 1; `device` is where the model's passes run (`cpu`, `cuda:N`) |
//! | `murmur_averaging_rounds_total` | counter | mode, outcome | averaging rounds finished |
//! | `murmur_averaging_round_duration_seconds` | histogram | mode, outcome | wall time of one round, start to applied (SGP: one push-sum share, sent to delivered) |
//! | `murmur_averaging_busy_seconds_total` | counter | mode | wall time with at least one round or share in flight; overlapping ones count once, so its rate is at most 1 (the durations' sum is not: overlap SGP has several shares in flight at once) |
//! | `murmur_averaging_coverage_ratio` | gauge | mode | fraction of the vector averaged with at least one other peer, last round |
//! | `murmur_averaging_group_size` | gauge | mode | peers whose contribution entered the last round, this one included |
//! | `murmur_averaging_push_sum_weight` | gauge | | this peer's push-sum weight `w` (SGP) |
//! | `murmur_averaging_consensus_drift` | gauge | | relative L2 distance `‖x − x̄‖ / ‖x̄‖` between this peer's parameters and the last average it saw |
//! | `murmur_averaging_feedback_carried_ratio` | gauge | mode | with `averaging.error_feedback` and a lossy codec: the fraction of what this peer sent in its last round that the codec lost and error feedback carries into the next (`‖r‖ / ‖x + r‖` over its sends); 0 when nothing is carried (feedback off, `f32`, SGP) |
//! | `murmur_averaging_stragglers_dropped_total` | counter | mode | group members dropped from a round for not sending in time |
//! | `murmur_averaging_parts_timed_out_total` | counter | mode | parts whose reducer did not answer in time (kept local values) |
//! | `murmur_averaging_step_rate_ratio` | gauge | | SGP: this peer's step rate over the median of its peers', from their heartbeat steps over 30 s; absent until known |
//! | `murmur_averaging_slow_peers` | gauge | | SGP: peers, this one included, stepping at under half the median step rate; absent outside SGP and until known |
//! | `murmur_averaging_share_refusals_total` | counter | event | push-sum shares refused for a reference the receiver did not hold (SGP): `refused` here, or sent from here and `taken_back` or `lost`; `cancelled`: sent from here, never applied (its connection died first), and taken back after asking the receiver |
//! | `murmur_averaging_weights_capped_total` | counter | | senders whose declared weight this peer's reductions cut to `averaging.butterfly.max_weight_ratio` times the median |
//! | `murmur_averaging_contributions_rejected_total` | counter | | contributions this peer's CenteredClip reductions set aside as outliers, summed over chunks |
//! | `murmur_net_connected_peers` | gauge | | connected peers whose invite verified |
//! | `murmur_net_bandwidth_cap_bytes_per_second` | gauge | direction | the volunteer's cap on tensor bytes per second (`upload`, `download`); 0 = none |
//! | `murmur_net_message_bytes_sent_total` | counter | codec, kind | frame bytes this peer sent |
//! | `murmur_net_message_bytes_received_total` | counter | codec, kind | frame bytes this peer received |
//! | `murmur_net_tensor_bytes_sent_total` | counter | | tensor stream bytes written, all peers (network layer) |
//! | `murmur_net_tensor_bytes_received_total` | counter | | tensor stream bytes read, all peers (network layer) |
//! | `murmur_net_peer_throughput_bytes_per_second` | gauge | peer, direction | measured transfer rate to or from one peer (EWMA) |
//! | `murmur_net_auth_rejections_total` | counter | | connections closed because an invite did not verify |
//! | `murmur_net_auth_timeouts_total` | counter | | connections closed because the invite exchange took too long |
//! | `murmur_net_peers_refused_revoked_total` | counter | | peers refused or disconnected because the swarm's revocation list names them |
//! | `murmur_net_revocation_lists_adopted_total` | counter | | revocation lists verified and adopted (each newer than the one before) |
//! | `murmur_net_peers_authorized_total` | counter | | peers whose invite verified |
//! | `murmur_net_bad_frames_total` | counter | | tensor streams closed for a bad frame or message |
//! | `murmur_net_gossip_rejected_total` | counter | | gossip messages rejected |
//! | `murmur_net_heartbeats_received_total` | counter | | heartbeats accepted |
//! | `murmur_net_heartbeats_refused_total` | counter | reason (`uninvited_signer`, `stale`, `replayed`, `revoked`) | heartbeats refused by their signer or their time, whoever forwarded them: the signer holds no invite this peer verified and that is still valid; the timestamp is further than `net.max_heartbeat_age_ms` from this peer's clock; or it is not after the signer's last accepted one; or the swarm's revocation list names the signer (also in `murmur_net_gossip_rejected_total`) |
//! | `murmur_net_tensor_streams_accepted_total` | counter | | inbound tensor streams handed to the run loop |
//! | `murmur_net_connections_refused_total` | counter | reason (`pending_per_ip`, `per_ip`, `limit`, `banned`) | connections closed before or as they start: their source IP had `net.max_pending_incoming_per_ip` handshakes under way or `net.max_incoming_connections_per_ip` connections, a limit of all sources together was full, or their peer is banned |
//! | `murmur_net_handshake_timeouts_total` | counter | | incoming connections dropped for not finishing their transport handshake within `net.handshake_timeout_ms` |
//! | `murmur_net_tensor_frames_timed_out_total` | counter | | tensor streams closed because a frame did not arrive whole within `net.frame_timeout_ms` of its first byte |
//! | `murmur_net_tensor_streams_over_partial_budget_total` | counter | | tensor streams closed because their peer's incomplete frames would hold more than `net.max_partial_frame_bytes_per_peer` |
//! | `murmur_net_peers_banned_total` | counter | | bans started: a peer refused for its invite `net.ban_after_refusals` times or more |
//! | `murmur_net_tensor_streams_refused_total` | counter | reason (`unauthorized`, `limit`) | inbound tensor streams dropped unread |
//! | `murmur_net_reachability` | gauge | state (`public`, `private`, `unknown`) | 1 for what AutoNAT found about this peer, 0 for the other states |
//! | `murmur_net_connections` | gauge | kind (`direct`, `hole_punched`, `relayed`) | open connections by how they were made |
//! | `murmur_net_hole_punches_total` | counter | result (`succeeded`, `failed`) | DCUtR attempts to turn a relayed connection into a direct one |
//! | `murmur_net_relay_accepted_total` | counter | request (`reservation`, `circuit`) | relay reservations and relayed connections this peer granted to members (`[net.relay] serve`) |
//! | `murmur_net_relayed_bytes_total` | counter | direction (`sent`, `received`) | bytes this peer wrote and read on connections through a relay (every stream, framing included) |
//! | `murmur_net_relay_refused_total` | counter | request (`reservation`, `circuit`) | relay requests refused because the requester is not a member |
//! | `murmur_process_resident_memory_bytes` | gauge | | resident set size (`/proc/self/status` `VmRSS`) |
//! | `murmur_process_cpu_seconds_total` | counter | | user + system CPU time, all threads |
//! | `murmur_process_open_fds` | gauge | | open file descriptors |
//! | `murmur_gpu_memory_used_bytes` | gauge | | device memory in use, read after each training step (only when training on a GPU) |
//! | `murmur_gpu_memory_total_bytes` | gauge | | device memory in all (only when training on a GPU) |
//! | `murmur_gpu_kernel_seconds_total` | counter | kernel | seconds of device work: `forward_backward` is each step's passes with the parameter upload, gradient download and the draw of its batch (all micro-batches; only when training on a GPU) |
//! | `murmur_gpu_transfer_bytes_total` | counter | direction | bytes the trainer copied between host and device memory (`to_device`: parameters, batches; `to_host`: gradients, losses), read after each step's passes (only when training on a GPU) |
//!
//! The `murmur_net_*` counters without a `codec` label and the throughput gauges are read
//! from the network layer's own counters when `/metrics` is scraped, once
//! [`network::NetworkMetrics::attach`] has been called; the process metrics are read from
//! `/proc/self` at scrape time (Linux only; elsewhere they are absent); `murmur_paused` and
//! the SGP straggler gauges are read from the [`StatusBoard`] at scrape time
//! ([`Metrics::refresh_from`]), since the board holds the paused flag and the heartbeats.
//!
//! Updates cost one or two relaxed atomic operations each, except that a finished round also
//! takes an uncontended lock to merge its interval into the busy time, and a step one on the
//! status board; [`Metrics::disabled`] makes them no-ops for measuring that cost.

// Not yet driven by the run loop: the GPU kernel-time labels of the communication kernels
// (averaging runs on the CPU), the per-codec byte counters, the consensus-drift gauge and `Metrics::disabled` (for the
// overhead benchmark). Their tests exercise them.
#![cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "parts of the metrics API the run loop does not feed yet"
    )
)]

mod averaging;
mod busy;
mod control;
mod daemon;
mod gpu;
mod http;
mod logging;
pub(crate) mod network;
pub(crate) mod process;
mod registry;
mod request;
mod status;
mod stragglers;
mod training;

pub(crate) use averaging::{Refusal, RoundOutcome, RoundSummary};
pub(crate) use control::ControlToken;
pub(crate) use gpu::GpuMetrics;
pub(crate) use http::{HttpLimits, serve};
pub(crate) use logging::{LogFormat, init_logging};
pub(crate) use registry::{Metrics, MetricsOptions};
#[cfg(test)]
pub(crate) use status::{BootstrapStatus, ConnectionsStatus, PeerStatus, RoundStatus};
pub(crate) use status::{StatusBoard, StatusIdentity, StatusReport};

/// The port `/metrics`, `/status` and `/healthz` are served on unless the config says
/// otherwise (the port Prometheus exporters of this kind customarily use).
pub(crate) const DEFAULT_PORT: u16 = 9464;

/// What went wrong setting up metrics or their endpoint.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ObserveError {
    /// A metric could not be created or registered; names must be unique and valid.
    #[error("cannot register metric `{name}`: {source}")]
    Register {
        /// The metric's name.
        name: String,
        /// What the prometheus crate reported.
        source: prometheus::Error,
    },
    /// The metrics could not be written in the text format.
    #[error("cannot encode metrics: {0}")]
    Encode(prometheus::Error),
    /// The network layer was attached twice.
    #[error("the network layer's counters are already attached to these metrics")]
    NetworkAlreadyAttached,
    /// The endpoint's address could not be bound.
    #[error(
        "cannot listen for /metrics and /status on {addr}: {source}; choose another address or \
         port (port 0 picks a free one)"
    )]
    Bind {
        /// The address from the config.
        addr: std::net::SocketAddr,
        /// What the operating system reported.
        source: std::io::Error,
    },
}
