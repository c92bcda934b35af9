//! How fast each endpoint turns queued prefill into first tokens, learned online from what the
//! router observes: the time to first token of each request, the prefill work that was ahead of
//! it and its own uncached tokens (from the engine's usage), and the decode batch it shared the
//! engine with.
//!
//! The model, per endpoint, in seconds:
//!
//! ```text
//! ttft = fixed + per_decode * decodes + work * (per_token + interference * decodes)
//! ```
//! `work` is the prefill tokens queued ahead plus the request's own uncached tokens; `decodes` the
//! sequences decoding beside it (with chunked prefill, as in Sarathi-Serve, every iteration carries
//! them: they lengthen each iteration, the first token's too, and slow each prefill token).
//!
//! The four coefficients are the fleet's, from a ridge regression over every endpoint's
//! exponentially time-decayed samples (recent behaviour dominates; with no samples, the
//! configured prior). Each endpoint then has one factor of its own: how much slower or faster
//! than the fleet's prediction its first tokens come, the decayed mean of the log of measured
//! over predicted, pulled towards 1 by a quarter of `strength` in pseudo-samples
//! ([`FACTOR_STRENGTH`]). One robust number per endpoint is learned from a few dozen requests
//! and does not wander on noise the way four would (a homogeneous fleet stays homogeneous),
//! while a replica 2.5x slower shows as one within seconds; an endpoint that stops getting
//! traffic drifts back to the fleet. The factors stay centred on the fleet (their
//! sample-weighted mean log is 0), so the fleet's fit carries the fleet's level and a prior
//! several times off is left behind within a minute. Samples far from
//! the current prediction are clipped (three mean absolute deviations for the fit, a factor of
//! e^1.5 for the ratio) before they count: a stalled request or a preemption does not teach
//! nonsense. Memory: a 4x4 system per endpoint (pooled for the fleet) and two numbers.

use crate::Nanos;

/// The speed factor's pull towards the fleet, as a share of the fit's `strength`. The pull
/// shrinks the factor of a replica that gets few requests: at 0.5 sessions/s on `kvgate sim
/// --scenario heterogeneous` a replica 2.5x slower got about one request a second, and with
/// the full 20 pseudo-samples against a minute of decayed samples its first tokens came 14%
/// later than predicted while the fast ones came 8% sooner (seed 1). A quarter of it put 80-83%
/// of that sweep's predictions within 20% at the lowest rate instead of 70-75% (seeds 1-5),
/// capacity level on every scenario; the fleet's fit keeps the full pull, which held the
/// many-tenant sweep's accuracy that pulling both by 5 lost (docs/routing.md).
const FACTOR_STRENGTH: f64 = 0.25;

/// Coefficients of the TTFT model (seconds; work in tokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coefficients {
    /// Seconds before any work (scheduling, the iteration in progress, the network).
    pub fixed: f64,
    /// Extra seconds per decoding sequence: every iteration, the first token's included, carries
    /// the decode batch, so a large batch lengthens even a fully cached request's wait.
    pub per_decode: f64,
    /// Seconds per prefill token on an idle engine.
    pub per_token: f64,
    /// Extra seconds per prefill token per decoding sequence.
    pub interference: f64,
}

impl Coefficients {
    /// The predicted TTFT in seconds.
    pub fn predict(&self, work: f64, decodes: f64) -> f64 {
        self.fixed + self.per_decode * decodes + work * self.seconds_per_token(decodes)
    }

    /// The prefill time per token beside `decodes` decoding sequences.
    pub fn seconds_per_token(&self, decodes: f64) -> f64 {
        self.per_token + self.interference * decodes
    }

    /// Every coefficient times `k`: an endpoint `k` times slower.
    pub fn times(&self, k: f64) -> Self {
        Coefficients {
            fixed: self.fixed * k,
            per_decode: self.per_decode * k,
            per_token: self.per_token * k,
            interference: self.interference * k,
        }
    }

    fn scaled(&self) -> [f64; N] {
        [
            self.fixed,
            self.per_decode / DECODE_SCALE,
            self.per_token / WORK_SCALE,
            self.interference / (WORK_SCALE * DECODE_SCALE),
        ]
    }

    fn from_scaled(t: [f64; N]) -> Self {
        Coefficients {
            fixed: t[0].max(0.0),
            per_decode: (t[1] * DECODE_SCALE).max(0.0),
            per_token: (t[2] * WORK_SCALE).max(1e-9),
            interference: (t[3] * WORK_SCALE * DECODE_SCALE).max(0.0),
        }
    }
}

