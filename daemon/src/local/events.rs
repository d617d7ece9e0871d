//! The lines a peer prints with `murmur run --progress`, parsed.
//!
//! One JSON object per line, each with an `"event"`. Lines that are not JSON objects are
//! ignored, and so are events this version does not know (a newer peer may print more);
//! a known event with a missing or mistyped field is an error that names the event and field.

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

/// One line of a peer's progress stream that `murmur local` uses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PeerEvent {
    /// The peer listens and has evaluated its starting model.
    Ready(Ready),
    /// Training progress, at most every 500 ms.
    Progress(Progress),
    /// A periodic eval.
    Eval(Eval),
    /// One averaging round ended.
    Round(Round),
    /// The peer's last line.
    Done(Done),
}

/// The `ready` event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Ready {
    pub(crate) peer: String,
    pub(crate) listen: Vec<String>,
    #[serde(default)]
    pub(crate) params: Option<u64>,
    pub(crate) initial_eval_loss: Option<f64>,
    #[serde(default)]
    pub(crate) loss_floor: Option<f64>,
    /// Where it trains: `cpu` or `cuda:N`.
    #[serde(default)]
    pub(crate) device: Option<String>,
}

/// The `progress` event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Progress {
    pub(crate) step: u64,
    pub(crate) samples: u64,
    pub(crate) loss: f64,
    pub(crate) samples_per_s: f64,
    pub(crate) bytes_sent: u64,
    #[serde(default)]
    pub(crate) bytes_received: u64,
    /// Peers this one knows of.
    #[serde(default)]
    pub(crate) peers: Option<u32>,
}

/// The `eval` event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Eval {
    pub(crate) step: u64,
    pub(crate) eval_loss: f64,
}

/// The `round` event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Round {
    pub(crate) outcome: String,
}

/// The `done` event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Done {
    pub(crate) step: u64,
    pub(crate) samples: u64,
    pub(crate) initial_eval_loss: Option<f64>,
    pub(crate) final_eval_loss: Option<f64>,
    #[serde(default)]
    pub(crate) loss_floor: Option<f64>,
    pub(crate) bytes_sent: u64,
    #[serde(default)]
    pub(crate) bytes_received: u64,
    #[serde(default)]
    pub(crate) raw_bytes: u64,
    /// The process's peak resident memory (`VmHWM`), where it could be read.
    #[serde(default)]
    pub(crate) peak_rss_bytes: Option<u64>,
    pub(crate) exit: DoneExit,
    #[serde(default)]
    pub(crate) error: Option<String>,
}

/// Why a peer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DoneExit {
    /// It ran all its steps.
    Finished,
    /// SIGINT or SIGTERM stopped it.
    Signal,
    /// It failed; `error` says why.
    Error,
}

/// A progress line that is a JSON object but not a valid event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum EventError {
    /// The object has no string `"event"` field.
    #[error("progress line is a JSON object without a string \"event\" field: {line}")]
    MissingEvent {
        /// The line, shortened.
        line: String,
    },
    /// A known event lacks a field or has one of the wrong type.
    #[error("malformed {event:?} event ({reason}): {line}")]
    Malformed {
        /// The event's name.
        event: String,
        /// serde's account of the field that was wrong.
        reason: String,
        /// The line, shortened.
        line: String,
    },
}

/// The longest part of a bad line quoted in an error.
const QUOTED_LINE_CHARS: usize = 200;

/// Parses one line: `Ok(None)` for lines that are not JSON objects and for unknown events.
pub(crate) fn parse_line(line: &str) -> Result<Option<PeerEvent>, EventError> {
    let trimmed = line.trim();
    if !trimmed.starts_with('{') {
        return Ok(None);
    }
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(trimmed) else {
        return Ok(None);
    };
    let Some(Value::String(event)) = object.get("event") else {
        return Err(EventError::MissingEvent {
            line: shorten(trimmed),
        });
    };
    let event = event.clone();
    let value = Value::Object(object);
    let parsed = match event.as_str() {
        "ready" => Ready::deserialize(value).map(PeerEvent::Ready),
        "progress" => Progress::deserialize(value).map(PeerEvent::Progress),
        "eval" => Eval::deserialize(value).map(PeerEvent::Eval),
        "round" => Round::deserialize(value).map(PeerEvent::Round),
        "done" => Done::deserialize(value).map(PeerEvent::Done),
        _ => return Ok(None),
    };
    parsed.map(Some).map_err(|e| EventError::Malformed {
        event,
        reason: e.to_string(),
        line: shorten(trimmed),
    })
}

