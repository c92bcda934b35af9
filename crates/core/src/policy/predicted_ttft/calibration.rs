//! How fast each endpoint turns queued prefill into first tokens, learned online from what the
//! router observes: the time to first token of each request, the prefill work that was ahead of
//! it and its own uncached tokens (from the engine's usage), and the decode batch it shared the
//! engine with.
//!
//! The model, per endpoint, in seconds:
//!
//! ```text
//! ttft = fixed + work * (per_token + interference * decodes)
//! ```
//! `work` is the prefill tokens queued ahead plus the request's own uncached tokens; `decodes`
//! the sequences decoding beside it (with chunked prefill every iteration carries them, so they
//! slow each prefill token, DOMAIN.md §7). The three coefficients come from a ridge regression
//! over exponentially time-decayed samples: recent behaviour dominates, an endpoint that stops
//! getting traffic drifts back to the prior, and the prior is the fleet's pooled fit, so a new
//! replica starts from what the others do. Samples far from the current prediction are clipped
//! to three mean absolute deviations before they count (a Huber-style guard against a stalled
//! request or a preemption teaching the model nonsense). Memory is a fixed 3x3 system per
//! endpoint.

use crate::Nanos;

/// Coefficients of the TTFT model (seconds; work in tokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coefficients {
    /// Seconds before any work (scheduling, the iteration in progress, the network).
    pub fixed: f64,
    /// Seconds per prefill token on an idle engine.
    pub per_token: f64,
    /// Extra seconds per prefill token per decoding sequence.
    pub interference: f64,
}

impl Coefficients {
    /// The predicted TTFT in seconds.
    pub fn predict(&self, work: f64, decodes: f64) -> f64 {
        self.fixed + work * (self.per_token + self.interference * decodes)
    }

    fn as_array(&self) -> [f64; 3] {
        [self.fixed, self.per_token, self.interference]
    }

    fn from_array(a: [f64; 3]) -> Self {
        Coefficients {
            fixed: a[0].max(0.0),
            per_token: a[1].max(1e-9),
            interference: a[2].max(0.0),
        }
    }
}

/// Scale of the features, so the ridge penalties are comparable: work in thousands of tokens,
/// decodes in tens.
const WORK_SCALE: f64 = 1e-3;
const DECODE_SCALE: f64 = 0.1;

fn features(work: f64, decodes: f64) -> [f64; 3] {
    let w = work * WORK_SCALE;
    [1.0, w, w * decodes * DECODE_SCALE]
}

/// Decayed sufficient statistics of a least-squares fit on three features.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fit {
    /// Upper triangle of Σ w f fᵀ: (0,0) (0,1) (0,2) (1,1) (1,2) (2,2).
    a: [f64; 6],
    /// Σ w y f.
    v: [f64; 3],
    /// Σ w (the effective sample count).
    n: f64,
    /// Decayed mean absolute residual, seconds.
    mad: f64,
    at: Nanos,
}

impl Fit {
    /// Decays the statistics to `now` with time constant `tau`.
    fn decay(&mut self, now: Nanos, tau: Nanos) {
        if now <= self.at {
            return;
        }
        let k = (-(now - self.at).as_secs_f64() / tau.as_secs_f64().max(1e-9)).exp();
        self.a.iter_mut().for_each(|x| *x *= k);
        self.v.iter_mut().for_each(|x| *x *= k);
        self.n *= k;
        self.at = now;
    }

    /// Effective number of samples at `now`.
    pub fn samples(&self, now: Nanos, tau: Nanos) -> f64 {
        let mut f = *self;
        f.decay(now, tau);
        f.n
    }

