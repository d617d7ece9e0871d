//! Parsing an HTTP/1.1 request head, without I/O.

/// Why a request was refused; the message is sent back as the answer's body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum BadRequest {
    /// The head did not end within the limit.
    #[error("request head over {limit} bytes")]
    HeadTooLarge {
        /// The limit, bytes.
        limit: usize,
    },
    /// The head is not UTF-8 text.
    #[error("request head is not UTF-8 text")]
    NotText,
    /// The first line is not `METHOD /path HTTP/1.x`.
    #[error("malformed request line; expected `METHOD /path HTTP/1.1`")]
    RequestLine,
    /// A version other than HTTP/1.0 or HTTP/1.1.
    #[error("unsupported protocol version `{0}`; use HTTP/1.1")]
    Version(String),
    /// A header line without a name and a colon.
    #[error("malformed header line")]
    HeaderLine,
    /// `Content-Length` is not a number, or given twice with different values.
    #[error("invalid Content-Length")]
    ContentLength,
    /// A `Transfer-Encoding` header: chunked bodies are not accepted.
    #[error("Transfer-Encoding is not supported; send a Content-Length instead")]
    TransferEncoding,
    /// A header that may appear once (`Host`, `Origin`, `Authorization`) appeared twice.
    #[error("the {0} header is given twice")]
    DuplicateHeader(&'static str),
    /// The declared body is larger than any endpoint takes.
    #[error("request body over {limit} bytes")]
    BodyTooLarge {
        /// The limit, bytes.
        limit: usize,
    },
}

/// A request head, borrowed from the bytes it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RequestHead<'a> {
    /// `GET`, `POST`, …
    pub(super) method: &'a str,
    /// The target's path, without its query.
    pub(super) path: &'a str,
    /// The declared body length; 0 when none was declared.
    pub(super) content_length: usize,
    /// The `Host` header's value, if sent.
    pub(super) host: Option<&'a str>,
    /// The `Origin` header's value, if sent.
    pub(super) origin: Option<&'a str>,
    /// The `Authorization` header's value, if sent.
    pub(super) authorization: Option<&'a str>,
}

/// Where the head ends in `bytes` (the index of the blank line's `\r\n\r\n`), if it does.
pub(super) fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Parses the head `bytes` (everything before the blank line).
pub(super) fn parse_head(bytes: &[u8]) -> Result<RequestHead<'_>, BadRequest> {
    let text = std::str::from_utf8(bytes).map_err(|_| BadRequest::NotText)?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BadRequest::RequestLine);
    };
    let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
    if !method_ok || !target.starts_with('/') {
        return Err(BadRequest::RequestLine);
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        let shown: String = version.chars().take(16).collect();
        return Err(BadRequest::Version(shown));
    }
    let path = target.split_once('?').map_or(target, |(path, _query)| path);
    let mut content_length = None;
    let (mut host, mut origin, mut authorization) = (None, None, None);
    for line in lines {
        let (name, value) = line.split_once(':').ok_or(BadRequest::HeaderLine)?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(BadRequest::HeaderLine);
        }
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let length: usize = value.parse().map_err(|_| BadRequest::ContentLength)?;
            if content_length.is_some_and(|seen| seen != length) {
                return Err(BadRequest::ContentLength);
            }
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(BadRequest::TransferEncoding);
        }
        for (header, slot) in [
            ("Host", &mut host),
            ("Origin", &mut origin),
            ("Authorization", &mut authorization),
        ] {
            if name.eq_ignore_ascii_case(header) {
                // Two values would let a check read one and a proxy the other.
                if slot.replace(value).is_some() {
                    return Err(BadRequest::DuplicateHeader(header));
                }
            }
        }
    }
    Ok(RequestHead {
        method,
        path,
        content_length: content_length.unwrap_or(0),
        host,
        origin,
        authorization,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_get_parses_and_drops_the_query() {
        let head = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a:9464\r\nAccept: */*";
        assert_eq!(
            parse_head(head),
            Ok(RequestHead {
                method: "GET",
                path: "/metrics",
                content_length: 0,
                host: Some("a:9464"),
                origin: None,
                authorization: None,
            })
        );
    }

    #[test]
    fn host_origin_and_authorization_are_read_once_each() {
        let head = b"POST /pause HTTP/1.1\r\nhost: 127.0.0.1:9464\r\n\
                     ORIGIN: http://localhost\r\nAuthorization:  Bearer abc ";
        let head = parse_head(head).unwrap();
        assert_eq!(head.host, Some("127.0.0.1:9464"));
        assert_eq!(head.origin, Some("http://localhost"));
        assert_eq!(head.authorization, Some("Bearer abc"));
        let twice = b"POST /pause HTTP/1.1\r\nHost: a\r\nhost: b";
        assert_eq!(parse_head(twice), Err(BadRequest::DuplicateHeader("Host")));
    }

    #[test]
    fn content_length_is_read_case_insensitively_and_must_agree() {
        let head = b"POST /pause HTTP/1.1\r\ncontent-LENGTH:  12 ";
        assert_eq!(parse_head(head).map(|h| h.content_length), Ok(12));
        let twice = b"POST /pause HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1";
        assert_eq!(parse_head(twice).map(|h| h.content_length), Ok(1));
        let differ = b"POST /pause HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2";
        assert_eq!(parse_head(differ), Err(BadRequest::ContentLength));
        let negative = b"POST /pause HTTP/1.1\r\nContent-Length: -1";
        assert_eq!(parse_head(negative), Err(BadRequest::ContentLength));
    }

    #[test]
    fn malformed_heads_are_refused_with_a_reason() {
        let cases: [(&[u8], BadRequest); 8] = [
            (b"", BadRequest::RequestLine),
            (b"GET /metrics", BadRequest::RequestLine),
            (b"GET  /metrics HTTP/1.1", BadRequest::RequestLine),
            (b"get /metrics HTTP/1.1", BadRequest::RequestLine),
            (b"GET metrics HTTP/1.1", BadRequest::RequestLine),
            (b"GET / HTTP/2.0", BadRequest::Version("HTTP/2.0".into())),
            (b"GET / HTTP/1.1\r\nno colon here", BadRequest::HeaderLine),
            (b"GET / HTTP/1.1\r\n\xff\xfe: x", BadRequest::NotText),
        ];
        for (head, expected) in cases {
            assert_eq!(parse_head(head), Err(expected), "{head:?}");
        }
        let chunked = b"POST /pause HTTP/1.1\r\nTransfer-Encoding: chunked";
        assert_eq!(parse_head(chunked), Err(BadRequest::TransferEncoding));
        let spaced_name = b"GET / HTTP/1.1\r\nHost : x";
        assert_eq!(parse_head(spaced_name), Err(BadRequest::HeaderLine));
    }

    #[test]
    fn the_head_ends_at_the_first_blank_line() {
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\r\n\r\nbody\r\n\r\n"),
            Some(14)
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(find_head_end(b""), None);
    }
}
