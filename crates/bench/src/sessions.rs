//! Closed-loop workloads: the simulator's own workload models (`kvgate_sim::workload`) driven by
//! real responses, so `kvgate sim` and `kvgate bench` run the very same traffic.
//!
//! Sessions (or fan-out bursts) start open loop, at the offered rate; what follows depends on
//! answers, as it does for an agent: the next turn is sent its think time after the previous
//! answer arrived, and a fan-out's parent resumes when its last call answered. The model's
//! token ids become text one word per token (" " and three letters, one token in the emulated
//! engine's tokenizer and in common BPE vocabularies), so shared ids are shared text and the
//! gateway's and the engines' prefix caches see the sharing the model intends.

use crate::runner::{Limits, Source};
use crate::workload::{Message, RequestSpec};
use kvgate_core::Nanos;
use kvgate_sim::workload::{Spec, Workload};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// The words token ids become: `" xyz"`, from a fixed mix of the id.
pub fn render(tokens: &[u32]) -> String {
    let mut out = String::with_capacity(tokens.len() * 4);
    for &t in tokens {
        // splitmix64's finaliser: neighbouring ids get unrelated words.
        let mut z = u64::from(t).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.push(' ');
        for k in 0..3 {
            out.push(char::from(b'a' + ((z >> (8 * k)) % 26) as u8));
        }
    }
    out
}

/// One closed-loop workload as a schedule of requests.
pub struct Sessions {
    workload: Box<dyn Workload + Send>,
    rng: ChaCha8Rng,
    seed: u64,
    /// Each session's own random stream (keyed by `tag >> 1`, the workloads' session id): what
    /// a session does next must not depend on the order in which other sessions' answers came
    /// back, or two targets of one run would see different sessions after the first answers.
    session_rngs: HashMap<u64, ChaCha8Rng>,
    limits: Limits,
    next_open: Option<Spec>,
    follow_ups: BinaryHeap<Reverse<(Nanos, u64)>>,
    specs: Vec<Option<Spec>>,
    issued: u64,
    waiting: u64,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("issued", &self.issued)
            .field("waiting", &self.waiting)
            .finish()
    }
}

impl Sessions {
    /// Runs `workload` (drawing from a stream seeded by `seed`) within `limits`.
    pub fn new(workload: Box<dyn Workload + Send>, seed: u64, limits: Limits) -> Self {
        let mut s = Sessions {
            workload,
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            session_rngs: HashMap::new(),
            limits,
            next_open: None,
            follow_ups: BinaryHeap::new(),
            specs: Vec::new(),
            issued: 0,
            waiting: 0,
        };
        s.pull_open();
        s
    }

    fn pull_open(&mut self) {
        self.next_open = self
            .workload
            .next_open(&mut self.rng)
            .filter(|spec| self.in_limits(spec.arrival));
    }

    fn in_limits(&self, at: Nanos) -> bool {
        self.limits.num_requests.is_none_or(|n| self.issued < n)
            && self.limits.duration_s.is_none_or(|d| at.as_secs_f64() <= d)
    }

    fn spec_request(spec: &Spec) -> RequestSpec {
        RequestSpec {
            model: None,
            messages: vec![Message {
                role: "user".into(),
                content: render(&spec.tokens),
            }],
            max_tokens: spec.output.max(1),
            user: spec.session.map(|s| format!("session-{s}")),
        }
    }
}

impl Source for Sessions {
    fn peek(&mut self) -> Option<f64> {
        let follow = self.follow_ups.peek().map(|Reverse((at, _))| *at);
        let open = self.next_open.as_ref().map(|s| s.arrival);
        match (follow, open) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(Nanos::as_secs_f64)
    }

    fn pop(&mut self) -> Option<(f64, RequestSpec, u64)> {
        if self.limits.num_requests.is_some_and(|n| self.issued >= n) {
            self.next_open = None;
            self.follow_ups.clear();
            return None;
        }
        let follow = self.follow_ups.peek().map(|Reverse((at, _))| *at);
        let open_at = self.next_open.as_ref().map(|s| s.arrival);
        let spec = match (follow, open_at) {
            (Some(f), Some(o)) if f <= o => self.take_follow_up(),
            (Some(_), None) => self.take_follow_up(),
            (_, Some(_)) => {
                let spec = self.next_open.take();
                self.pull_open();
                spec
            }
            (None, None) => None,
        }?;
        self.issued += 1;
        self.waiting += 1;
        let request = Self::spec_request(&spec);
        Some((spec.arrival.as_secs_f64(), request, spec.tag))
    }

    fn completed(&mut self, tag: u64, at_s: f64) {
        self.waiting = self.waiting.saturating_sub(1);
        let mut out = Vec::new();
        let session = tag >> 1;
        let seed = self.seed;
        let rng = self.session_rngs.entry(session).or_insert_with(|| {
            ChaCha8Rng::seed_from_u64(seed ^ session.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        });
        self.workload
            .on_complete(tag, Nanos::from_secs_f64(at_s), rng, &mut out);
        for spec in out {
            if self.in_limits(spec.arrival) {
                let k = self.specs.len() as u64;
                self.follow_ups.push(Reverse((spec.arrival, k)));
                self.specs.push(Some(spec));
            }
        }
    }

    fn open(&self) -> bool {
        self.next_open.is_some() || !self.follow_ups.is_empty() || self.waiting > 0
    }
}

impl Sessions {
    fn take_follow_up(&mut self) -> Option<Spec> {
        let Reverse((_, k)) = self.follow_ups.pop()?;
        self.specs[k as usize].take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_sim::workload::{Agentic, AgenticConfig};

    #[test]
    fn shared_tokens_are_shared_words_and_one_word_is_one_token_wide() {
        let a = render(&[1, 2, 3]);
        let b = render(&[1, 2, 4]);
        assert_eq!(a.len(), 12);
        assert_eq!(a[..8], b[..8]);
        assert_ne!(a, b);
    }

    #[test]
    fn the_next_turn_waits_for_the_answer() {
        let config = AgenticConfig {
            session_rate: 1.0,
            requests: 50,
            fanout_prob: 0.0,
            ..AgenticConfig::default()
        };
        let limits = Limits {
            duration_s: None,
            num_requests: Some(50),
        };
        let mut s = Sessions::new(Box::new(Agentic::new(config)), 3, limits);
        let (at, first, tag) = s.pop().unwrap();
        // Nothing else is due before the next session starts: the first turn's follow-up
        // exists only once it answered.
        let next = s.peek().unwrap();
        assert!(next > at);
        s.completed(tag, at + 0.5);
        let mut saw_turn_two = false;
        while let Some((_, r, t)) = s.pop() {
            if r.messages[0]
                .content
                .starts_with(&first.messages[0].content)
            {
                saw_turn_two = true;
                break;
            }
            s.completed(t, 1e6);
        }
        assert!(saw_turn_two, "turn two resends turn one's context");
    }
}
