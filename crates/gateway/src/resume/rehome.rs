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
use crate::upstream::Sending;
use bytes::Bytes;
use kvgate_core::{EndpointId, Request};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The last turn of each session, and when re-homing last started per endpoint.
#[derive(Debug)]
pub(crate) struct Rehome {
    window: Duration,
    capacity: usize,
    max_bytes: usize,
    turns: Mutex<Turns>,
}

#[derive(Debug, Default)]
struct Turns {
    by_session: HashMap<String, Turn>,
    /// Sessions in the order their turns came, with the turn's request id: the oldest give
    /// way first. An entry whose session has a newer turn since is stale and skipped.
    order: VecDeque<(String, u64)>,
    /// Sessions by the request id of a turn whose answer has not ended.
    open: HashMap<u64, String>,
    /// When re-homing last started for an endpoint.
    started: HashMap<EndpointId, Instant>,
    /// Endpoints being probed after a sign of loss.
    probing: HashSet<EndpointId>,
    /// The kept turns' bodies, bytes.
    bytes: usize,
}

impl Turns {
    fn remove(&mut self, session: &str) {
        if let Some(old) = self.by_session.remove(session) {
            self.open.remove(&old.request.id);
            self.bytes -= old.body.len();
        }
    }
}

/// A session's last turn, as the gateway sent it.
#[derive(Clone, Debug)]
pub(crate) struct Turn {
    pub(crate) request: Arc<Request>,
    pub(crate) body: Bytes,
    pub(crate) sending: Sending,
    endpoint: EndpointId,
    /// When its answer ended; `None` while it is being answered.
    ended: Option<Instant>,
}

impl Rehome {
    pub(crate) fn new(config: &ResumeConfig) -> Self {
        Rehome {
            window: Duration::from_secs(config.rehome_s),
            capacity: config.rehome_sessions.max(1),
            max_bytes: config.rehome_bytes,
            turns: Mutex::default(),
        }
    }

    fn on(&self) -> bool {
        !self.window.is_zero()
    }

