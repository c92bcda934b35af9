//! What replicas say to each other on NATS: newline-delimited JSON, a header line naming the
//! sender, then one event per line. JSON keeps the messages readable with `nats sub` while
//! debugging; a batch is one NATS message of at most [`Batcher`]'s byte limit.
//!
//! Subjects (`<name>` is `cluster.name`): `kvgate.<name>.events` carries every replica's
//! events; `kvgate.<name>.warm.<replica>` carries a warm start to the replica that asked.

use crate::pool::PeerEnd;
use kvgate_core::decision::FailureKind;
use kvgate_core::{Nanos, Request, Usage};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The first line of every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    /// The sender's replica id (random per process).
    pub(crate) replica: u64,
    /// For a warm-start chunk, the hello it answers; 0 otherwise.
    #[serde(default)]
    pub(crate) hello: u64,
    /// For a warm-start chunk, whether it is the last.
    #[serde(default)]
    pub(crate) last: bool,
    /// Wall-clock microseconds when the message left (0: unknown), for the lag metric.
    #[serde(default)]
    pub(crate) at_us: u64,
}

pub(crate) use crate::clock::now_micros;

/// One event. Requests are named by the sender's own ids, endpoints by base URL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(crate) enum WireEvent {
    /// A request went to `endpoint`; in a warm start, `done` says it already ended.
    Dispatched {
        endpoint: Arc<str>,
        request: Request,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        done: bool,
    },
    /// Its first bytes came `ttft_ns` after dispatch: the prompt is now cached there. Only a
    /// stream's first bytes are a first token (a measure of the endpoint's speed).
    FirstToken {
        id: u64,
        endpoint: Arc<str>,
        ttft_ns: u64,
        #[serde(default)]
        stream: bool,
    },
    /// It completed.
    Completed {
        id: u64,
        endpoint: Arc<str>,
        latency_ns: u64,
        output_tokens: u32,
        usage: Option<Usage>,
    },
    /// It failed.
    Failed {
        id: u64,
        endpoint: Arc<str>,
        kind: FailureKind,
    },
    /// Taken from rate limiters.
    Limits {
        scopes: Vec<String>,
        requests: f64,
        input: f64,
        output: f64,
    },
    /// Spent per budget account.
    Spend { spent: Vec<(String, f64)> },
    /// A fan-out gate's claim or release.
    Fanout { event: crate::tenancy::FanoutEvent },
    /// The sender just joined or reconnected and asks for a warm start, tagged `nonce`.
    Hello { nonce: u64 },
    /// The sender is shutting down: drop its requests now.
    Bye,
    /// An answer the sender's semantic cache stored.
    CacheEntry { entry: crate::semcache::SharedEntry },
}

impl WireEvent {
    /// The end of a request, as the pool reports it.
    pub(crate) fn ended(id: u64, endpoint: Arc<str>, end: PeerEnd) -> Self {
        match end {
            PeerEnd::Completed {
                latency,
                output_tokens,
                usage,
            } => WireEvent::Completed {
                id,
                endpoint,
                latency_ns: latency.0,
                output_tokens,
                usage,
            },
            PeerEnd::Failed(kind) => WireEvent::Failed { id, endpoint, kind },
        }
    }

    /// The end this event reports, if it reports one.
    pub(crate) fn end(&self) -> Option<PeerEnd> {
        match *self {
            WireEvent::Completed {
                latency_ns,
                output_tokens,
                usage,
                ..
            } => Some(PeerEnd::Completed {
                latency: Nanos(latency_ns),
                output_tokens,
                usage,
            }),
            WireEvent::Failed { kind, .. } => Some(PeerEnd::Failed(kind)),
            _ => None,
        }
    }
}

/// A copy of `request` whose prompt keeps at most `max_bytes` of text (cut at a character
/// boundary) and an eighth as many token ids: the head is what other requests share, the tail
/// only this one, and a prompt of megabytes is never copied whole.
pub(crate) fn capped(request: &Request, max_bytes: usize) -> Request {
    let text = request.prompt.text.as_deref().map(|text| {
        let mut cut = max_bytes.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text[..cut].to_owned()
    });
    let tokens = request
        .prompt
        .tokens
        .as_deref()
        .map(|t| t[..t.len().min(max_bytes / 8)].to_vec());
    Request {
        prompt: kvgate_core::Prompt { text, tokens },
        tenant: request.tenant.clone(),
        session: request.session.clone(),
        model: request.model.clone(),
        adapter: request.adapter.clone(),
        ..*request
    }
}

/// Room kept for the header line, which is written when a message leaves (its time).
const HEADER_ROOM: usize = 160;

/// Builds messages of at most `limit` bytes from a header and events.
#[derive(Debug)]
pub(crate) struct Batcher {
    header: Header,
    limit: usize,
    /// The events so far, each after a newline.
    buf: Vec<u8>,
    events: usize,
}

