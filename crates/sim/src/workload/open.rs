//! Open-loop arrivals (a fixed arrival rate: a closed loop hides overload, Schroeder et al., NSDI
//! 2006) with prompt and output length distributions, a long-request fraction and shared-prefix
//! groups (vLLM bench's `prefix_repetition` dataset: number of prefixes, prefix length, suffix
//! length).

use super::{shared_token, Spec, UniqueTokens, Workload};
use crate::dist::{Arrivals, Lengths};
use kvgate_core::Nanos;
use rand::{Rng, RngCore};

/// Prompts that start with one of a few shared documents.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixGroups {
    /// Number of distinct shared documents.
    pub groups: u32,
    /// Share of each prompt taken from its group's document (the rest is unique).
    pub share: f64,
    /// Zipf exponent of group popularity (0 = uniform).
    pub zipf: f64,
}

/// Parameters of [`OpenLoop`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenLoopConfig {
    /// Arrival process; `rate` is per `time_unit`.
    pub arrivals: Arrivals,
    /// Length of the rate's time unit (one tick in the labs).
    pub time_unit: Nanos,
    /// How many requests arrive in total.
    pub requests: u64,
    /// Prompt lengths in tokens.
    pub prompt: Lengths,
    /// Output lengths of ordinary requests.
    pub output: Lengths,
    /// Fraction of requests that are long (their output comes from `long_output`).
    pub long_fraction: f64,
    /// Output lengths of long requests.
    pub long_output: Lengths,
    /// Shared-prefix structure, if any.
    pub groups: Option<PrefixGroups>,
}

/// An open-loop workload. See the module documentation.
#[derive(Clone, Debug)]
pub struct OpenLoop {
    config: OpenLoopConfig,
    issued: u64,
    clock: f64,
    unique: UniqueTokens,
    group_cdf: Vec<f64>,
}

impl OpenLoop {
    /// A workload starting at time zero.
    pub fn new(config: OpenLoopConfig) -> Self {
        let group_cdf = match config.groups {
            Some(g) if g.groups > 0 => {
                let weights: Vec<f64> = (1..=g.groups)
                    .map(|k| 1.0 / f64::from(k).powf(g.zipf))
                    .collect();
                let total: f64 = weights.iter().sum();
                let mut acc = 0.0;
                weights
                    .iter()
                    .map(|w| {
                        acc += w / total;
                        acc
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        OpenLoop {
            config,
            issued: 0,
            clock: 0.0,
            unique: UniqueTokens::default(),
            group_cdf,
        }
    }

    /// The same workload with its unique token ids starting at `next`, so that it shares
    /// nothing but its groups' documents with another instance.
    pub fn with_unique_from(mut self, next: u32) -> Self {
        self.unique = UniqueTokens::starting_at(next);
        self
    }

    fn pick_group(&self, rng: &mut dyn RngCore) -> u32 {
        let u: f64 = rng.random();
        let i = self.group_cdf.partition_point(|&c| c < u);
        i.min(self.group_cdf.len().saturating_sub(1)) as u32
    }
}

impl Workload for OpenLoop {
    fn next_open(&mut self, rng: &mut dyn RngCore) -> Option<Spec> {
        if self.issued >= self.config.requests {
            return None;
        }
        let c = self.config;
        self.clock += c.arrivals.gap(rng);
        let arrival = Nanos((self.clock * c.time_unit.0 as f64) as u64);
        let len = c.prompt.sample(rng);
        let long = rng.random::<f64>() < c.long_fraction;
        let output = if long {
            c.long_output.sample(rng)
        } else {
            c.output.sample(rng)
        };
        let mut tokens = Vec::with_capacity(len as usize);
        let mut shared = 0;
        if let Some(g) = c.groups.filter(|g| g.groups > 0) {
            let group = self.pick_group(rng);
            shared = ((f64::from(len) * g.share).round() as u32).min(len);
            tokens.extend((0..shared).map(|i| shared_token(group, i)));
        }
        self.unique.extend(&mut tokens, len - shared);
        let tag = self.issued;
        self.issued += 1;
        Some(Spec {
            arrival,
            tokens,
            output,
            tenant: None,
            session: None,
            tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn config() -> OpenLoopConfig {
        OpenLoopConfig {
            arrivals: Arrivals {
                rate: 0.2,
                burstiness: 1.0,
            },
            time_unit: Nanos(1_000),
            requests: 1_000,
            prompt: Lengths {
                min: 100,
                max: 3_000,
                ..Lengths::lognormal(900.0, 0.75)
            },
            output: Lengths::fixed(10),
            long_fraction: 0.2,
            long_output: Lengths::fixed(100),
            groups: Some(PrefixGroups {
                groups: 4,
                share: 0.5,
                zipf: 1.0,
            }),
        }
    }

    #[test]
    fn arrivals_are_ordered_counted_and_share_group_heads() {
        let mut w = OpenLoop::new(config());
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut specs = Vec::new();
        while let Some(s) = w.next_open(&mut rng) {
            specs.push(s);
        }
        assert_eq!(specs.len(), 1_000);
        assert!(specs.windows(2).all(|p| p[0].arrival <= p[1].arrival));
        let long = specs.iter().filter(|s| s.output == 100).count();
        assert!((150..250).contains(&long), "{long}");
        // Heads come from shared documents; tails are unique across requests.
        let heads = specs.iter().filter(|s| s.tokens[0] >= 0x4000_0000).count();
        assert_eq!(heads, 1_000);
        let mut tails: Vec<u32> = specs
            .iter()
            .flat_map(|s| s.tokens.iter().copied().filter(|&t| t < 0x4000_0000))
            .collect();
        let n = tails.len();
        tails.sort_unstable();
        tails.dedup();
        assert_eq!(tails.len(), n);
        // Zipf(1) over 4 groups: group 0 is the most popular.
        let g0 = specs
            .iter()
            .filter(|s| s.tokens[0] == shared_token(0, 0))
            .count();
        assert!(g0 > 400, "{g0}");
    }

    #[test]
    fn the_same_seed_gives_the_same_requests() {
        let run = || {
            let mut w = OpenLoop::new(config());
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            (0..50)
                .map(|_| w.next_open(&mut rng).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }
}