    /// Whether `at` is within the window before `now`.
    fn recent(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) < self.window
    }

    /// Whether `turn` ended on `endpoint` within the window before `now`: a session re-homing
    /// `endpoint` would warm.
    fn homed(&self, turn: &Turn, endpoint: EndpointId, now: Instant) -> bool {
        turn.endpoint == endpoint && turn.ended.is_some_and(|e| self.recent(e, now))
    }

    fn turns(&self) -> std::sync::MutexGuard<'_, Turns> {
        self.turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Request `request` of a session is being answered by `endpoint` (its first bytes came):
    /// it is the session's last turn now.
    pub(crate) fn answered(
        &self,
        request: &Arc<Request>,
        body: &Bytes,
        sending: &Sending,
        endpoint: EndpointId,
    ) {
        let Some(session) = sending.session.as_ref().filter(|_| self.on()) else {
            return;
        };
        let mut t = self.turns();
        let turn = Turn {
            request: request.clone(),
            body: body.clone(),
            sending: sending.clone(),
            endpoint,
            ended: None,
        };
        t.remove(session);
        t.bytes += body.len();
        t.by_session.insert(session.clone(), turn);
        t.open.insert(request.id, session.clone());
        t.order.push_back((session.clone(), request.id));
        while t.by_session.len() > self.capacity || t.bytes > self.max_bytes {
            let Some((oldest, id)) = t.order.pop_front() else {
                break;
            };
            if t.by_session
                .get(&oldest)
                .is_some_and(|o| o.request.id == id)
            {
                t.remove(&oldest);
            }
        }
        // A turn whose answer ended a window ago is never warmed: let it go, so that what is
        // kept is the sessions active within the window, not the bounds' worth of old bodies.
        let now = Instant::now();
        while let Some((front, id)) = t.order.front() {
            let expired = match t.by_session.get(front) {
                Some(o) if o.request.id == *id => o.ended.is_some_and(|e| !self.recent(e, now)),
                // Stale: the session has a newer turn behind.
                _ => true,
            };
            if !expired {
                break;
            }
            if let Some((front, id)) = t.order.pop_front() {
                if t.by_session.get(&front).is_some_and(|o| o.request.id == id) {
                    t.remove(&front);
                }
            }
        }
        // Sessions that keep coming back leave stale entries behind: drop them once they
        // outnumber the live ones.
        if t.order.len() > 2 * self.capacity {
            let Turns {
                order, by_session, ..
            } = &mut *t;
            order.retain(|(s, id)| by_session.get(s).is_some_and(|o| o.request.id == *id));
        }
    }

    /// Request `id`'s answer ended on `endpoint` (where a continuation finished it, when its
    /// stream broke): the session's context is cached there now.
    pub(crate) fn ended(&self, id: u64, endpoint: EndpointId) {
        if !self.on() {
            return;
        }
        let mut t = self.turns();
        let Some(session) = t.open.remove(&id) else {
            return;
        };
        if let Some(turn) = t.by_session.get_mut(&session) {
            turn.ended = Some(Instant::now());
            turn.endpoint = endpoint;
        }
    }

    /// Whether request `id` is still the last turn of `session`.
    pub(crate) fn current(&self, session: &str, id: u64) -> bool {
        self.turns()
            .by_session
            .get(session)
            .is_some_and(|t| t.request.id == id)
    }

    /// `endpoint` broke a stream or failed a connection: whether to probe it now. One probe per
    /// endpoint at a time, none while re-homing for it started within the window, and none when
    /// no session's last turn ended there within it (traffic without sessions has nothing to
    /// re-home). A `true` must be followed by [`Rehome::probed`].
    pub(crate) fn should_probe(&self, endpoint: EndpointId) -> bool {
        if !self.on() {
            return false;
        }
        let now = Instant::now();
        let mut t = self.turns();
        let started = t
            .started
            .get(&endpoint)
            .is_some_and(|&at| self.recent(at, now));
        let homed = t
            .by_session
            .values()
            .any(|turn| self.homed(turn, endpoint, now));
        !started && homed && t.probing.insert(endpoint)
    }

    /// The probe of `endpoint` is over.
    pub(crate) fn probed(&self, endpoint: EndpointId) {
        self.turns().probing.remove(&endpoint);
    }

    /// How long after a loss its sessions' warm-ups may wait for a place.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// The sessions to warm when `lost` is lost at `now`: those whose last turn ended there
    /// within the window, the most recent first; none when re-homing is off or started for
    /// `lost` within the window already.
    pub(crate) fn displaced(&self, lost: EndpointId, now: Instant) -> Vec<(String, Turn)> {
        if !self.on() {
            return Vec::new();
        }
        let mut t = self.turns();
        if t.started.get(&lost).is_some_and(|&at| self.recent(at, now)) {
            return Vec::new();
        }
        t.started.insert(lost, now);
        let mut displaced: Vec<(String, Turn)> = t
            .by_session
            .iter()
            .filter(|(_, turn)| self.homed(turn, lost, now))
            .map(|(s, turn)| (s.clone(), turn.clone()))
            .collect();
        displaced.sort_by(|a, b| b.1.ended.cmp(&a.1.ended).then_with(|| a.0.cmp(&b.0)));
        displaced
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Api;
    use axum::http::HeaderMap;

    fn rehome(window_s: u64, sessions: usize) -> Rehome {
        Rehome::new(&ResumeConfig {
            rehome_s: window_s,
            rehome_sessions: sessions,
            ..ResumeConfig::default()
        })
    }

    #[tokio::test]
    async fn the_kept_bodies_stay_within_their_bound() {
        let r = Rehome::new(&ResumeConfig {
            rehome_s: 10,
            rehome_bytes: 2_500,
            ..ResumeConfig::default()
        });
        let body = Bytes::from(vec![b' '; 1_000]);
        for (id, s) in ["s1", "s2", "s3"].iter().enumerate() {
            let id = id as u64;
            r.answered(&request(id), &body, &sending(Some(s)), EndpointId(0));
            r.ended(id, EndpointId(0));
        }
        assert!(!r.current("s1", 0) && r.current("s2", 1) && r.current("s3", 2));
        // A newer turn of a kept session replaces its body, not adds to it.
        r.answered(&request(3), &body, &sending(Some("s3")), EndpointId(0));
        assert!(r.current("s2", 1) && r.current("s3", 3));
        assert_eq!(r.turns().bytes, 2_000);
    }

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

    /// Request `id` of `session` answered by endpoint `at` and ended there.
    fn turn(r: &Rehome, session: &str, id: u64, at: u32) {
        let body = Bytes::from_static(b"{}");
        r.answered(&request(id), &body, &sending(Some(session)), EndpointId(at));
        r.ended(id, EndpointId(at));
    }

    fn sessions(displaced: &[(String, Turn)]) -> Vec<&str> {
        displaced.iter().map(|(s, _)| s.as_str()).collect()
    }

    #[tokio::test]
    async fn a_session_s_next_turn_replaces_its_last_and_only_ended_turns_are_warmed() {
        let r = rehome(10, 16);
        turn(&r, "s1", 1, 0);
        assert!(r.current("s1", 1));
        turn(&r, "s1", 2, 0);
        assert!(!r.current("s1", 1) && r.current("s1", 2));
        // Still being answered: a stream that breaks is continued, which warms its session.
        let body = Bytes::from_static(b"{}");
        r.answered(&request(3), &body, &sending(Some("s2")), EndpointId(0));
        // Ended on endpoint 1 (a continuation finished it there): not endpoint 0's.
        turn(&r, "s3", 4, 0);
        r.answered(&request(5), &body, &sending(Some("s3")), EndpointId(0));
        r.ended(5, EndpointId(1));
        assert_eq!(
            sessions(&r.displaced(EndpointId(0), Instant::now())),
            ["s1"]
        );
        assert!(r.current("s2", 3));
    }

    #[tokio::test]
    async fn re_homing_starts_once_per_window_per_endpoint_and_not_at_all_when_off() {
        let r = rehome(10, 16);
        turn(&r, "s1", 1, 0);
        turn(&r, "s2", 2, 1);
        let now = Instant::now();
        assert_eq!(sessions(&r.displaced(EndpointId(0), now)), ["s1"]);
        assert!(r
            .displaced(EndpointId(0), now + Duration::from_secs(5))
            .is_empty());
        assert_eq!(sessions(&r.displaced(EndpointId(1), now)), ["s2"]);
        // A window later the turns are too old to warm.
        let later = now + Duration::from_secs(11);
        assert!(r.displaced(EndpointId(0), later).is_empty());
        let off = rehome(0, 16);
        turn(&off, "s1", 1, 0);
        assert!(!off.current("s1", 1));
        assert!(off.displaced(EndpointId(0), now).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn turns_that_ended_a_window_ago_are_let_go() {
        let r = rehome(10, 16);
        turn(&r, "s1", 1, 0);
        tokio::time::advance(Duration::from_secs(6)).await;
        turn(&r, "s2", 2, 0);
        // Still being answered after the window: kept.
        let body = Bytes::from_static(b"{}");
        r.answered(&request(3), &body, &sending(Some("s3")), EndpointId(0));
        tokio::time::advance(Duration::from_secs(5)).await;
        turn(&r, "s4", 4, 0);
        assert!(!r.current("s1", 1));
        assert!(r.current("s2", 2) && r.current("s3", 3) && r.current("s4", 4));
        assert_eq!(r.turns().bytes, 6);
    }

    #[tokio::test]
    async fn the_oldest_sessions_give_way_and_requests_without_one_are_not_kept() {
        let r = rehome(10, 2);
        for (id, s) in ["s1", "s2", "s3"].iter().enumerate() {
            turn(&r, s, id as u64, 0);
        }
        assert!(!r.current("s1", 0) && r.current("s2", 1) && r.current("s3", 2));
        // A session that keeps coming back does not grow the bookkeeping.
        for id in 3..100 {
            turn(&r, "s3", id, 0);
        }
        let t = r.turns();
        assert!(t.order.len() <= 5, "{}", t.order.len());
        assert!(t.open.is_empty());
        drop(t);
        let body = Bytes::from_static(b"{}");
        r.answered(&request(200), &body, &sending(None), EndpointId(0));
        assert_eq!(r.turns().by_session.len(), 2);
    }
}
