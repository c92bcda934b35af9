//! Re-homing the sessions a lost replica held (`FleetConfig::rehome`).
//!
//! A session whose last turn ran on the replica that died has lost its cached context: its
//! next turn recomputes the whole conversation wherever it goes, and on agentic traffic those
//! recomputes are most of the TTFT tail after a loss at moderate load (docs/routing.md, Limits,
//! "A lost replica"). The router still has the turn it sent, so it can send that prompt again
//! for one token, a warm-up, during the session's think time: the next turn then finds all but
//! its newest messages cached. A warm-up has no client. It waits at the router behind the
//! continuations, goes only to a replica where no request of its router awaits a first token
//! (it yields without a bound: once the session's next turn arrives it is dropped, since that
//! turn does the recompute itself), and is left out of every latency figure. When continuations
//! are staged (`resume_stage`) so is a warm-up: its prompt goes in growing heads, each after
//! the one before, so a request arriving at that replica waits behind one piece, not a whole
//! conversation (docs/routing.md, Limits, A lost replica).

use super::Sim;
use kvgate_core::dispatch::RehomeBook;
use kvgate_core::{EndpointId, Nanos};

/// What a warm-up warms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Warmup {
    /// A head of a staged continuation's prompt.
    ContinuationHead,
    /// A re-homed session's last turn: the whole prompt, or one of its staged heads.
    Turn { session: u64, whole: bool },
}

impl Warmup {
    /// The session it re-homes.
    fn session(self) -> Option<u64> {
        match self {
            Warmup::Turn { session, .. } => Some(session),
            Warmup::ContinuationHead => None,
        }
    }

    /// It is a session's whole last turn (what `warmups_sent` counts).
    pub(super) fn is_whole_turn(self) -> bool {
        matches!(self, Warmup::Turn { whole: true, .. })
    }
}

/// The router's record of sessions' last turns (the dispatch core's, as the gateway keeps
/// it), unbounded: a run's sessions fit.
pub(super) fn book(config: &super::FleetConfig) -> RehomeBook<u64, Vec<u32>> {
    RehomeBook::new(config.rehome.unwrap_or(Nanos::ZERO), usize::MAX, usize::MAX)
}

impl Sim<'_> {
    /// Remembers request `id`'s prompt as its session's last turn (when re-homing is on and
    /// the router can tell sessions apart: the gateway keys the turns by session name).
    pub(super) fn remember_turn(&mut self, id: u64, session: Option<u64>, prompt: &[u32]) {
        let known = self.config.rehome.is_some() && self.config.session_names;
        let Some(session) = session.filter(|_| known) else {
            return;
        };
        // A warm-up still waiting is pointless once the session's next turn is here: that turn
        // recomputes the context itself.
        let warmups = &self.warmups;
        self.held.retain(|h| {
            warmups
                .get(&h.id())
                .is_none_or(|w| w.session() != Some(session))
        });
        self.last_turn
            .remember(session, id, prompt.to_vec(), 0, self.now);
    }

    /// Replica `lost` died: queues a warm-up for each session whose last turn ended there
    /// within the re-homing window.
    pub(super) fn rehome(&mut self, lost: u32) {
        let displaced = self.last_turn.displaced(EndpointId(lost), self.now);
        for (session, id, prompt) in displaced {
            let head = Warmup::Turn {
                session,
                whole: false,
            };
            let after = self.stage(id, &prompt, None, head);
            let warmup = self.new_warmup(
                id,
                prompt.clone(),
                Warmup::Turn {
                    session,
                    whole: true,
                },
            );
            self.out.warmups_queued += 1;
            self.hold(warmup, prompt, 1, None, after);
        }
    }

    /// A record for a warm-up of `prompt` on behalf of request `source` (its router, tenant
    /// and session), left out of the run's records at the end.
    pub(super) fn new_warmup(&mut self, source: u64, prompt: Vec<u32>, kind: Warmup) -> u64 {
        let source = self.out.records[source as usize];
        let warmup = self.out.records.len() as u64;
        self.out.records.push(super::RequestRecord {
            arrival: self.now,
            first_token: None,
            finished: None,
            prompt_tokens: prompt.len() as u32,
            cached_tokens: 0,
            output_tokens: 0,
            retries: 0,
            failed: false,
            predicted_ttft_ms: None,
            predicted_cached: None,
            resumed: None,
            ..source
        });
        self.warmups.insert(warmup, kind);
        warmup
    }

    /// Whether request `id` is a warm-up.
    pub(super) fn is_warmup(&self, id: u64) -> bool {
        self.warmups.contains_key(&id)
    }

    /// Drops the warm-ups from the run's records: they have no client, so no latency figure
    /// counts them (their work stays in the replicas' figures).
    pub(super) fn forget_warmups(&mut self) {
        if self.warmups.is_empty() {
            return;
        }
        let mut id = 0u64;
        let warmups = std::mem::take(&mut self.warmups);
        self.out.records.retain(|_| {
            id += 1;
            !warmups.contains_key(&(id - 1))
        });
    }
}
