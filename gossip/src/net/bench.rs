//! `murmur bench stream`: one tensor stream's throughput against raw quinn, in one run.
//!
//! Both transfers run in this process over loopback, one after the other, moving the same
//! number of bytes in the same chunk size:
//!
//! - **libp2p**: two full network stacks ([`spawn`](super::spawn)), authorized with
//!   invites from a throwaway authority; one opens a tensor stream to the other and sends
//!   [`TensorPartChunk`] frames, which the other reads and decodes with
//!   [`TensorStreamReader`](super::TensorStreamReader).
//! - **quinn**: two bare quinn endpoints (self-signed TLS 1.3 with the same crypto provider
//!   and the same flow-control windows as libp2p-quic), one unidirectional stream of raw
//!   bytes, read in 64 KiB pieces. It runs twice: with the provider's default cipher-suite
//!   order (AES-GCM first, what a plain quinn deployment negotiates), and with libp2p-tls's
//!   order (ChaCha20-Poly1305 first, which libp2p-quic hard-codes). The first is the
//!   baseline the 80% target refers to; the second isolates what libp2p itself costs.
//!
//! The clock runs from the first byte written to the last byte read, on the receiving
//! side. Each round runs both; the best round of each is reported, which filters out
//! moments when the machine was busy with something else.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::{Invite, Keypair, SECRET_SEED_LEN, SwarmId};
use murmur_protocol::message::{ChunkAddress, Message, TensorPartChunk};
use thiserror::Error;

use super::config::NetConfig;
use super::error::NetError;
use super::handle::unix_now;
use super::identity::NetIdentity;

/// What to move, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamBenchConfig {
    /// Payload bytes to move per transfer.
    pub bytes: u64,
    /// Payload bytes per frame (libp2p) and per write (quinn).
    pub chunk_bytes: usize,
    /// Rounds to run; the best of each transport is reported.
    pub rounds: u32,
    /// Bound on each transfer.
    pub timeout: Duration,
}

impl Default for StreamBenchConfig {
    fn default() -> Self {
        StreamBenchConfig {
            bytes: 256 << 20,
            chunk_bytes: 1 << 20,
            rounds: 3,
            timeout: Duration::from_secs(120),
        }
    }
}

/// The measured throughputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamThroughput {
    /// Payload bytes moved per transfer.
    pub bytes: u64,
    /// Best libp2p tensor-stream rate, bytes per second.
    pub libp2p_bytes_per_s: f64,
    /// Best raw quinn rate with quinn's default cipher suites, bytes per second.
    pub quinn_bytes_per_s: f64,
    /// Best raw quinn rate with libp2p's cipher-suite order, bytes per second.
    pub quinn_same_cipher_bytes_per_s: f64,
    /// `libp2p / quinn`: the figure the 80% target applies to.
    pub ratio: f64,
    /// `libp2p / quinn with libp2p's ciphers`: libp2p's own overhead.
    pub ratio_same_cipher: f64,
    /// Every round's libp2p rate, bytes per second, in order.
    pub libp2p_rounds: [f64; MAX_ROUNDS],
    /// Every round's quinn rate (default ciphers), bytes per second, in order.
    pub quinn_rounds: [f64; MAX_ROUNDS],
    /// Every round's quinn rate (libp2p's ciphers), bytes per second, in order.
    pub quinn_same_cipher_rounds: [f64; MAX_ROUNDS],
    /// Rounds run (entries of the arrays above that are filled).
    pub rounds: u32,
}

/// Most rounds one run may ask for.
pub const MAX_ROUNDS: usize = 16;