/// Features of the linear fit; the coefficients are scaled so the ridge penalties are
/// comparable: work in thousands of tokens, decodes in tens.
const N: usize = 4;
const WORK_SCALE: f64 = 1e-3;
const DECODE_SCALE: f64 = 0.1;

fn features(work: f64, decodes: f64) -> [f64; N] {
    let w = work * WORK_SCALE;
    let d = decodes * DECODE_SCALE;
    [1.0, d, w, w * d]
}

/// The weight of a sample whose (clipped) TTFT is `ttft` seconds, where this endpoint's TTFTs
/// run at about `typical`: inversely proportional to it, the quasi-likelihood fit for a spread
/// that grows in proportion to the mean. A long TTFT spans more iterations and shares more of
/// them with later arrivals, so its error in seconds is larger. An unweighted fit lets those
/// samples set the fixed term, which then over-predicts every short TTFT. Weighting by the
/// square, a fit of relative error, put too little weight on the long prefills that decide
/// where a busy fleet's work goes (the sim's mix capacity fell 1.3%); with 1/TTFT, 50-70% of
/// agentic predictions land within 20% instead of 39-51%, capacity level or higher
/// (docs/routing.md). Dividing by the typical TTFT keeps the mean weight near one whatever the
/// engine's speed, so `prior_strength` keeps meaning pseudo-samples (a fixed 200 ms scale gave
/// a CPU engine's one-second samples a fifth of a sample each, and the prior won: 16% within
/// 20% on real vLLM against 32%, one run each); the floor at a tenth of it keeps one instant
/// first token from dominating.
fn sample_weight(ttft: f64, typical: f64) -> f64 {
    typical / ttft.max(0.1 * typical).max(1e-6)
}

/// Decayed sufficient statistics of a least-squares fit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fit {
    /// Σ w f fᵀ.
    a: [[f64; N]; N],
    /// Σ w y f.
    v: [f64; N],
    /// Σ w (the effective sample count).
    n: f64,
    /// Decayed mean absolute residual, seconds.
    mad: f64,
    /// Decayed mean of the (clipped) samples, seconds.
    typical: f64,
    at: Nanos,
}

impl Fit {
    /// Decays the statistics to `now` with time constant `tau`.
    fn decay(&mut self, now: Nanos, tau: Nanos) {
        if now <= self.at {
            return;
        }
        let k = (-(now - self.at).as_secs_f64() / tau.as_secs_f64().max(1e-9)).exp();
        self.a.iter_mut().flatten().for_each(|x| *x *= k);
        self.v.iter_mut().for_each(|x| *x *= k);
        self.n *= k;
        self.at = now;
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
        self.typical = if self.n < 1.0 {
            y
        } else {
            self.typical + (y - self.typical) * 0.05
        };
        let w = sample_weight(y, self.typical);
        for i in 0..N {
            for j in 0..N {
                self.a[i][j] += w * f[i] * f[j];
            }
            self.v[i] += w * y * f[i];
        }
        self.mad = if self.n < 1.0 {
            residual.abs()
        } else {
            self.mad + (residual.abs().min(guard) - self.mad) * 0.05
        };
        self.n += 1.0;
    }

    /// Every sample's TTFT times `k`: the fit then solves to `k` times its coefficients when
    /// its prior is scaled alike (the ridge system is linear in both).
    fn scale(&mut self, k: f64) {
        self.v.iter_mut().for_each(|x| *x *= k);
        self.mad *= k;
        self.typical *= k;
    }

    fn merge(&mut self, other: &Fit) {
        for (x, y) in self.a.iter_mut().flatten().zip(other.a.iter().flatten()) {
            *x += y;
        }
        for (x, y) in self.v.iter_mut().zip(&other.v) {
            *x += y;
        }
        self.n += other.n;
    }

