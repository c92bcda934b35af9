//! Load signals corrected for staleness, shared by every load-based policy.
//!
//! Scraped metrics are always old (docs/background.md#stale-signals-and-herding). Three corrections
//! from Envoy's client-side weighted round robin apply here, before any policy ranks endpoints:
//! 1. **own dispatches**: add the requests this router sent after the observation was taken;
//! 2. **expiry and blackout**: an observation older than `expiry_ms`, or taken while the endpoint
//!    is still in its blackout period after joining, is treated as unknown and replaced by the
//!    median of the fresh ones (Envoy: "invalid, blackout or expired reports get the median");
//! 3. **slow start**: after the blackout, a new endpoint's apparent capacity ramps linearly from
//!    `slow_start_min_factor` to 1 over `slow_start_ms` (Envoy `slow_start_config`, linear
//!    aggression 1.0, `min_weight_percent` 10%).

use crate::{fleet::Fleet, EndpointView, Nanos};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use std::cell::OnceCell;

/// How load signals are read. Part of every load-based policy's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadConfig {
    /// Add our own dispatches since the last observation: exact with one router, a part of the
    /// truth with several.
    pub own_dispatch_correction: bool,
    /// Observations older than this are unknown; 0 keeps them forever.
    pub expiry_ms: u64,
    /// Observations of an endpoint younger than this (since it joined) are not trusted.
    pub blackout_ms: u64,
    /// Length of the linear ramp after blackout; 0 disables slow start.
    pub slow_start_ms: u64,
    /// Apparent capacity of an endpoint at the start of its slow start, 0..=1.
    pub slow_start_min_factor: f64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            own_dispatch_correction: true,
            expiry_ms: 10_000,
            blackout_ms: 0,
            slow_start_ms: 0,
            slow_start_min_factor: 0.1,
        }
    }
}

impl LoadConfig {
    /// Checks ranges; returns the offending parameter and why.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if !(0.0..=1.0).contains(&self.slow_start_min_factor) {
            return Err(("load.slow_start_min_factor", "must be within 0..=1"));
        }
        Ok(())
    }

    /// The parameters as (name, default) pairs for `kvgate policies`.
    pub fn describe() -> Vec<(&'static str, String)> {
        let d = Self::default();
        vec![
            (
                "own_dispatch_correction",
                d.own_dispatch_correction.to_string(),
            ),
            ("expiry_ms", d.expiry_ms.to_string()),
            ("blackout_ms", d.blackout_ms.to_string()),
            ("slow_start_ms", d.slow_start_ms.to_string()),
            ("slow_start_min_factor", d.slow_start_min_factor.to_string()),
        ]
    }
}

/// A fleet snapshot read through a [`LoadConfig`] at one instant.
///
/// Indices are positions in the fleet. Medians (over every member with a fresh observation,
/// eligible or not) are computed lazily, once, and only when an endpoint's own observation is
/// unusable.
#[derive(Debug)]
pub struct LoadView<'a> {
    members: Fleet<'a>,
    fleet: &'a [EndpointView],
    config: &'a LoadConfig,
    now: Nanos,
    median_outstanding: OnceCell<f64>,
    median_kv: OnceCell<f64>,
}

impl<'a> LoadView<'a> {
    /// Reads `fleet` at `now`.
    pub fn new(fleet: Fleet<'a>, config: &'a LoadConfig, now: Nanos) -> Self {
        LoadView {
            members: fleet,
            fleet: fleet.views(),
            config,
            now,
            median_outstanding: OnceCell::new(),
            median_kv: OnceCell::new(),
        }
    }

