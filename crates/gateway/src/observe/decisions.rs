//! Decision records: why each attempt went where it went, kept in a bounded ring for
//! `/admin/decisions`, the live page, the access log and the `x-kvgate-explain` header.
//!
//! A record holds the winner's [`Reason`] with its numbers and the top candidates as the pick
//! saw them: the prompt tokens the prefix index predicted each one holds, the gateway's own
//! requests in flight there before this pick, the engine's last scraped queue, and the policy's
//! own score where it ranks by one (`predicted_ttft`'s milliseconds, `kv_cost`'s cost). The ring
//! is a fixed number of records, so memory is bounded whatever the traffic.

use kvgate_core::index::Overlaps;
use kvgate_core::{EndpointId, EndpointView, Reason, Request};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Candidates kept per record besides the winner: enough to see the runner-up and the spread.
const TOP: usize = 4;

/// One candidate of a pick.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Its name.
    pub endpoint: Arc<str>,
    /// Prompt tokens the prefix index predicted it holds.
    pub matched_tokens: u32,
    /// The gateway's own requests in flight there before this pick.
    pub in_flight: u32,
    /// Running and waiting sequences at its last scrape, if it was scraped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_queue: Option<u32>,
    /// The policy's score, when it ranks by one (lower is better).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// For a request naming a LoRA adapter, where it stood there (running, free slot, waiting,
    /// full: `kvgate_core::lora::Affinity`) by the engine's last report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<kvgate_core::lora::Affinity>,
    /// Whether this one was picked.
    pub chosen: bool,
}

/// Why one attempt of one request went where it went. Built under the pool's lock at every
/// pick, so it holds numbers only; its time and reason are formatted when it is serialised.
#[derive(Clone, Debug)]
pub struct DecisionRecord {
    /// The gateway's id of the request (its `x-kvgate-request-id` response header).
    pub request: u64,
    /// Wall-clock time of the pick.
    pub at: SystemTime,
    /// `first`, `retry` or `hedge`.
    pub attempt: &'static str,
    /// The policy that decided.
    pub policy: &'static str,
    /// The requested model.
    pub model: Option<String>,
    /// The session, if the client named one.
    pub session: Option<String>,
    /// The LoRA adapter the request names.
    pub adapter: Option<String>,
    /// The estimated prompt length in tokens.
    pub prompt_tokens: u32,
    /// The chosen endpoint.
    pub endpoint: Arc<str>,
    /// Why, with the numbers; [`Reason::label`] and its `Display` are the record's `label`
    /// and `why`.
    pub reason: Reason,
    /// What the policy's score means (`predicted_ttft_ms`, `cost`), when it has one.
    pub score: Option<&'static str>,
    /// The winner and the best of the others, best first.
    pub candidates: Vec<Candidate>,
    /// When the LoRA gate held the request before this pick.
    pub lora_hold: Option<GateNote>,
}

/// How the LoRA gate held a request before its pick (`kvgate_core::lora::LoraGate`).
#[derive(Clone, Debug, Serialize)]
pub struct GateNote {
    /// The endpoint it was held for.
    pub endpoint: Arc<str>,
    /// The adapter that waited there behind the batch of the request's adapter.
    pub behind: String,
    /// How long it was held.
    pub held_ms: f64,
    /// Why it went: `released` (that adapter's turn started) or `bound` (`max_hold_ms`).
    pub released: &'static str,
}

impl Serialize for DecisionRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Json<'a> {
            request: u64,
            at: String,
            attempt: &'static str,
            policy: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            model: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            session: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            adapter: Option<&'a str>,
            prompt_tokens: u32,
            endpoint: &'a str,
            label: &'static str,
            why: String,
            reason: &'a Reason,
            #[serde(skip_serializing_if = "Option::is_none")]
            score: Option<&'static str>,
            candidates: &'a [Candidate],
            #[serde(skip_serializing_if = "Option::is_none")]
            lora_hold: Option<&'a GateNote>,
        }
        Json {
            request: self.request,
            at: humantime::format_rfc3339_millis(self.at).to_string(),
            attempt: self.attempt,
            policy: self.policy,
            model: self.model.as_deref(),
            session: self.session.as_deref(),
            adapter: self.adapter.as_deref(),
            prompt_tokens: self.prompt_tokens,
            endpoint: &self.endpoint,
            label: self.reason.label(),
            why: self.reason.to_string(),
            reason: &self.reason,
            score: self.score,
            candidates: &self.candidates,
            lora_hold: self.lora_hold.as_ref(),
        }
        .serialize(serializer)
    }
}

