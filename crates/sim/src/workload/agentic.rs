//! Agentic sessions (docs/background.md#agentic-workloads): a tenant's system prompt and tool
//! definitions shared by all its sessions; each turn resends the whole conversation (system, tools,
//! every earlier user text and answer) plus new user text; think time between turns; and, on some
//! turns, a fan-out of `k` parallel calls that share the parent's context and each add a short
//! branch text. The session resumes when every child has answered.
//!
//! Sessions start as an open-loop Poisson process; turns are closed-loop (a turn starts after
//! the previous answer plus think time), which is how agents behave.

use super::{shared_token, Spec, UniqueTokens, Workload};
use crate::dist::{exponential, Lengths};
use kvgate_core::fasthash::IntMap;
use kvgate_core::Nanos;
use rand::{Rng, RngCore};

/// Parameters of [`Agentic`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgenticConfig {
    /// New sessions per second.
    pub session_rate: f64,
    /// Requests issued in total (turns and fan-out calls); the run stops issuing after this.
    pub requests: u64,
    /// Tenants; each session belongs to one, uniformly.
    pub tenants: u32,
    /// Tokens of a tenant's system prompt plus tool definitions.
    pub system_tokens: u32,
    /// Mean turns per session (geometric, at least one).
    pub turns: f64,
    /// New user text per turn.
    pub user_text: Lengths,
    /// Answer (output) length of a turn.
    pub answer: Lengths,
    /// Mean think time between an answer and the next turn, seconds (exponential).
    pub think_time_s: f64,
    /// Probability that a turn fans out after its answer.
    pub fanout_prob: f64,
    /// Parallel calls in a fan-out.
    pub fanout: u32,
    /// Branch-specific text of each fan-out call.
    pub branch_text: Lengths,
    /// Output of each fan-out call.
    pub branch_answer: Lengths,
    /// A session ends once its context exceeds this many tokens.
    pub max_context: u32,
}

impl Default for AgenticConfig {
    /// A coding-agent-like mix: 8 tenants with 2,000-token system prompts and tools, ~6 turns
    /// per session, answers of ~250 tokens, 5 s think time, and a 4-way fan-out on 15% of
    /// turns.
    fn default() -> Self {
        AgenticConfig {
            session_rate: 4.0,
            requests: 20_000,
            tenants: 8,
            system_tokens: 2_000,
            turns: 6.0,
            user_text: Lengths {
                min: 10,
                max: 2_000,
                ..Lengths::lognormal(150.0, 1.0)
            },
            answer: Lengths {
                min: 5,
                max: 2_000,
                ..Lengths::lognormal(250.0, 1.0)
            },
            think_time_s: 5.0,
            fanout_prob: 0.15,
            fanout: 4,
            branch_text: Lengths {
                min: 10,
                max: 1_000,
                ..Lengths::lognormal(100.0, 0.5)
            },
            branch_answer: Lengths {
                min: 5,
                max: 1_000,
                ..Lengths::lognormal(120.0, 1.0)
            },
            max_context: 32_000,
        }
    }
}

#[derive(Debug)]
struct Session {
    tenant: u32,
    history: Vec<u32>,
    turns_left: u32,
    children_pending: u32,
}

/// The agentic workload. See the module documentation.
#[derive(Debug)]
pub struct Agentic {
    config: AgenticConfig,
    issued: u64,
    next_start: f64,
    next_session: u64,
    /// Looked up by id only, never iterated.
    sessions: IntMap<u64, Session>,
    unique: UniqueTokens,
}

impl Agentic {
    /// A workload starting at time zero.
    pub fn new(config: AgenticConfig) -> Self {
        Agentic {
            config,
            issued: 0,
            next_start: 0.0,
            next_session: 0,
            sessions: IntMap::default(),
            unique: UniqueTokens::default(),
        }
    }

    /// Sessions still alive (tests).
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    fn turn(&mut self, id: u64, at: Nanos, rng: &mut dyn RngCore) -> Spec {
        let user = self.config.user_text.sample(rng);
        let output = self.config.answer.sample(rng);
        let session = self.sessions.get_mut(&id).expect("live session");
        self.unique.extend(&mut session.history, user);
        self.issued += 1;
        Spec {
            arrival: at,
            tokens: session.history.clone(),
            output,
            tenant: Some(session.tenant),
            session: Some(id),
            tag: id << 1,
        }
    }
}