/// Why the benchmark could not run.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The libp2p stack failed.
    #[error("libp2p transfer failed: {0}")]
    Net(#[from] NetError),
    /// The quinn baseline failed.
    #[error("quinn baseline failed: {0}")]
    Quinn(String),
    /// A transfer exceeded [`StreamBenchConfig::timeout`].
    #[error("the {0} transfer did not finish in time; lower the byte count or raise the timeout")]
    Timeout(&'static str),
    /// The receiver got a different number of bytes than were sent.
    #[error("{transport} receiver got {got} bytes, expected {expected}")]
    Mismatch {
        /// Which transfer.
        transport: &'static str,
        /// Bytes sent.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// The configuration is out of range.
    #[error("bench config: {0}")]
    Config(String),
}

/// Runs the benchmark on the current tokio runtime.
pub async fn stream_throughput(config: &StreamBenchConfig) -> Result<StreamThroughput, BenchError> {
    if config.rounds == 0 || config.rounds as usize > MAX_ROUNDS {
        return Err(BenchError::Config(format!(
            "rounds must be 1..={MAX_ROUNDS}"
        )));
    }
    if config.chunk_bytes < 4
        || !config.chunk_bytes.is_multiple_of(4)
        || config.chunk_bytes > 16 << 20
    {
        return Err(BenchError::Config(
            "chunk_bytes must be a multiple of 4 in 4..=16 MiB".to_owned(),
        ));
    }
    let chunks = config.bytes.div_ceil(config.chunk_bytes as u64).max(1);
    let bytes = chunks * config.chunk_bytes as u64;
    let mut result = StreamThroughput {
        bytes,
        libp2p_bytes_per_s: 0.0,
        quinn_bytes_per_s: 0.0,
        quinn_same_cipher_bytes_per_s: 0.0,
        ratio: 0.0,
        ratio_same_cipher: 0.0,
        libp2p_rounds: [0.0; MAX_ROUNDS],
        quinn_rounds: [0.0; MAX_ROUNDS],
        quinn_same_cipher_rounds: [0.0; MAX_ROUNDS],
        rounds: config.rounds,
    };
    let pair = Libp2pPair::start().await?;
    let quinn = QuinnPair::start(CipherOrder::QuinnDefault)?;
    let quinn_same = QuinnPair::start(CipherOrder::Libp2p)?;
    let rate = |elapsed: Duration| bytes as f64 / elapsed.as_secs_f64().max(1e-9);
    for round in 0..config.rounds as usize {
        result.libp2p_rounds[round] = rate(pair.transfer(chunks, config).await?);
        result.quinn_rounds[round] = rate(quinn.transfer(chunks, config).await?);
        result.quinn_same_cipher_rounds[round] = rate(quinn_same.transfer(chunks, config).await?);
    }
    let best = |rounds: &[f64; MAX_ROUNDS]| rounds.iter().copied().fold(0.0, f64::max);
    result.libp2p_bytes_per_s = best(&result.libp2p_rounds);
    result.quinn_bytes_per_s = best(&result.quinn_rounds);
    result.quinn_same_cipher_bytes_per_s = best(&result.quinn_same_cipher_rounds);
    result.ratio = result.libp2p_bytes_per_s / result.quinn_bytes_per_s.max(1e-9);
    result.ratio_same_cipher =
        result.libp2p_bytes_per_s / result.quinn_same_cipher_bytes_per_s.max(1e-9);
    let _ = pair.sender.shutdown().await;
    let _ = pair.receiver.shutdown().await;
    Ok(result)
}

/// Two authorized murmur network stacks on loopback: the sender dialed the receiver.
pub struct Libp2pPair {
    /// The side that opens tensor streams.
    pub sender: super::NetHandle,
    /// The side that reads them.
    pub receiver: super::NetHandle,
    /// The receiver's peer id.
    pub receiver_id: murmur_protocol::identity::PeerId,
    inbound: tokio::sync::Mutex<super::NetInbound>,
    /// The sender's control requests (its tensor streams go unread).
    sender_control: Option<tokio::sync::mpsc::Receiver<super::InboundControl>>,
    /// Issues every stack's invite.
    authority: Keypair,
    swarm: SwarmId,
}

impl std::fmt::Debug for Libp2pPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Libp2pPair")
            .field("receiver_id", &self.receiver_id)
            .finish_non_exhaustive()
    }
}

impl Libp2pPair {
    /// Starts both stacks, each with an invite from a throwaway authority, and connects
    /// them; each has verified the other's invite when this returns.
    pub async fn start() -> Result<Libp2pPair, BenchError> {
        let authority = Keypair::from_seed(random_seed()?);
        let swarm = SwarmId::new("murmur-bench").map_err(|e| BenchError::Config(e.to_string()))?;
        let receiver_id = NetIdentity::from_seed(random_seed()?);
        let peer = receiver_id.peer_id();
        let receiver_config = stack_config(&authority, &swarm, &receiver_id)?;
        let (receiver, inbound) = super::spawn(&receiver_config, receiver_id).await?;
        let (sender, sender_control) = joined_stack(&authority, &swarm, &receiver, peer).await?;
        Ok(Libp2pPair {
            sender,
            receiver,
            receiver_id: peer,
            inbound: tokio::sync::Mutex::new(inbound),
            sender_control: Some(sender_control),
            authority,
            swarm,
        })
    }

    /// Starts one more stack, invited as the other two are, that dials the receiver; it
    /// and the receiver have verified each other when this returns. Its control requests
    /// come with it (its tensor streams go unread).
    pub async fn another_sender(&self) -> Result<JoinedStack, BenchError> {
        joined_stack(
            &self.authority,
            &self.swarm,
            &self.receiver,
            self.receiver_id,
        )
        .await
    }