    /// Adds one observation, clipped towards `current`'s prediction.
    fn add(&mut self, work: f64, decodes: f64, ttft: f64, current: &Coefficients) {
        let predicted = current.predict(work, decodes);
        let residual = ttft - predicted;
        let guard = if self.n >= 8.0 {
            3.0 * self.mad.max(1e-3)
        } else {
            f64::INFINITY
        };
        let y = predicted + residual.clamp(-guard, guard);
        let f = features(work, decodes);
        let mut k = 0;
        for i in 0..3 {
            for j in i..3 {
                self.a[k] += f[i] * f[j];
                k += 1;
            }
            self.v[i] += y * f[i];
        }
        self.mad = if self.n < 1.0 {
            residual.abs()
        } else {
            self.mad + (residual.abs().min(guard) - self.mad) * 0.05
        };
        self.n += 1.0;
    }

    fn merge(&mut self, other: &Fit) {
        for (x, y) in self.a.iter_mut().zip(&other.a) {
            *x += y;
        }
        for (x, y) in self.v.iter_mut().zip(&other.v) {
            *x += y;
        }
        self.n += other.n;
    }

    /// The ridge solution pulled towards `prior` with `strength` pseudo-samples per coefficient.
    fn solve(&self, prior: &Coefficients, strength: f64) -> Coefficients {
        // Work in scaled units: θ = [fixed, per_token / WORK_SCALE, interference / (WORK_SCALE
        // * DECODE_SCALE)], so the features above are linear in θ.
        let p = prior.as_array();
        let prior_scaled = [p[0], p[1] / WORK_SCALE, p[2] / (WORK_SCALE * DECODE_SCALE)];
        let mut m = [
            [self.a[0], self.a[1], self.a[2]],
            [self.a[1], self.a[3], self.a[4]],
            [self.a[2], self.a[4], self.a[5]],
        ];
        let mut b = self.v;
        for i in 0..3 {
            m[i][i] += strength;
            b[i] += strength * prior_scaled[i];
        }
        match solve3(m, b) {
            Some(t) => Coefficients::from_array([
                t[0],
                t[1] * WORK_SCALE,
                t[2] * WORK_SCALE * DECODE_SCALE,
            ]),
            None => *prior,
        }
    }
}