/// What a pick saw, borrowed from the pool's state while it holds its lock.
pub(crate) struct PickScene<'a> {
    /// The request.
    pub(crate) request: &'a Request,
    /// Which attempt.
    pub(crate) attempt: &'static str,
    /// The policy's name.
    pub(crate) policy: &'static str,
    /// The fleet as the router sees it, after the dispatch was recorded.
    pub(crate) views: &'a [EndpointView],
    /// The prefix index's overlaps for this prompt.
    pub(crate) overlaps: &'a Overlaps,
    /// The policy's scores by fleet position.
    pub(crate) scores: Option<(&'static str, &'a [(usize, f64)])>,
}

impl DecisionRecord {
    /// The record of a pick that chose `chosen` for `reason`; `eligible` says which views were
    /// candidates and `name` names them.
    pub(crate) fn new(
        scene: &PickScene<'_>,
        (chosen, reason): (EndpointId, &Reason),
        eligible: impl Fn(&EndpointView) -> bool,
        name: impl Fn(EndpointId) -> Arc<str>,
    ) -> Self {
        let request = scene.request;
        let mut score_at = vec![None; scene.views.len()];
        for &(i, score) in scene.scores.map_or(&[][..], |(_, s)| s) {
            if let Some(slot) = score_at.get_mut(i) {
                *slot = Some(score);
            }
        }
        // Rank on numbers first; only the kept few get their names.
        let mut ranked: Vec<(EndpointId, Candidate)> = scene
            .views
            .iter()
            .zip(score_at)
            .filter(|(v, _)| v.id == chosen || eligible(v))
            .map(|(v, score)| {
                let candidate = Candidate {
                    endpoint: Arc::from(""),
                    matched_tokens: scene.overlaps.cached_tokens(v.id, request.prompt_tokens),
                    in_flight: v.own_inflight - u32::from(v.id == chosen && v.own_inflight > 0),
                    engine_queue: v.observation.map(|o| o.running + o.waiting),
                    score,
                    adapter: request.adapter.as_deref().map(|a| {
                        v.adapters
                            .as_ref()
                            .map_or(kvgate_core::lora::Affinity::Unknown, |s| s.affinity(a))
                    }),
                    chosen: v.id == chosen,
                };
                (v.id, candidate)
            })
            .collect();
        // Best first: the winner, then by score where the policy has one, else by match and load.
        ranked.sort_by(|(_, a), (_, b)| {
            b.chosen
                .cmp(&a.chosen)
                .then_with(|| match (a.score, b.score) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    _ => b
                        .matched_tokens
                        .cmp(&a.matched_tokens)
                        .then(a.in_flight.cmp(&b.in_flight)),
                })
        });
        ranked.truncate(TOP + 1);
        let candidates = ranked
            .into_iter()
            .map(|(id, c)| Candidate {
                endpoint: name(id),
                ..c
            })
            .collect();
        DecisionRecord {
            request: request.id,
            at: SystemTime::now(),
            attempt: scene.attempt,
            policy: scene.policy,
            model: request.model.clone(),
            session: request.session.clone(),
            adapter: request.adapter.clone(),
            prompt_tokens: request.prompt_tokens,
            endpoint: name(chosen),
            reason: reason.clone(),
            score: scene.scores.map(|(n, _)| n),
            candidates,
            lora_hold: None,
        }
    }

    /// A one-line summary for the `x-kvgate-explain` response header: the label, the reason,
    /// then each candidate as `name(matched tokens, in flight[, score])`.
    pub fn summary(&self) -> String {
        let mut out = format!("{} ({});", self.reason.label(), self.reason);
        if let Some(h) = &self.lora_hold {
            out.push_str(&format!(
                " lora gate: held {:.0} ms behind adapter {} at {} ({});",
                h.held_ms, h.behind, h.endpoint, h.released
            ));
        }
        out.push_str(" candidates:");
        for c in &self.candidates {
            out.push_str(&format!(
                " {}{}(matched {}, in flight {}",
                if c.chosen { "*" } else { "" },
                c.endpoint,
                c.matched_tokens,
                c.in_flight
            ));
            if let (Some(s), Some(name)) = (c.score, self.score) {
                out.push_str(&format!(", {name} {s:.1}"));
            }
            out.push(')');
        }
        out
    }
}