    /// The control requests the sender receives, once.
    pub fn take_sender_control(
        &mut self,
    ) -> Option<tokio::sync::mpsc::Receiver<super::InboundControl>> {
        self.sender_control.take()
    }

    /// Moves `chunks` frames of `config.chunk_bytes` from the sender to the receiver over
    /// one tensor stream; the time from the first byte written to the last byte read.
    pub async fn transfer(
        &self,
        chunks: u64,
        config: &StreamBenchConfig,
    ) -> Result<Duration, BenchError> {
        let payload = vec![0x3Cu8; config.chunk_bytes];
        let elements = u32::try_from(config.chunk_bytes / 4)
            .map_err(|_| BenchError::Config("chunk too large".to_owned()))?;
        let expected = chunks * config.chunk_bytes as u64;
        let mut inbound = self.inbound.lock().await;
        let run = async {
            let mut writer = self.sender.open_tensor_stream(&self.receiver_id).await?;
            let start = Instant::now();
            let send = async {
                for chunk in 0..chunks {
                    let message = Message::TensorPartChunk(TensorPartChunk {
                        address: ChunkAddress {
                            group_id: 1,
                            part: 0,
                            chunk: u32::try_from(chunk).unwrap_or(u32::MAX),
                            offset: chunk * u64::from(elements),
                            elements,
                        },
                        weight: 1.0,
                        codec: CodecSpec::F32,
                        payload: &payload,
                    });
                    writer.send(&message).await?;
                }
                writer.finish().await?;
                Ok::<_, NetError>(())
            };
            let receive = async {
                let mut reader = inbound
                    .tensor_streams
                    .recv()
                    .await
                    .ok_or(NetError::Stopped)?;
                let mut got = 0u64;
                while let Some(n) = reader
                    .recv(|m| match m {
                        Message::TensorPartChunk(c) => c.payload.len() as u64,
                        _ => 0,
                    })
                    .await?
                {
                    got += n;
                }
                Ok::<_, NetError>((got, start.elapsed()))
            };
            let (sent, received) = tokio::join!(send, receive);
            sent?;
            received
        };
        let (got, elapsed) = tokio::time::timeout(config.timeout, run)
            .await
            .map_err(|_| BenchError::Timeout("libp2p"))??;
        if got != expected {
            return Err(BenchError::Mismatch {
                transport: "libp2p",
                expected,
                got,
            });
        }
        Ok(elapsed)
    }
}

/// Which cipher suites the quinn baseline offers, in preference order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CipherOrder {
    /// The aws-lc-rs provider's default: AES-256-GCM, AES-128-GCM, ChaCha20-Poly1305.
    QuinnDefault,
    /// libp2p-tls's order: ChaCha20-Poly1305 first. (AES-128-GCM stays offered because QUIC
    /// needs it for its initial packets.)
    Libp2p,
}

/// Two quinn endpoints on loopback, connected.
struct QuinnPair {
    server: quinn::Endpoint,
    client: quinn::Endpoint,
    client_config: quinn::ClientConfig,
}