impl Workload for Agentic {
    fn next_open(&mut self, rng: &mut dyn RngCore) -> Option<Spec> {
        if self.issued >= self.config.requests {
            return None;
        }
        let c = self.config;
        self.next_start += exponential(rng, 1.0 / c.session_rate.max(1e-9));
        let id = self.next_session;
        self.next_session += 1;
        let tenant = rng.random_range(0..c.tenants.max(1));
        // Geometric turns with mean `turns`.
        let p = 1.0 / c.turns.max(1.0);
        let mut turns = 1;
        while turns < 10_000 && rng.random::<f64>() > p {
            turns += 1;
        }
        let history = (0..c.system_tokens)
            .map(|i| shared_token(tenant, i))
            .collect();
        self.sessions.insert(
            id,
            Session {
                tenant,
                history,
                turns_left: turns,
                children_pending: 0,
            },
        );
        Some(self.turn(id, Nanos::from_secs_f64(self.next_start), rng))
    }

    fn on_complete(&mut self, tag: u64, now: Nanos, rng: &mut dyn RngCore, out: &mut Vec<Spec>) {
        let id = tag >> 1;
        let child = tag & 1 == 1;
        let c = self.config;
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        if child {
            session.children_pending = session.children_pending.saturating_sub(1);
            if session.children_pending > 0 {
                return;
            }
        } else {
            // The answer becomes part of the conversation (its ids are fresh: the engine model does
            // not cache generated tokens, and the next turn resends them as prompt).
            let answer = c.answer.sample(rng);
            self.unique.extend(&mut session.history, answer);
            session.turns_left = session.turns_left.saturating_sub(1);
            if session.turns_left > 0 && c.fanout > 0 && rng.random::<f64>() < c.fanout_prob {
                let before = out.len();
                for _ in 0..c.fanout {
                    if self.issued >= c.requests {
                        break;
                    }
                    let mut tokens = session.history.clone();
                    let branch = c.branch_text.sample(rng);
                    self.unique.extend(&mut tokens, branch);
                    self.issued += 1;
                    out.push(Spec {
                        arrival: now,
                        tokens,
                        output: c.branch_answer.sample(rng),
                        tenant: Some(session.tenant),
                        session: Some(id),
                        tag: (id << 1) | 1,
                    });
                }
                session.children_pending = (out.len() - before) as u32;
                if session.children_pending > 0 {
                    return;
                }
            }
        }
        let session = self.sessions.get_mut(&id).expect("live session");
        if session.turns_left == 0
            || session.history.len() > c.max_context as usize
            || self.issued >= c.requests
        {
            self.sessions.remove(&id);
            return;
        }
        let think = Nanos::from_secs_f64(exponential(rng, c.think_time_s));
        out.push(self.turn(id, now + think, rng));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn sessions_grow_their_context_fan_out_and_end() {
        let config = AgenticConfig {
            requests: 2_000,
            fanout_prob: 0.5,
            ..AgenticConfig::default()
        };
        let mut w = Agentic::new(config);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        // Drive it like a fleet that answers everything instantly, in arrival order.
        let mut queue: Vec<Spec> = Vec::new();
        let mut issued = 0u64;
        let mut children = 0;
        let mut last_len: std::collections::BTreeMap<u64, usize> = Default::default();
        loop {
            if queue.is_empty() {
                match w.next_open(&mut rng) {
                    Some(s) => queue.push(s),
                    None => break,
                }
            }
            let spec = queue.remove(0);
            issued += 1;
            let sid = spec.session.unwrap();
            let tenant = spec.tenant.unwrap();
            assert_eq!(spec.tokens[0], shared_token(tenant, 0));
            if spec.tag & 1 == 1 {
                children += 1;
            } else {
                let prev = last_len.insert(sid, spec.tokens.len()).unwrap_or(0);
                assert!(spec.tokens.len() > prev, "turns resend a growing context");
            }
            let mut out = Vec::new();
            w.on_complete(spec.tag, spec.arrival, &mut rng, &mut out);
            assert!(out.iter().all(|s| s.arrival >= spec.arrival));
            queue.extend(out);
        }
        assert_eq!(issued, 2_000);
        assert!(children > 100, "{children}");
    }
}