/// Gaussian elimination with partial pivoting; `None` when singular.
fn solve3(mut m: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&x, &y| m[x][col].abs().total_cmp(&m[y][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..3 {
            let k = m[row][col] / m[col][col];
            let pivot_row = m[col];
            for (x, p) in m[row].iter_mut().zip(pivot_row).skip(col) {
                *x -= k * p;
            }
            b[row] -= k * b[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let s: f64 = (row + 1..3).map(|c| m[row][c] * x[c]).sum();
        x[row] = (b[row] - s) / m[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// The calibration of every endpoint. See the module documentation.
#[derive(Clone, Debug)]
pub struct Calibration {
    prior: Coefficients,
    tau: Nanos,
    strength: f64,
    fits: Vec<(u32, Fit)>,
    pooled: Option<(Nanos, Coefficients)>,
}

impl Calibration {
    /// A calibration starting from `prior`, forgetting with time constant `tau`, each
    /// endpoint's fit pulled towards the fleet's with `strength` pseudo-samples.
    pub fn new(prior: Coefficients, tau: Nanos, strength: f64) -> Self {
        Calibration {
            prior,
            tau,
            strength,
            fits: Vec::new(),
            pooled: None,
        }
    }

    fn fit_mut(&mut self, endpoint: u32) -> &mut Fit {
        let i = match self.fits.binary_search_by_key(&endpoint, |&(e, _)| e) {
            Ok(i) => i,
            Err(i) => {
                self.fits.insert(i, (endpoint, Fit::default()));
                i
            }
        };
        &mut self.fits[i].1
    }

    /// The fleet's pooled coefficients at `now` (recomputed at most every 100 ms).
    pub fn fleet(&mut self, now: Nanos) -> Coefficients {
        if let Some((at, c)) = self.pooled {
            if now.saturating_since(at) < Nanos::from_millis(100) {
                return c;
            }
        }
        let mut pooled = Fit::default();
        for (_, f) in &mut self.fits {
            f.decay(now, self.tau);
            pooled.merge(f);
        }
        let c = pooled.solve(&self.prior, self.strength);
        self.pooled = Some((now, c));
        c
    }

    /// `endpoint`'s coefficients at `now`: its own samples, pulled towards the fleet's.
    pub fn coefficients(&mut self, endpoint: u32, now: Nanos) -> Coefficients {
        let fleet = self.fleet(now);
        match self.fits.binary_search_by_key(&endpoint, |&(e, _)| e) {
            Ok(i) => {
                let (tau, strength) = (self.tau, self.strength);
                let f = &mut self.fits[i].1;
                f.decay(now, tau);
                f.solve(&fleet, strength)
            }
            Err(_) => fleet,
        }
    }

    /// Records one observed first token on `endpoint`.
    pub fn observe(&mut self, endpoint: u32, now: Nanos, work: f64, decodes: f64, ttft: f64) {
        let current = self.coefficients(endpoint, now);
        let tau = self.tau;
        let fit = self.fit_mut(endpoint);
        fit.decay(now, tau);
        fit.add(work, decodes, ttft, &current);
    }

    /// `endpoint`'s effective sample count at `now`.
    pub fn samples(&self, endpoint: u32, now: Nanos) -> f64 {
        self.fits
            .binary_search_by_key(&endpoint, |&(e, _)| e)
            .map_or(0.0, |i| self.fits[i].1.samples(now, self.tau))
    }

    /// Forgets an endpoint that left.
    pub fn remove(&mut self, endpoint: u32) {
        if let Ok(i) = self.fits.binary_search_by_key(&endpoint, |&(e, _)| e) {
            self.fits.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prior() -> Coefficients {
        Coefficients {
            fixed: 0.02,
            per_token: 1.0 / 10_000.0,
            interference: 0.0,
        }
    }

    #[test]
    fn learns_two_speeds_and_a_new_endpoint_starts_from_the_fleet() {
        let mut c = Calibration::new(prior(), Nanos::from_secs(60), 1.0);
        let truth = |e: u32, work: f64, decodes: f64| {
            let per_token = if e == 0 { 1.0 / 8_000.0 } else { 1.0 / 3_000.0 };
            0.015 + work * (per_token + 2e-7 * decodes)
        };
        for k in 0..400u64 {
            let now = Nanos::from_millis(k * 50);
            for e in [0, 1] {
                let work = 200.0 + ((k * 7919 + u64::from(e) * 13) % 5_000) as f64;
                let decodes = ((k * 31) % 40) as f64;
                c.observe(e, now, work, decodes, truth(e, work, decodes));
            }
        }
        let now = Nanos::from_secs(20);
        for e in [0, 1] {
            let got = c.coefficients(e, now);
            for (work, decodes) in [(500.0, 0.0), (4_000.0, 30.0)] {
                let want = truth(e, work, decodes);
                let pred = got.predict(work, decodes);
                assert!(
                    (pred / want - 1.0).abs() < 0.05,
                    "endpoint {e} at {work}/{decodes}: {pred} vs {want}"
                );
            }
        }
        let newcomer = c.coefficients(7, now).per_token;
        assert!(
            newcomer > 1.0 / 8_000.0 && newcomer < 1.0 / 3_000.0,
            "a new endpoint starts between the two: {newcomer}"
        );
    }

    #[test]
    fn an_outlier_is_clipped_and_old_samples_fade() {
        let mut c = Calibration::new(prior(), Nanos::from_secs(10), 1.0);
        for k in 0..100u64 {
            let work = 1_000.0 + (k % 10) as f64 * 300.0;
            c.observe(
                0,
                Nanos::from_millis(k * 10),
                work,
                0.0,
                0.02 + work / 5_000.0,
            );
        }
        let before = c.coefficients(0, Nanos::from_secs(1)).per_token;
        c.observe(0, Nanos::from_secs(1), 1_000.0, 0.0, 60.0);
        let after = c.coefficients(0, Nanos::from_secs(1)).per_token;
        assert!((after / before - 1.0).abs() < 0.05, "{before} -> {after}");
        assert!(c.samples(0, Nanos::from_secs(1)) > 50.0);
        assert!(c.samples(0, Nanos::from_secs(100)) < 0.01);
    }
}
