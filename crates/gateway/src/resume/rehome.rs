//! Re-homing the sessions a lost endpoint served (`resume.rehome_s`, a 10 s window by default).
//!
//! A session's context is cached on the endpoint its last turn ran on. When that endpoint
//! breaks a stream or refuses a connection, its cache may be gone (a crash, a restart); when its
//! scrape shows a new process ([`crate::engine_state::Incarnation`]), it is gone. Then the
//! session's next turn would recompute the whole conversation wherever it goes: on agentic
//! traffic those recomputes are much of the TTFT tail after a loss (docs/routing.md, Limits, A
//! lost replica). The gateway still has the turn it sent, so it sends that prompt again for one
//! token, a warm-up, to another endpoint, during the session's think time: the next turn then
//! finds all but its newest messages cached there, and the policy's index says so.
//!
//! Each warm-up is placed as a continuation is (`crate::relay`'s `place`: the per-endpoint gate, only
//! to endpoints whose engine metrics the gateway reads) and yields for the whole window to
//! requests awaiting a first token; it is staged in heads when continuations are
//! (`stage_tokens`), so a request arriving there waits behind one piece, not a conversation.
//! It is dropped once the session's next turn has come (that turn does the recompute itself).
//! It starts on the first sign, confirmed by a probe and not left to a health verdict: the sim
//! measured that starting one to four seconds late keeps less than half of the gain
//! (`rehome_delay_ms`, docs/routing.md). The sign is a stream broken or a connection failed
//! there, confirmed when the engine then does not answer a scrape ([`Rehome::should_probe`]), or a
//! scrape showing a new process. This is the record of sessions and decisions; the probes and
//! warm-ups are sent by `crate::relay::rehome`.
//! Only turns whose answers ended are warmed; a stream the endpoint broke is continued, and
//! the continuation warms its session. Re-homing starts at most once per window per endpoint.

use super::ResumeConfig;
use crate::clock::Clock;
use crate::upstream::Sending;
use bytes::Bytes;
use kvgate_core::dispatch::RehomeBook;
use kvgate_core::{EndpointId, Nanos, Request};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A session's last turn, as the gateway sent it.
#[derive(Clone, Debug)]
pub(crate) struct Turn {
    pub(crate) request: Arc<Request>,
    pub(crate) body: Bytes,
    pub(crate) sending: Sending,
}

/// Each session's last turn and which endpoints re-homing started for: the dispatch core's
/// record (`kvgate_core::dispatch::RehomeBook`, the simulator keeps the same) under a lock, on
/// the pool's clock.
#[derive(Debug)]
pub(crate) struct Rehome {
    clock: Clock,
    book: Mutex<RehomeBook<String, Turn>>,
}

impl Rehome {
    pub(crate) fn new(config: &ResumeConfig, clock: Clock) -> Self {
        let window = Nanos::from_millis(config.rehome_s.saturating_mul(1_000));
        let book = RehomeBook::new(window, config.rehome_sessions, config.rehome_bytes);
        Rehome {
            clock,
            book: Mutex::new(book),
        }
    }

    fn book(&self) -> MutexGuard<'_, RehomeBook<String, Turn>> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Request `request` of a session is being answered (its first bytes came): it is the
    /// session's last turn now. Requests without a session are not kept.
    pub(crate) fn answered(&self, request: &Arc<Request>, body: &Bytes, sending: &Sending) {
        let Some(session) = sending.session.clone() else {
            return;
        };
        let turn = Turn {
            request: request.clone(),
            body: body.clone(),
            sending: sending.clone(),
        };
        let now = self.clock.now();
        self.book()
            .remember(session, request.id, turn, body.len(), now);
    }

    /// Request `id`'s answer ended on `endpoint` (where a continuation finished it, when its
    /// stream broke): the session's context is cached there now.
    pub(crate) fn ended(&self, id: u64, endpoint: EndpointId) {
        let now = self.clock.now();
        self.book().ended(id, endpoint, now);
    }

    /// Whether request `id` is still the last turn of `session`.
    pub(crate) fn current(&self, session: &str, id: u64) -> bool {
        self.book().current(&session.to_owned(), id)
    }

    /// `endpoint` broke a stream or failed a connection: whether to probe it now
    /// (`RehomeBook::should_probe`); a `true` must be followed by [`Rehome::probed`].
    pub(crate) fn should_probe(&self, endpoint: EndpointId) -> bool {
        let now = self.clock.now();
        self.book().should_probe(endpoint, now)
    }

    /// The probe of `endpoint` is over.
    pub(crate) fn probed(&self, endpoint: EndpointId) {
        self.book().probed(endpoint);
    }

    /// How long after a loss its sessions' warm-ups may wait for a place.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.book().window().0)
    }

    /// `lost` is gone now: the sessions to warm elsewhere, the most recent first.
    pub(crate) fn displaced(&self, lost: EndpointId) -> Vec<(String, Turn)> {
        let now = self.clock.now();
        let displaced = self.book().displaced(lost, now);
        displaced
            .into_iter()
            .map(|(session, _, turn)| (session, turn))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Api;
    use axum::http::HeaderMap;

    fn sending(session: Option<&str>) -> Sending {
        Sending {
            client: crate::upstream::client(&[]).unwrap(),
            api: Api::Chat,
            forwarded: Arc::new(HeaderMap::new()),
            first_token_timeout: None,
            max_retry_after: Duration::from_secs(1),
            session: session.map(str::to_string),
        }
    }

    fn request(id: u64) -> Arc<Request> {
        Arc::new(Request {
            id,
            ..Request::default()
        })
    }

    /// The record's rules are the dispatch core's (tested there); this is what the gateway
    /// feeds it: sessions by name, bodies by their bytes, time from the pool's clock.
    #[tokio::test]
    async fn the_gateway_keeps_sessions_turns_by_their_bytes_on_its_clock() {
        let clock = Clock::manual();
        let r = Rehome::new(
            &ResumeConfig {
                rehome_s: 10,
                rehome_bytes: 2_500,
                ..ResumeConfig::default()
            },
            clock.clone(),
        );
        let body = Bytes::from(vec![b' '; 1_000]);
        for (id, s) in ["s1", "s2", "s3"].iter().enumerate() {
            let id = id as u64;
            r.answered(&request(id), &body, &sending(Some(s)));
            r.ended(id, EndpointId(0));
        }
        assert!(!r.current("s1", 0) && r.current("s2", 1) && r.current("s3", 2));
        r.answered(&request(9), &body, &sending(None));
        assert_eq!(r.book().kept(), (2, 2_000), "no session, not kept");
        clock.advance(Duration::from_secs(3));
        let displaced = r.displaced(EndpointId(0));
        let names: Vec<&str> = displaced.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["s2", "s3"]);
        assert_eq!(displaced[1].1.request.id, 2);
        clock.advance(Duration::from_secs(8));
        r.answered(&request(10), &body, &sending(Some("s4")));
        assert!(!r.current("s2", 1), "ended a window ago: let go");
    }
}