impl Batcher {
    pub(crate) fn new(header: Header, limit: usize) -> Self {
        Batcher {
            header,
            limit,
            buf: Vec::new(),
            events: 0,
        }
    }

    /// Adds `event`; returns the full message that had to be cut first to make room, if any.
    /// An event larger than the limit on its own is refused (`Err`).
    pub(crate) fn push(&mut self, event: &WireEvent) -> Result<Option<Vec<u8>>, ()> {
        let line = serde_json::to_vec(event).map_err(|_| ())?;
        if HEADER_ROOM + 1 + line.len() > self.limit {
            return Err(());
        }
        let full = (HEADER_ROOM + self.buf.len() + 1 + line.len() > self.limit)
            .then(|| self.take())
            .flatten();
        self.buf.push(b'\n');
        self.buf.extend_from_slice(&line);
        self.events += 1;
        Ok(full)
    }

    /// Events held.
    pub(crate) fn len(&self) -> usize {
        self.events
    }

    /// The message so far (`None` with no event), stamped now, and a fresh start.
    pub(crate) fn take(&mut self) -> Option<Vec<u8>> {
        if self.events == 0 {
            return None;
        }
        let mut out = self.heartbeat();
        out.append(&mut self.buf);
        self.events = 0;
        Some(out)
    }

    /// The header alone, stamped now: a heartbeat.
    pub(crate) fn heartbeat(&self) -> Vec<u8> {
        let header = Header {
            at_us: now_micros(),
            ..self.header
        };
        // A header of plain numbers and a bool always serializes.
        serde_json::to_vec(&header).unwrap_or_default()
    }

    /// Sets the header of the messages to come (a warm start's `last`).
    pub(crate) fn set_header(&mut self, header: Header) {
        self.header = header;
    }
}

/// A message's header and events; a line that does not parse is skipped and counted.
pub(crate) fn decode(payload: &[u8]) -> Option<(Header, Vec<WireEvent>, usize)> {
    let mut lines = payload.split(|&b| b == b'\n');
    let header: Header = serde_json::from_slice(lines.next()?).ok()?;
    let mut bad = 0;
    let events = lines
        .filter_map(|l| {
            let e = serde_json::from_slice(l).ok();
            bad += usize::from(e.is_none());
            e
        })
        .collect();
    Some((header, events, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatched(text: &str) -> WireEvent {
        WireEvent::Dispatched {
            endpoint: "http://a".into(),
            request: Request::from_text(3, text).with_session("s"),
            done: false,
        }
    }

    #[test]
    fn batches_round_trip_and_respect_the_limit() {
        let header = Header {
            replica: 9,
            hello: 0,
            last: false,
            at_us: 0,
        };
        let mut b = Batcher::new(header, 600);
        let mut messages = Vec::new();
        let events: Vec<WireEvent> = (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    dispatched(&"x".repeat(100))
                } else {
                    WireEvent::ended(
                        i,
                        "http://b".into(),
                        PeerEnd::Completed {
                            latency: Nanos(5),
                            output_tokens: 2,
                            usage: Some(Usage {
                                prompt_tokens: 30,
                                cached_tokens: Some(16),
                                output_tokens: 2,
                            }),
                        },
                    )
                }
            })
            .collect();
        for e in &events {
            messages.extend(b.push(e).unwrap());
        }
        messages.extend(b.take());
        assert!(messages.len() > 1);
        let mut back = Vec::new();
        for m in &messages {
            assert!(m.len() <= 600, "{}", m.len());
            let (h, ev, bad) = decode(m).unwrap();
            assert!(h.at_us > 0);
            assert_eq!((Header { at_us: 0, ..h }, bad), (header, 0));
            back.extend(ev);
        }
        assert_eq!(back, events);
        assert!(b.push(&dispatched(&"y".repeat(500))).is_err());
        assert_eq!(decode(&b.heartbeat()).unwrap().1.len(), 0);
    }

    #[test]
    fn prompts_are_cut_at_a_character_boundary() {
        let mut r = Request::from_text(1, "héllo wörld").with_session("s");
        r.prompt.tokens = Some((0..100).collect());
        let c = capped(&r, 2);
        assert_eq!(c.prompt.text.as_deref(), Some("h"));
        assert!(c.prompt.tokens.as_ref().unwrap().is_empty());
        assert_eq!(
            (c.id, c.session, c.prompt_tokens),
            (r.id, r.session.clone(), r.prompt_tokens)
        );
        let r = Request::from_text(1, "abc");
        assert_eq!(capped(&r, 8), r);
    }

    #[test]
    fn garbage_is_refused_and_bad_lines_are_counted() {
        assert!(decode(b"not json").is_none());
        let (_, events, bad) =
            decode(b"{\"replica\":1}\n{\"t\":\"bye\"}\n{\"t\":\"nope\"}").unwrap();
        assert_eq!((events, bad), (vec![WireEvent::Bye], 1));
    }
}