impl QuinnPair {
    fn start(ciphers: CipherOrder) -> Result<QuinnPair, BenchError> {
        let err = |e: &dyn std::fmt::Display| BenchError::Quinn(e.to_string());
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .map_err(|e| err(&e))?;
        let cert_der = cert.cert.der().clone();
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        if ciphers == CipherOrder::Libp2p {
            use rustls::crypto::aws_lc_rs::cipher_suite;
            provider.cipher_suites = vec![
                cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
                cipher_suite::TLS13_AES_128_GCM_SHA256,
            ];
        }
        let provider = Arc::new(provider);
        let alpn = b"murmur-bench".to_vec();

        let mut server_tls = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| err(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert_der.clone()], key.into())
            .map_err(|e| err(&e))?;
        server_tls.alpn_protocols = vec![alpn.clone()];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert_der).map_err(|e| err(&e))?;
        let mut client_tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| err(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client_tls.alpn_protocols = vec![alpn];

        let transport = Arc::new(libp2p_like_transport());
        let server_crypto =
            quinn::crypto::rustls::QuicServerConfig::try_from(server_tls).map_err(|e| err(&e))?;
        let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
        server_config.transport = Arc::clone(&transport);
        let client_crypto =
            quinn::crypto::rustls::QuicClientConfig::try_from(client_tls).map_err(|e| err(&e))?;
        let mut client_config = quinn::ClientConfig::new(Arc::new(client_crypto));
        client_config.transport_config(transport);

        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let server = quinn::Endpoint::server(server_config, local).map_err(|e| err(&e))?;
        let client = quinn::Endpoint::client(local).map_err(|e| err(&e))?;
        Ok(QuinnPair {
            server,
            client,
            client_config,
        })
    }

    async fn transfer(
        &self,
        chunks: u64,
        config: &StreamBenchConfig,
    ) -> Result<Duration, BenchError> {
        let err = |e: &dyn std::fmt::Display| BenchError::Quinn(e.to_string());
        let expected = chunks * config.chunk_bytes as u64;
        let server_addr = self.server.local_addr().map_err(|e| err(&e))?;
        let payload = vec![0x3Cu8; config.chunk_bytes];
        let run = async {
            let connecting = self
                .client
                .connect_with(self.client_config.clone(), server_addr, "localhost")
                .map_err(|e| err(&e))?;
            let incoming = self.server.accept();
            let (client_conn, server_conn) = tokio::join!(connecting, async {
                match incoming.await {
                    Some(incoming) => incoming.await.map_err(|e| err(&e)),
                    None => Err(BenchError::Quinn("server endpoint closed".to_owned())),
                }
            });
            let client_conn = client_conn.map_err(|e| err(&e))?;
            let server_conn = server_conn?;
            let mut send = client_conn.open_uni().await.map_err(|e| err(&e))?;
            let start = Instant::now();
            let sender = async {
                for _ in 0..chunks {
                    send.write_all(&payload).await.map_err(|e| err(&e))?;
                }
                send.finish().map_err(|e| err(&e))?;
                Ok::<_, BenchError>(())
            };
            let receiver = async {
                let mut recv = server_conn.accept_uni().await.map_err(|e| err(&e))?;
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = 0u64;
                while let Some(n) = recv.read(&mut buf).await.map_err(|e| err(&e))? {
                    got += n as u64;
                }
                Ok::<_, BenchError>((got, start.elapsed()))
            };
            let (sent, received) = tokio::join!(sender, receiver);
            sent?;
            let received = received?;
            client_conn.close(0u32.into(), b"done");
            Ok::<_, BenchError>(received)
        };
        let (got, elapsed) = tokio::time::timeout(config.timeout, run)
            .await
            .map_err(|_| BenchError::Timeout("quinn"))??;
        if got != expected {
            return Err(BenchError::Mismatch {
                transport: "quinn",
                expected,
                got,
            });
        }
        Ok(elapsed)
    }
}

/// quinn's transport settings as libp2p-quic 0.14 sets them (its defaults), so the two runs
/// differ only in what libp2p adds on top.
fn libp2p_like_transport() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_uni_streams(16u32.into());
    transport.keep_alive_interval(Some(Duration::from_secs(5)));
    transport.allow_spin(false);
    transport.stream_receive_window(10_000_000u32.into());
    transport.receive_window(15_000_000u32.into());
    transport
}

fn random_seed() -> Result<[u8; SECRET_SEED_LEN], BenchError> {
    let mut seed = [0u8; SECRET_SEED_LEN];
    getrandom::fill(&mut seed).map_err(|e| BenchError::Config(format!("no OS randomness: {e}")))?;
    Ok(seed)
}

/// A stack that joined the receiver, and the control requests it receives.
pub type JoinedStack = (
    super::NetHandle,
    tokio::sync::mpsc::Receiver<super::InboundControl>,
);

/// A loopback QUIC stack's config, with an invite to `swarm` from `authority`.
fn stack_config(
    authority: &Keypair,
    swarm: &SwarmId,
    identity: &NetIdentity,
) -> Result<NetConfig, BenchError> {
    let now = unix_now();
    let invite = Invite::issue(
        authority,
        &identity.peer_id(),
        swarm,
        now.saturating_sub(60),
        now + 24 * 3600,
    )
    .map_err(|e| BenchError::Config(e.to_string()))?;
    Ok(NetConfig {
        swarm_id: swarm.to_string(),
        authority: authority.peer_id().to_string(),
        invite: invite.encode(),
        listen_addrs: vec!["/ip4/127.0.0.1/udp/0/quic-v1".to_owned()],
        ..NetConfig::default()
    })
}

/// Starts a stack that dials `receiver` (whose id is `peer`) and waits until both have
/// verified each other; the stack and its control requests.
async fn joined_stack(
    authority: &Keypair,
    swarm: &SwarmId,
    receiver: &super::NetHandle,
    peer: murmur_protocol::identity::PeerId,
) -> Result<JoinedStack, BenchError> {
    let identity = NetIdentity::from_seed(random_seed()?);
    let config = stack_config(authority, swarm, &identity)?;
    let (sender, inbound) = super::spawn(&config, identity).await?;
    for addr in receiver.listen_addrs().await? {
        sender.dial(addr).await?;
    }
    sender.wait_ready(&peer).await?;
    receiver.wait_ready(&sender.local_peer_id()).await?;
    Ok((sender, inbound.control_requests))
}