fn shorten(line: &str) -> String {
    match line.char_indices().nth(QUOTED_LINE_CHARS) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_lines_parse() {
        let ready = r#"{"event":"ready","peer":"12D3KooWa","listen":["/ip4/127.0.0.1/udp/40000/quic-v1/p2p/12D3KooWa"],"params":104032,"initial_eval_loss":3.47,"loss_floor":1.0315,"metrics_addr":"127.0.0.1:40123"}"#;
        let Some(PeerEvent::Ready(r)) = parse_line(ready).unwrap() else {
            panic!("ready")
        };
        assert_eq!(r.listen.len(), 1);
        assert_eq!(r.params, Some(104_032));
        assert_eq!(r.loss_floor, Some(1.0315));

        let progress = r#"{"event":"progress","peer":"12D3KooWa","wall_s":1.52,"step":40,"samples":640,"loss":2.91,"samples_per_s":410.2,"bytes_sent":123456,"bytes_received":120000,"peers":3,"rounds":38,"mode":"sgp"}"#;
        let Some(PeerEvent::Progress(p)) = parse_line(progress).unwrap() else {
            panic!("progress")
        };
        assert_eq!((p.step, p.samples, p.bytes_sent), (40, 640, 123_456));

        let eval =
            r#"{"event":"eval","peer":"12D3KooWa","wall_s":3.10,"step":50,"eval_loss":2.65}"#;
        assert_eq!(
            parse_line(eval).unwrap(),
            Some(PeerEvent::Eval(Eval {
                step: 50,
                eval_loss: 2.65
            }))
        );

        let round = r#"{"event":"round","peer":"x","wall_s":3.2,"mode":"butterfly","outcome":"complete","duration_s":0.08,"coverage":1.0,"group":4}"#;
        assert!(matches!(
            parse_line(round).unwrap(),
            Some(PeerEvent::Round(Round { outcome })) if outcome == "complete"
        ));

        let done = r#"{"event":"done","peer":"x","wall_s":95.0,"step":600,"samples":9600,"initial_eval_loss":3.47,"final_eval_loss":1.18,"loss_floor":null,"bytes_sent":81234567,"bytes_received":80123456,"raw_bytes":324000000,"exit":"finished"}"#;
        let Some(PeerEvent::Done(d)) = parse_line(done).unwrap() else {
            panic!("done")
        };
        assert_eq!(d.exit, DoneExit::Finished);
        assert_eq!(d.loss_floor, None);
        assert_eq!(d.raw_bytes, 324_000_000);

        let failed = r#"{"event":"done","step":3,"samples":48,"initial_eval_loss":3.4,"final_eval_loss":null,"bytes_sent":0,"exit":"error","error":"no route"}"#;
        let Some(PeerEvent::Done(d)) = parse_line(failed).unwrap() else {
            panic!("done")
        };
        assert_eq!(d.exit, DoneExit::Error);
        assert_eq!(d.error.as_deref(), Some("no route"));
    }

    #[test]
    fn lines_that_are_not_json_objects_and_unknown_events_are_ignored() {
        for line in [
            "",
            "   ",
            "INFO starting",
            "[1,2,3]",
            "42",
            "{not json",
            r#"{"event":"hello","x":1}"#,
        ] {
            assert_eq!(parse_line(line), Ok(None), "{line:?}");
        }
    }

    #[test]
    fn malformed_events_name_the_event_and_field() {
        let e = parse_line(r#"{"event":"progress","step":"ten"}"#).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("\"progress\"") && text.contains("step"),
            "{text}"
        );

        let e = parse_line(r#"{"event":"done","step":1}"#).unwrap_err();
        assert!(e.to_string().contains("missing field"), "{e}");

        let e = parse_line(r#"{"event":"done","step":1,"samples":1,"initial_eval_loss":1,"final_eval_loss":1,"bytes_sent":1,"exit":"exploded"}"#).unwrap_err();
        assert!(e.to_string().contains("exploded"), "{e}");

        let e = parse_line(r#"{"step":1}"#).unwrap_err();
        assert!(matches!(e, EventError::MissingEvent { .. }));
        let e = parse_line(r#"{"event":7}"#).unwrap_err();
        assert!(matches!(e, EventError::MissingEvent { .. }));
    }

    #[test]
    fn quoted_lines_are_bounded() {
        let long = format!(r#"{{"event":"eval","pad":"{}"}}"#, "é".repeat(10_000));
        let e = parse_line(&long).unwrap_err().to_string();
        assert!(e.len() < 1_000, "{}", e.len());
    }
}