/// The most recent decision records.
#[derive(Debug)]
pub(crate) struct DecisionRing {
    capacity: usize,
    records: Mutex<VecDeque<Arc<DecisionRecord>>>,
}

impl DecisionRing {
    /// A ring keeping the last `capacity` records (none when 0).
    pub(crate) fn new(capacity: usize) -> Self {
        DecisionRing {
            capacity,
            records: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    /// Keeps `record`, dropping the oldest when full.
    pub(crate) fn push(&self, record: Arc<DecisionRecord>) {
        if self.capacity == 0 {
            return;
        }
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.len() == self.capacity {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// Up to `limit` records, newest first, optionally only those of `request`.
    pub(crate) fn recent(&self, limit: usize, request: Option<u64>) -> Vec<Arc<DecisionRecord>> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records
            .iter()
            .rev()
            .filter(|r| request.is_none_or(|id| r.request == id))
            .take(limit)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::index::{Overlap, Unit};

    fn views() -> Vec<EndpointView> {
        (0..6)
            .map(|i| {
                let mut v = EndpointView::new(EndpointId(i));
                v.own_inflight = i;
                v
            })
            .collect()
    }

    fn record(scores: Option<(&'static str, &[(usize, f64)])>) -> DecisionRecord {
        let request = Request::from_text(7, "x".repeat(400)).with_session("s");
        let views = views();
        let mut overlaps = Overlaps::default();
        overlaps.total = 400;
        overlaps.unit = Unit::Bytes;
        overlaps.endpoints.push(Overlap {
            endpoint: EndpointId(3),
            device: 200,
            ..Overlap::default()
        });
        let scene = PickScene {
            request: &request,
            attempt: "first",
            policy: "cache_aware",
            views: &views,
            overlaps: &overlaps,
            scores,
        };
        let reason = Reason::PrefixAffinity {
            matched: 200,
            total: 400,
        };
        DecisionRecord::new(
            &scene,
            (EndpointId(3), &reason),
            |v| v.id != EndpointId(5),
            |id| format!("e{}", id.0).into(),
        )
    }

    #[test]
    fn winner_first_then_best_match_and_least_load_and_bounded() {
        let r = record(None);
        let names: Vec<&str> = r.candidates.iter().map(|c| &*c.endpoint).collect();
        // e5 is not eligible; e3 won; the rest by load (no match elsewhere).
        assert_eq!(names, ["e3", "e0", "e1", "e2", "e4"]);
        assert_eq!(r.candidates[0].matched_tokens, 50);
        assert_eq!(r.candidates[0].in_flight, 2, "before this pick");
        assert_eq!(r.reason.label(), "affinity");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["label"], "affinity");
        assert_eq!(json["why"], "prefix affinity (200/400 matched)");
        assert!(json["at"].as_str().unwrap().ends_with('Z'));
        assert!(r.summary().starts_with("affinity (prefix affinity (200/400 matched)); candidates: *e3(matched 50, in flight 2)"), "{}", r.summary());
    }

    #[test]
    fn scores_order_the_others() {
        let scores = [(0, 9.0), (1, 3.0), (2, 5.0), (3, 1.0), (4, 2.0)];
        let r = record(Some(("predicted_ttft_ms", &scores)));
        let names: Vec<&str> = r.candidates.iter().map(|c| &*c.endpoint).collect();
        assert_eq!(names, ["e3", "e4", "e1", "e2", "e0"]);
        assert_eq!(r.candidates[1].score, Some(2.0));
        assert!(r
            .summary()
            .contains("e4(matched 0, in flight 4, predicted_ttft_ms 2.0)"));
    }

    #[test]
    fn ring_keeps_the_newest() {
        let ring = DecisionRing::new(3);
        for id in 0..5 {
            let mut r = record(None);
            r.request = id;
            ring.push(Arc::new(r));
        }
        let ids: Vec<u64> = ring.recent(10, None).iter().map(|r| r.request).collect();
        assert_eq!(ids, [4, 3, 2]);
        assert_eq!(ring.recent(10, Some(3))[0].request, 3);
        assert!(ring.recent(10, Some(0)).is_empty());
        let off = DecisionRing::new(0);
        off.push(Arc::new(record(None)));
        assert!(off.recent(10, None).is_empty());
    }
}