    /// The fleet.
    pub fn fleet(&self) -> &'a [EndpointView] {
        self.fleet
    }

    /// Whether endpoint `i`'s observation may be used as is.
    pub fn is_fresh(&self, i: usize) -> bool {
        let e = &self.fleet[i];
        let Some(_) = e.observation else {
            return false;
        };
        let expired = self.config.expiry_ms > 0
            && self.now.saturating_since(e.observed_at) > Nanos::from_millis(self.config.expiry_ms);
        let in_blackout =
            self.now.saturating_since(e.joined_at) < Nanos::from_millis(self.config.blackout_ms);
        !expired && !in_blackout
    }

    /// Waiting + running as last reported, or the fresh median when unknown.
    pub fn outstanding_observed(&self, i: usize) -> f64 {
        if self.is_fresh(i) {
            return self.fleet[i]
                .observation
                .map_or(0.0, |o| f64::from(o.outstanding()));
        }
        *self.median_outstanding.get_or_init(|| {
            self.median_of(|o| f64::from(o.outstanding()))
                .unwrap_or(0.0)
        })
    }

    /// The load signal: observed outstanding work plus, when enabled, our own dispatches since
    /// the observation.
    pub fn load(&self, i: usize) -> f64 {
        let own = if self.config.own_dispatch_correction {
            f64::from(self.fleet[i].own_since_observation)
        } else {
            0.0
        };
        self.outstanding_observed(i) + own
    }

    /// The load scaled by slow start, for ranking: `(load + 1) / factor - 1`, which equals
    /// `load` for an endpoint past its ramp and inflates a new endpoint's load so it is chosen
    /// less often while warming.
    pub fn ranked_load(&self, i: usize) -> f64 {
        let factor = self.slow_start_factor(i);
        (self.load(i) + 1.0) / factor - 1.0
    }

    /// KV usage as last reported, or the fresh median when unknown.
    pub fn kv_usage(&self, i: usize) -> f64 {
        if self.is_fresh(i) {
            return self.fleet[i].observation.map_or(0.0, |o| o.kv_usage);
        }
        *self
            .median_kv
            .get_or_init(|| self.median_of(|o| o.kv_usage).unwrap_or(0.0))
    }

    /// Endpoint `i`'s slow-start factor in `[slow_start_min_factor, 1]`.
    pub fn slow_start_factor(&self, i: usize) -> f64 {
        let c = self.config;
        if c.slow_start_ms == 0 {
            return 1.0;
        }
        let since_join = self.now.saturating_since(self.fleet[i].joined_at);
        let ramp = since_join.saturating_since(Nanos::from_millis(c.blackout_ms));
        let progress = ramp.as_secs_f64() / Nanos::from_millis(c.slow_start_ms).as_secs_f64();
        progress.clamp(c.slow_start_min_factor.clamp(1e-3, 1.0), 1.0)
    }

    /// Static weight times the slow-start factor.
    pub fn effective_weight(&self, i: usize) -> f64 {
        self.fleet[i].weight.max(0.0) * self.slow_start_factor(i)
    }

    /// Positions of the endpoints eligible for this request, in fleet order.
    pub fn routable(&self) -> impl Iterator<Item = usize> + '_ {
        self.members.eligible_positions()
    }

    /// The fleet with its eligibility predicate.
    pub fn members(&self) -> Fleet<'a> {
        self.members
    }

    /// The routable endpoint minimising `score`, ties broken uniformly at random.
    pub fn argmin_by(
        &self,
        rng: &mut dyn RngCore,
        mut score: impl FnMut(usize) -> f64,
    ) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        let mut ties = 0u32;
        for i in self.routable() {
            let s = score(i);
            match best {
                Some((_, b)) if s > b => {}
                Some((_, b)) if s == b => {
                    ties += 1;
                    if rng.random_range(0..ties + 1) == 0 {
                        best = Some((i, s));
                    }
                }
                _ => {
                    best = Some((i, s));
                    ties = 0;
                }
            }
        }
        best
    }

    /// The least loaded routable endpoint by [`Self::ranked_load`], random tie-break.
    pub fn least_loaded(&self, rng: &mut dyn RngCore) -> Option<(usize, f64)> {
        self.argmin_by(rng, |i| self.ranked_load(i))
    }

    fn median_of(&self, f: impl Fn(&crate::Observation) -> f64) -> Option<f64> {
        let mut fresh: Vec<f64> = (0..self.fleet.len())
            .filter(|&i| self.is_fresh(i))
            .filter_map(|i| self.fleet[i].observation.as_ref().map(&f))
            .collect();
        if fresh.is_empty() {
            return None;
        }
        fresh.sort_by(f64::total_cmp);
        let mid = fresh.len() / 2;
        Some(if fresh.len() % 2 == 1 {
            fresh[mid]
        } else {
            (fresh[mid - 1] + fresh[mid]) / 2.0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EndpointId, Observation};
    use rand::SeedableRng;

    fn endpoint(id: u32, outstanding: u32, observed_at: u64) -> EndpointView {
        EndpointView::new(EndpointId(id)).observed(
            Observation {
                running: outstanding,
                ..Observation::default()
            },
            Nanos::from_millis(observed_at),
        )
    }

    #[test]
    fn own_dispatches_are_added_to_the_observation() {
        let mut e = endpoint(0, 4, 0);
        e.own_since_observation = 3;
        let fleet = [e];
        let cfg = LoadConfig::default();
        assert_eq!(
            LoadView::new(Fleet::of(&fleet), &cfg, Nanos::ZERO).load(0),
            7.0
        );
        let stale = LoadConfig {
            own_dispatch_correction: false,
            ..cfg
        };
        assert_eq!(
            LoadView::new(Fleet::of(&fleet), &stale, Nanos::ZERO).load(0),
            4.0
        );
    }

    #[test]
    fn expired_and_blackout_observations_read_as_the_fresh_median() {
        let mut fleet = vec![
            endpoint(0, 2, 1000),
            endpoint(1, 4, 1000),
            endpoint(2, 9, 1000),
        ];
        fleet.push(endpoint(3, 100, 0)); // expired
        let mut newcomer = endpoint(4, 0, 1000);
        newcomer.joined_at = Nanos::from_millis(900); // in blackout
        fleet.push(newcomer);
        let cfg = LoadConfig {
            expiry_ms: 500,
            blackout_ms: 200,
            ..LoadConfig::default()
        };
        let view = LoadView::new(Fleet::of(&fleet), &cfg, Nanos::from_millis(1000));
        assert!(!view.is_fresh(3) && !view.is_fresh(4));
        assert_eq!(view.load(3), 4.0);
        assert_eq!(view.load(4), 4.0);
        assert_eq!(view.load(2), 9.0);
    }

    #[test]
    fn slow_start_ramps_linearly_after_blackout() {
        let mut e = endpoint(0, 0, 0);
        e.joined_at = Nanos::from_millis(1000);
        let fleet = [e];
        let cfg = LoadConfig {
            blackout_ms: 100,
            slow_start_ms: 1000,
            ..LoadConfig::default()
        };
        let at = |ms| {
            LoadView::new(Fleet::of(&fleet), &cfg, Nanos::from_millis(ms)).slow_start_factor(0)
        };
        assert_eq!(at(1050), 0.1);
        assert!((at(1600) - 0.5).abs() < 1e-9);
        assert_eq!(at(2100), 1.0);
        assert_eq!(
            LoadView::new(Fleet::of(&fleet), &cfg, Nanos::from_millis(1600)).ranked_load(0),
            1.0
        );
    }

    #[test]
    fn argmin_skips_unroutable_and_breaks_ties_at_random() {
        let mut fleet: Vec<_> = (0..4).map(|i| endpoint(i, 1, 0)).collect();
        fleet[0].health = crate::Health::Draining;
        let cfg = LoadConfig::default();
        let view = LoadView::new(Fleet::of(&fleet), &cfg, Nanos::ZERO);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut seen = [0u32; 4];
        for _ in 0..300 {
            seen[view.least_loaded(&mut rng).unwrap().0] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1..].iter().all(|&n| n > 50), "{seen:?}");
    }
}