    /// The ridge solution pulled towards `prior` with `strength` pseudo-samples per coefficient,
    /// each at the samples' own scale of its feature (the mean of w·f², the diagonal of
    /// Zellner's g-prior): `strength` samples' worth of pull whatever the feature's size. A
    /// unit penalty, with work counted in thousands of tokens, outweighed a minute of
    /// 30-300-token appends (Σ w·f² of about 3 against 20), held the per-token time near the
    /// prior's and let the fixed term take the rest: 36% over at 50 tokens in
    /// `converges_from_a_prior_four_times_too_fast`, within 11% everywhere with this one.
    fn solve(&self, prior: &Coefficients, strength: f64) -> Coefficients {
        let p = prior.scaled();
        let (mut m, mut b) = (self.a, self.v);
        for i in 0..N {
            let scale = if self.n >= 1.0 {
                (self.a[i][i] / self.n).max(1e-6)
            } else {
                1.0
            };
            m[i][i] += strength * scale;
            b[i] += strength * scale * p[i];
        }
        solve(m, b).map_or(*prior, Coefficients::from_scaled)
    }
}

/// Gaussian elimination with partial pivoting; `None` when singular.
fn solve(mut m: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let pivot = (col..N).max_by(|&x, &y| m[x][col].abs().total_cmp(&m[y][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..N {
            let k = m[row][col] / m[col][col];
            let pivot_row = m[col];
            for (x, p) in m[row].iter_mut().zip(pivot_row).skip(col) {
                *x -= k * p;
            }
            b[row] -= k * b[col];
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        let s: f64 = (row + 1..N).map(|c| m[row][c] * x[c]).sum();
        x[row] = (b[row] - s) / m[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// One endpoint's decayed mean log ratio of measured to fleet-predicted TTFT.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Ratio {
    weight: f64,
    sum: f64,
    at: Nanos,
    /// The factor at `at`, kept because every pick asks every endpoint for it.
    memo: Option<f64>,
}

impl Ratio {
    fn decay(&mut self, now: Nanos, tau: Nanos) {
        if now > self.at {
            let k = (-(now - self.at).as_secs_f64() / tau.as_secs_f64().max(1e-9)).exp();
            self.weight *= k;
            self.sum *= k;
            self.at = now;
            self.memo = None;
        }
    }

    /// The factor, pulled towards 1 by `strength` pseudo-samples.
    fn factor(&mut self, strength: f64) -> f64 {
        let (sum, weight) = (self.sum, self.weight);
        *self
            .memo
            .get_or_insert_with(|| (sum / (weight + strength)).exp())
    }
}

/// The calibration of every endpoint. See the module documentation.
#[derive(Clone, Debug)]
pub struct Calibration {
    prior: Coefficients,
    /// How much slower than `prior` the fleet has turned out to be: the level taken out of the
    /// factors ([`Calibration::recentre`]), which scales the prior the fit is pulled towards.
    level: f64,
    tau: Nanos,
    strength: f64,
    fits: Vec<(u32, Fit)>,
    ratios: Vec<(u32, Ratio)>,
    pooled: Option<(Nanos, Coefficients)>,
    /// A newcomer's factor and when it was computed: every pick asks it of every endpoint
    /// without samples, and it costs a pass over the others.
    newcomer: Option<(Nanos, f64)>,
}

impl Calibration {
    /// A calibration starting from `prior`, forgetting with time constant `tau`, each
    /// endpoint's fit pulled towards the fleet's with `strength` pseudo-samples.
    pub fn new(prior: Coefficients, tau: Nanos, strength: f64) -> Self {
        Calibration {
            prior,
            level: 1.0,
            tau,
            strength,
            fits: Vec::new(),
            ratios: Vec::new(),
            pooled: None,
            newcomer: None,
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
        let c = pooled.solve(&self.prior.times(self.level), self.strength);
        self.pooled = Some((now, c));
        c
    }

    /// `endpoint`'s coefficients at `now`: the fleet's times its own factor.
    pub fn coefficients(&mut self, endpoint: u32, now: Nanos) -> Coefficients {
        let factor = self.factor(endpoint, now);
        self.fleet(now).times(factor)
    }

    /// How much slower (above 1) or faster than the fleet `endpoint` is at `now`. An endpoint
    /// without samples gets the geometric mean of the others' factors: with the factor's weak
    /// pull the fleet's fit can settle near the replicas whose factor is 1, and a newcomer
    /// should start in the middle of the fleet, not at its fastest.
    pub fn factor(&mut self, endpoint: u32, now: Nanos) -> f64 {
        let (tau, strength) = (self.tau, self.strength * FACTOR_STRENGTH);
        match self.ratios.binary_search_by_key(&endpoint, |&(e, _)| e) {
            Ok(i) => {
                let r = &mut self.ratios[i].1;
                r.decay(now, tau);
                r.factor(strength)
            }
            Err(_) => {
                if let Some((_, f)) = self.newcomer.filter(|&(at, _)| at == now) {
                    return f;
                }
                let n = self.ratios.len();
                let logs: f64 = self
                    .ratios
                    .iter_mut()
                    .map(|(_, r)| {
                        r.decay(now, tau);
                        r.factor(strength).ln()
                    })
                    .sum();
                let f = if n == 0 { 1.0 } else { (logs / n as f64).exp() };
                self.newcomer = Some((now, f));
                f
            }
        }
    }

    /// Records one observed first token on `endpoint`: `work` prefill tokens (queued ahead
    /// plus its own uncached), `decodes` beside it, `ttft` seconds.
    pub fn observe(&mut self, endpoint: u32, now: Nanos, work: f64, decodes: f64, ttft: f64) {
        self.newcomer = None;
        let fleet = self.fleet(now);
        let predicted = fleet.predict(work, decodes).max(1e-6);
        let (tau, strength) = (self.tau, self.strength * FACTOR_STRENGTH);
        let i = match self.ratios.binary_search_by_key(&endpoint, |&(e, _)| e) {
            Ok(i) => i,
            Err(i) => {
                self.ratios.insert(i, (endpoint, Ratio::default()));
                i
            }
        };
        let r = &mut self.ratios[i].1;
        r.decay(now, tau);
        r.weight += 1.0;
        r.sum += (ttft.max(1e-6) / predicted).ln().clamp(-1.5, 1.5);
        r.memo = None;
        let factor = r.factor(strength);
        // The fleet's fit learns the endpoint's sample at fleet speed.
        let fit = self.fit_mut(endpoint);
        fit.decay(now, tau);
        fit.add(work, decodes, ttft / factor, &fleet);
        self.recentre(now);
    }

    /// Moves what the endpoints' factors have in common into the fleet's fit: every factor
    /// divided by their sample-weighted geometric mean, the fit's samples and prior multiplied
    /// by it, so every prediction stays as it was and the factors say only how endpoints
    /// differ.
    ///
    /// Fit and factors multiply, so only their product is identified, and left alone they split
    /// it badly when the prior is far off: on two CPU vLLM engines 2-4x slower than the
    /// prior, the fit learned samples already divided by factors that had climbed to 1.6 and
    /// 2.3 and stayed near the prior, and the factor of the endpoint taking a third of the
    /// requests, pulled towards 1 by its pseudo-samples, lagged its truth by 1.9x
    /// (docs/routing.md). Centred, that pull is towards the fleet.
    fn recentre(&mut self, now: Nanos) {
        let strength = self.strength * FACTOR_STRENGTH;
        let (mut sum, mut weight) = (0.0, 0.0);
        for (_, r) in &mut self.ratios {
            r.decay(now, self.tau);
            sum += r.weight * r.factor(strength).ln();
            weight += r.weight;
        }
        if weight <= 0.0 || sum == 0.0 {
            return;
        }
        let shift = sum / weight;
        let k = shift.exp();
        for (_, r) in &mut self.ratios {
            // Every factor divided by exactly `k`: the pseudo-samples move with the mean.
            r.sum -= shift * (r.weight + strength);
            r.memo = None;
        }
        for (_, f) in &mut self.fits {
            f.scale(k);
        }
        self.level *= k;
        if let Some((_, c)) = &mut self.pooled {
            *c = c.times(k);
        }
        self.newcomer = None;
    }

    /// `endpoint`'s effective sample count at `now`.
    pub fn samples(&self, endpoint: u32, now: Nanos) -> f64 {
        self.ratios
            .binary_search_by_key(&endpoint, |&(e, _)| e)
            .map_or(0.0, |i| {
                let mut r = self.ratios[i].1;
                r.decay(now, self.tau);
                r.weight
            })
    }

    /// Forgets an endpoint that left.
    pub fn remove(&mut self, endpoint: u32) {
        self.newcomer = None;
        if let Ok(i) = self.fits.binary_search_by_key(&endpoint, |&(e, _)| e) {
            self.fits.remove(i);
        }
        if let Ok(i) = self.ratios.binary_search_by_key(&endpoint, |&(e, _)| e) {
            self.ratios.remove(i);
        }
    }
}

#[cfg(test)]
mod tests;
