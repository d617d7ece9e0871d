//! Who may use `POST /pause` and `POST /resume`, decided without I/O.
//!
//! Pausing a peer takes it out of training, so these two endpoints are not open to whoever
//! can reach the metrics port. A request is allowed when all of these hold:
//!
//! 1. Its `Host` header, if any, names this daemon: `localhost`, a loopback address, or the
//!    address the connection arrived on, with this port when a port is given. A web page
//!    that rebinds its own name to this host (DNS rebinding) sends its own name and is
//!    refused.
//! 2. Its `Origin` header, if any, is `http(s)://` and such an address: pages of other sites
//!    may not post to the daemon from a visitor's browser.
//! 3. It comes from a loopback address, or carries `Authorization: Bearer <token>` with the
//!    token of `metrics.control_token_file`. A token that is sent must be right, loopback
//!    or not.
//!
//! A refused request gets `403` and changes nothing.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// The shortest control token accepted: guessing one of 16 random characters is out of
/// reach for anyone who can reach the port.
pub(crate) const MIN_TOKEN_LEN: usize = 16;
/// The longest control token accepted.
pub(crate) const MAX_TOKEN_LEN: usize = 256;

/// The bearer token that lets non-loopback clients pause and resume; never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ControlToken(String);

impl fmt::Debug for ControlToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ControlToken(<redacted>)")
    }
}

impl ControlToken {
    /// A token from the text of a token file: surrounding whitespace is dropped; what is
    /// left must be [`MIN_TOKEN_LEN`] to [`MAX_TOKEN_LEN`] visible ASCII characters.
    pub(crate) fn new(text: &str) -> Result<ControlToken, String> {
        let token = text.trim();
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be visible ASCII characters without spaces".into());
        }
        if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len()) {
            return Err(format!(
                "the token has {} characters; it needs {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} \
                 (e.g. `openssl rand -hex 32`)",
                token.len()
            ));
        }
        Ok(ControlToken(token.to_owned()))
    }

    /// Whether `presented` is this token, compared in time that does not depend on where
    /// they differ.
    fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// What the check needs to know about one control request.
#[derive(Debug, Clone, Copy)]
pub(super) struct ControlRequest<'a> {
    /// The client's address.
    pub(super) client: SocketAddr,
    /// The address the connection arrived on.
    pub(super) local: SocketAddr,
    /// The `Host` header.
    pub(super) host: Option<&'a str>,
    /// The `Origin` header.
    pub(super) origin: Option<&'a str>,
    /// The `Authorization` header.
    pub(super) authorization: Option<&'a str>,
}

/// Why a control request was refused; the message is the `403` answer's body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Forbidden {
    /// The `Host` header names another host (DNS rebinding, or a proxy).
    #[error("Host `{0}` is not this daemon's address; address it by IP or as localhost")]
    Host(String),
    /// The `Origin` header is another site's.
    #[error("Origin `{0}` is not this daemon: other sites may not pause or resume it")]
    Origin(String),
    /// A bearer token was sent, but not the configured one (or none is configured).
    #[error("wrong bearer token")]
    Token,
    /// No token, from an address that is not loopback.
    #[error(
        "pause and resume from {0} need `Authorization: Bearer <token>` with the token of \
         metrics.control_token_file; only loopback clients may go without"
    )]
    NotLoopback(IpAddr),
}

/// Whether `request` may pause or resume training, given the configured `token`.
pub(super) fn authorize(
    request: &ControlRequest<'_>,
    token: Option<&ControlToken>,
) -> Result<(), Forbidden> {
    if let Some(host) = request.host
        && !names_this_daemon(host, request.local)
    {
        return Err(Forbidden::Host(shown(host)));
    }
    if let Some(origin) = request.origin {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if !authority.is_some_and(|a| names_this_daemon(a, request.local)) {
            return Err(Forbidden::Origin(shown(origin)));
        }
    }
    match request.authorization {
        Some(value) => {
            let presented = value
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim());
            match (presented, token) {
                (Some(presented), Some(token)) if token.matches(presented) => Ok(()),
                _ => Err(Forbidden::Token),
            }
        }
        None if request.client.ip().to_canonical().is_loopback() => Ok(()),
        None => Err(Forbidden::NotLoopback(request.client.ip().to_canonical())),
    }
}

