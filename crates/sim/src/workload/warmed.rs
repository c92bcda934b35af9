//! A workload preceded by a warm-up phase whose requests are not measured.

use super::{Spec, Workload};
use kvgate_core::Nanos;
use rand::RngCore;

/// Tags at or above this are the warm-up's.
pub const WARM_TAG: u64 = 1 << 62;

/// `warm`'s arrivals, then `main`'s shifted to start where the warm-up's last one was.
pub struct Warmed {
    warm: Box<dyn Workload>,
    main: Box<dyn Workload>,
    warming: bool,
    offset: Nanos,
}

impl Warmed {
    /// `warm` first, then `main`.
    pub fn new(warm: Box<dyn Workload>, main: Box<dyn Workload>) -> Self {
        Warmed {
            warm,
            main,
            warming: true,
            offset: Nanos(0),
        }
    }
}

impl std::fmt::Debug for Warmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warmed")
            .field("warming", &self.warming)
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl Workload for Warmed {
    fn next_open(&mut self, rng: &mut dyn RngCore) -> Option<Spec> {
        if self.warming {
            if let Some(mut s) = self.warm.next_open(rng) {
                self.offset = s.arrival;
                s.tag += WARM_TAG;
                return Some(s);
            }
            self.warming = false;
        }
        let mut s = self.main.next_open(rng)?;
        s.arrival = Nanos(s.arrival.0 + self.offset.0);
        Some(s)
    }

    fn on_complete(&mut self, tag: u64, now: Nanos, rng: &mut dyn RngCore, out: &mut Vec<Spec>) {
        if tag >= WARM_TAG {
            let from = out.len();
            self.warm.on_complete(tag - WARM_TAG, now, rng, out);
            for s in &mut out[from..] {
                s.tag += WARM_TAG;
            }
        } else {
            self.main.on_complete(tag, now, rng, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::{Arrivals, Lengths};
    use crate::workload::{OpenLoop, OpenLoopConfig, PrefixGroups};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn open(rate: f64, requests: u64) -> OpenLoop {
        OpenLoop::new(OpenLoopConfig {
            arrivals: Arrivals {
                rate,
                burstiness: 1.0,
            },
            time_unit: Nanos::from_secs(1),
            requests,
            prompt: Lengths::fixed(64),
            output: Lengths::fixed(4),
            long_fraction: 0.0,
            long_output: Lengths::fixed(4),
            groups: Some(PrefixGroups {
                groups: 2,
                share: 0.5,
                zipf: 0.0,
            }),
        })
    }

    #[test]
    fn the_warm_up_comes_first_tagged_and_shares_only_the_documents() {
        let mut w = Warmed::new(
            Box::new(open(10.0, 50)),
            Box::new(open(20.0, 100).with_unique_from(1 << 29)),
        );
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut specs = Vec::new();
        while let Some(s) = w.next_open(&mut rng) {
            specs.push(s);
        }
        assert_eq!(specs.len(), 150);
        assert!(specs.windows(2).all(|p| p[0].arrival <= p[1].arrival));
        let (warm, main) = specs.split_at(50);
        assert!(warm.iter().all(|s| s.tag >= WARM_TAG));
        assert!(main.iter().all(|s| s.tag < WARM_TAG));
        // Main starts where the warm-up ended, at its own rate: ~5 s, then ~5 s more.
        let end = warm[49].arrival.as_secs_f64();
        assert!((3.0..8.0).contains(&end), "{end}");
        let span = main[99].arrival.as_secs_f64() - end;
        assert!((3.0..8.0).contains(&span), "{span}");
        // The documents are shared; the questions are not.
        let suffix = |s: &Spec| s.tokens[32..].to_vec();
        let warm_suffixes: std::collections::HashSet<_> = warm.iter().map(suffix).collect();
        assert!(main.iter().all(|s| !warm_suffixes.contains(&suffix(s))));
        let documents: std::collections::HashSet<_> =
            specs.iter().map(|s| s.tokens[..32].to_vec()).collect();
        assert_eq!(documents.len(), 2);
    }
}
