//! Parallel fan-out bursts over a few shared prompts (parallel sub-agents, ~40 calls per unit of
//! work arriving as bursts, docs/background.md#agentic-workloads): each arrival is one parent task
//! that sends `fanout` calls at once, all carrying one of `prompts` shared system prompts (with its
//! tools), then the parent's own context (shared by the burst's calls only), then each call's own
//! task text. The calls of a burst share a session (the parent's).
//!
//! This is where a prefix-affinity rule with a load threshold fails: a few hot prompts park on
//! as many replicas, the imbalance threshold never trips at these queue depths, and the rest of
//! the fleet idles while the hot replicas queue.

use super::{shared_token, Spec, UniqueTokens, Workload};
use crate::dist::{exponential, Lengths};
use kvgate_core::Nanos;
use rand::{Rng, RngCore};

/// Parameters of [`Bursts`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BurstsConfig {
    /// Bursts per second (Poisson).
    pub rate: f64,
    /// Calls issued in total; the last burst may be cut short.
    pub requests: u64,
    /// Distinct shared prompts, chosen uniformly per burst.
    pub prompts: u32,
    /// Tokens of each shared prompt.
    pub prompt_tokens: u32,
    /// Calls per burst.
    pub fanout: u32,
    /// The parent's context, shared by its calls.
    pub context: Lengths,
    /// Each call's own task text.
    pub task: Lengths,
    /// Each call's output.
    pub output: Lengths,
}

impl Default for BurstsConfig {
    /// Three shared 4,000-token prompts, 16 calls per burst (fewer than the ~40 calls a unit of
    /// parallel sub-agent work makes) behind ~1,000 tokens of the parent's context, ~300 tokens of
    /// task text and ~150 output tokens per call.
    fn default() -> Self {
        BurstsConfig {
            rate: 1.0,
            requests: 8_000,
            prompts: 3,
            prompt_tokens: 4_000,
            fanout: 16,
            context: Lengths {
                min: 100,
                max: 20_000,
                ..Lengths::lognormal(1_000.0, 0.5)
            },
            task: Lengths {
                min: 20,
                max: 2_000,
                ..Lengths::lognormal(300.0, 0.6)
            },
            output: Lengths {
                min: 5,
                max: 1_000,
                ..Lengths::lognormal(150.0, 0.8)
            },
        }
    }
}

/// The burst workload. See the module documentation.
#[derive(Debug)]
pub struct Bursts {
    config: BurstsConfig,
    issued: u64,
    next_at: f64,
    burst: u64,
    queued: Vec<Spec>,
    unique: UniqueTokens,
}

impl Bursts {
    /// A workload starting at time zero.
    pub fn new(config: BurstsConfig) -> Self {
        Bursts {
            config,
            issued: 0,
            next_at: 0.0,
            burst: 0,
            queued: Vec::new(),
            unique: UniqueTokens::default(),
        }
    }
}

impl Workload for Bursts {
    fn next_open(&mut self, rng: &mut dyn RngCore) -> Option<Spec> {
        if let Some(spec) = self.queued.pop() {
            return Some(spec);
        }
        let c = self.config;
        if self.issued >= c.requests {
            return None;
        }
        self.next_at += exponential(rng, 1.0 / c.rate.max(1e-9));
        let at = Nanos::from_secs_f64(self.next_at);
        let prompt = rng.random_range(0..c.prompts.max(1));
        let calls = u64::from(c.fanout.max(1)).min(c.requests - self.issued);
        let mut head: Vec<u32> = (0..c.prompt_tokens)
            .map(|i| shared_token(prompt, i))
            .collect();
        self.unique.extend(&mut head, c.context.sample(rng));
        for _ in 0..calls {
            let mut tokens = head.clone();
            self.unique.extend(&mut tokens, c.task.sample(rng));
            self.queued.push(Spec {
                arrival: at,
                tokens,
                output: c.output.sample(rng),
                tenant: None,
                session: Some(self.burst),
                tag: self.issued,
            });
            self.issued += 1;
        }
        self.burst += 1;
        // Calls leave in the order they were generated.
        self.queued.reverse();
        self.queued.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn bursts_arrive_together_and_share_their_prompt() {
        let mut w = Bursts::new(BurstsConfig {
            requests: 20,
            fanout: 8,
            task: Lengths::fixed(100),
            ..BurstsConfig::default()
        });
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let specs: Vec<Spec> = std::iter::from_fn(|| w.next_open(&mut rng)).collect();
        assert_eq!(specs.len(), 20);
        for burst in specs.chunks(8) {
            assert!(burst.iter().all(|s| s.arrival == burst[0].arrival));
            assert!(burst.iter().all(|s| s.session == burst[0].session));
            // Shared prompt and parent context: all but the last 100 tokens.
            let head = burst[0].tokens.len() - 100;
            assert!(burst
                .iter()
                .all(|s| s.tokens[..head] == burst[0].tokens[..head]));
            assert_ne!(burst[0].tokens.last(), burst[1].tokens.last());
        }
        assert!(specs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    }
}