/// Whether the `host[:port]` `authority` is this daemon at `local`.
fn names_this_daemon(authority: &str, local: SocketAddr) -> bool {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, tail)) => match tail.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>() == Ok(local.port()));
    let host_ok = host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| {
            let ip = ip.to_canonical();
            ip.is_loopback() || ip == local.ip().to_canonical()
        });
    port_ok && host_ok
}

/// A header value as it may appear in a log line or answer: at most 64 characters.
fn shown(value: &str) -> String {
    value.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &str = "10.1.2.3:9464";

    fn request<'a>(client: &str) -> ControlRequest<'a> {
        ControlRequest {
            client: client.parse().unwrap(),
            local: LOCAL.parse().unwrap(),
            host: None,
            origin: None,
            authorization: None,
        }
    }

    fn token() -> ControlToken {
        ControlToken::new("  0123456789abcdef0123\n").unwrap()
    }

    #[test]
    fn loopback_needs_no_token_and_other_addresses_do() {
        assert_eq!(authorize(&request("127.0.0.1:5000"), None), Ok(()));
        assert_eq!(authorize(&request("[::1]:5000"), None), Ok(()));
        assert_eq!(authorize(&request("[::ffff:127.0.0.1]:5000"), None), Ok(()));
        let remote = request("10.9.9.9:5000");
        let refused = Err(Forbidden::NotLoopback("10.9.9.9".parse().unwrap()));
        assert_eq!(authorize(&remote, None), refused);
        assert_eq!(authorize(&remote, Some(&token())), refused);
    }

    #[test]
    fn the_configured_bearer_token_admits_any_address_and_a_wrong_one_none() {
        let mut remote = request("10.9.9.9:5000");
        remote.authorization = Some("Bearer 0123456789abcdef0123");
        assert_eq!(authorize(&remote, Some(&token())), Ok(()));
        remote.authorization = Some("bearer 0123456789abcdef0123");
        assert_eq!(authorize(&remote, Some(&token())), Ok(()));
        assert_eq!(authorize(&remote, None), Err(Forbidden::Token));
        for wrong in [
            "Bearer 0123456789abcdef0124",
            "Bearer 0123456789abcdef012",
            "Basic 0123456789abcdef0123",
            "0123456789abcdef0123",
        ] {
            remote.authorization = Some(wrong);
            assert_eq!(authorize(&remote, Some(&token())), Err(Forbidden::Token));
            let mut local = request("127.0.0.1:5000");
            local.authorization = Some(wrong);
            assert_eq!(authorize(&local, Some(&token())), Err(Forbidden::Token));
        }
    }

    #[test]
    fn a_foreign_host_or_origin_is_refused_even_from_loopback() {
        for host in [
            "evil.example",
            "evil.example:9464",
            "10.1.2.3:80",
            "10.1.2.4:9464",
            "[::2]:9464",
            "localhost.evil.example",
        ] {
            let mut r = request("127.0.0.1:5000");
            r.host = Some(host);
            assert_eq!(authorize(&r, None), Err(Forbidden::Host(host.into())));
        }
        for origin in [
            "http://evil.example",
            "https://evil.example:9464",
            "null",
            "http://10.1.2.3:1",
            "file://",
        ] {
            let mut r = request("127.0.0.1:5000");
            r.origin = Some(origin);
            assert_eq!(authorize(&r, None), Err(Forbidden::Origin(origin.into())));
        }
    }

    #[test]
    fn this_daemons_own_names_pass_the_host_and_origin_checks() {
        for host in [
            "localhost",
            "LOCALHOST:9464",
            "127.0.0.1:9464",
            "[::1]:9464",
            "10.1.2.3",
            "10.1.2.3:9464",
        ] {
            let mut r = request("127.0.0.1:5000");
            r.host = Some(host);
            r.origin = Some("http://localhost:9464");
            assert_eq!(authorize(&r, None), Ok(()), "{host}");
        }
        let mut r = request("127.0.0.1:5000");
        r.origin = Some("https://10.1.2.3:9464");
        assert_eq!(authorize(&r, None), Ok(()));
    }

    #[test]
    fn tokens_are_bounded_visible_text_and_never_printed() {
        assert!(ControlToken::new("short").is_err());
        assert!(ControlToken::new(&"x".repeat(MAX_TOKEN_LEN + 1)).is_err());
        assert!(ControlToken::new("0123456789 abcdef0123").is_err());
        assert!(!format!("{:?}", token()).contains("0123"));
    }
}
