//! Open-loop arrival process: the intended send time of every request.
//!
//! Inter-arrival gaps are drawn from a gamma distribution with shape `B` (the *burstiness*) and
//! mean `1 / rate`, so the coefficient of variation of the gaps is `1 / sqrt(B)`; `B = 1` is a
//! Poisson process (exponential gaps). This is the model of vLLM's `benchmark_serving.py`
//! (`--request-rate`, `--burstiness`). A linear ramp moves the rate from a start to an end value,
//! either over the requests (request `i` of `N` uses `start + (end - start) * i / N`, as vLLM's
//! `--ramp-up-strategy linear`) or over the run's duration.
//!
//! Gaps come from the simulator's arrival process ([`kvgate_sim::dist::Arrivals`]: exponential
//! for Poisson, Marsaglia and Tsang's gamma otherwise), so the simulator and the benchmark draw
//! arrivals the same way. The generator is a
//! seeded ChaCha8 stream, so a seed reproduces the schedule exactly.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// How the offered rate changes during a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ramp {
    /// The rate stays at the configured value.
    Constant,
    /// Linear from `start` to `end` requests per second over the first `over` units of
    /// progress (requests or seconds, see [`RampAxis`]).
    Linear {
        /// Rate at the beginning, requests per second.
        start: f64,
        /// Rate at the end, requests per second.
        end: f64,
        /// Length of the ramp.
        over: f64,
        /// Whether `over` counts requests or seconds.
        axis: RampAxis,
    },
}

/// The axis along which a linear ramp progresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RampAxis {
    /// Progress is the request index.
    Requests,
    /// Progress is the elapsed scheduled time in seconds.
    Seconds,
}

/// Parameters of the arrival process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Mean arrival rate in requests per second; `f64::INFINITY` sends everything at once.
    pub rate: f64,
    /// Gamma shape; `1.0` is Poisson, larger is more regular, smaller is burstier.
    pub burstiness: f64,
    /// Optional ramp, which overrides `rate`.
    pub ramp: Ramp,
}

impl Config {
    /// A Poisson process at `rate` requests per second.
    pub fn poisson(rate: f64) -> Self {
        Self {
            rate,
            burstiness: 1.0,
            ramp: Ramp::Constant,
        }
    }
}

/// An infinite iterator of scheduled send offsets in seconds from the start of the run,
/// non-decreasing.
#[derive(Debug, Clone)]
pub struct Arrivals {
    config: Config,
    rng: ChaCha8Rng,
    now: f64,
    index: u64,
}

impl Arrivals {
    /// Creates the process. Preconditions: `burstiness > 0`, rates `>= 0` (a zero rate is
    /// treated as "never": the iterator yields `f64::INFINITY`).
    pub fn new(config: Config, seed: u64) -> Self {
        debug_assert!(config.burstiness > 0.0, "burstiness must be positive");
        Self {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0.0,
            index: 0,
        }
    }

    /// The instantaneous rate used for the next gap.
    fn current_rate(&self) -> f64 {
        match self.config.ramp {
            Ramp::Constant => self.config.rate,
            Ramp::Linear {
                start,
                end,
                over,
                axis,
            } => {
                let progress = match axis {
                    RampAxis::Requests => self.index as f64,
                    RampAxis::Seconds => self.now,
                };
                let frac = if over > 0.0 {
                    (progress / over).clamp(0.0, 1.0)
                } else {
                    1.0
                };
                start + (end - start) * frac
            }
        }
    }
}

impl Iterator for Arrivals {
    type Item = f64;

    fn next(&mut self) -> Option<f64> {
        let rate = self.current_rate();
        let gap = if rate.is_infinite() {
            0.0
        } else if rate <= 0.0 {
            f64::INFINITY
        } else {
            let process = kvgate_sim::dist::Arrivals {
                rate,
                burstiness: self.config.burstiness,
            };
            process.gap(&mut self.rng)
        };
        self.now += gap;
        self.index += 1;
        Some(self.now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(config: Config, n: usize, seed: u64) -> Vec<f64> {
        let times: Vec<f64> = Arrivals::new(config, seed).take(n).collect();
        let mut prev = 0.0;
        times
            .iter()
            .map(|&t| {
                let g = t - prev;
                prev = t;
                g
            })
            .collect()
    }

    fn mean_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_mean_rate_within_four_standard_errors_over_2000_arrivals() {
        // The mean of n exponential gaps has a relative standard error of 1/sqrt(n).
        let bound = 4.0 / 2000f64.sqrt();
        for seed in [1, 2, 3, 42] {
            let times: Vec<f64> = Arrivals::new(Config::poisson(50.0), seed)
                .take(2000)
                .collect();
            let rate = 2000.0 / times[1999];
            assert!(
                (rate / 50.0 - 1.0).abs() < bound,
                "seed {seed}: rate {rate}"
            );
        }
    }

    #[test]
    fn gamma_cv_is_inverse_sqrt_of_burstiness() {
        for b in [0.25, 0.5, 1.0, 4.0] {
            let g = gaps(
                Config {
                    rate: 100.0,
                    burstiness: b,
                    ramp: Ramp::Constant,
                },
                20_000,
                7,
            );
            let (mean, cv) = mean_cv(&g);
            let want = 1.0 / f64::sqrt(b);
            assert!((mean * 100.0 - 1.0).abs() < 0.05, "b {b}: mean gap {mean}");
            assert!((cv / want - 1.0).abs() < 0.06, "b {b}: cv {cv} want {want}");
        }
    }

    #[test]
    fn same_seed_same_schedule() {
        let a: Vec<f64> = Arrivals::new(Config::poisson(10.0), 9).take(100).collect();
        let b: Vec<f64> = Arrivals::new(Config::poisson(10.0), 9).take(100).collect();
        assert_eq!(a, b);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn linear_ramp_by_requests_raises_rate() {
        let ramp = Ramp::Linear {
            start: 10.0,
            end: 100.0,
            over: 2000.0,
            axis: RampAxis::Requests,
        };
        let g = gaps(
            Config {
                rate: 0.0,
                burstiness: 1.0,
                ramp,
            },
            2000,
            5,
        );
        let (first, _) = mean_cv(&g[..200]);
        let (last, _) = mean_cv(&g[1800..]);
        assert!(first > 3.0 * last, "first {first} last {last}");
        // Expected gap at index i is 1 / (10 + 90 i / 2000); the mean of the last 200 is ~1/95.5.
        assert!((last * 95.5 - 1.0).abs() < 0.15, "last {last}");
    }

    #[test]
    fn infinite_rate_sends_everything_at_zero() {
        let t: Vec<f64> = Arrivals::new(Config::poisson(f64::INFINITY), 1)
            .take(10)
            .collect();
        assert!(t.iter().all(|&x| x == 0.0));
    }
}
