//! The random distributions workloads draw from, written out so the crate needs only `rand`'s
//! uniform source and every draw is reproducible from a seed.
//!
//! - Exponential and gamma inter-arrival times: vLLM bench's `--burstiness` is the gamma shape
//!   (CV = 1/sqrt(shape); 1.0 is Poisson).
//! - Lognormal lengths parameterised by mean and coefficient of variation, optionally clamped (the
//!   routing lab's prompts: mean 957, CV 0.75, 436..=3079; docs/background.md#routing-lab).

use rand::{Rng, RngCore};

/// A uniform draw in (0, 1], never zero, so logarithms are finite.
fn open01(rng: &mut dyn RngCore) -> f64 {
    1.0 - rng.random::<f64>()
}

/// A standard normal draw (Box-Muller).
pub fn normal(rng: &mut dyn RngCore) -> f64 {
    let u1 = open01(rng);
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// An exponential draw with the given mean.
pub fn exponential(rng: &mut dyn RngCore, mean: f64) -> f64 {
    -mean * open01(rng).ln()
}

/// A gamma draw with `shape` and `scale` (Marsaglia and Tsang, 2000; shape < 1 by boosting).
pub fn gamma(rng: &mut dyn RngCore, shape: f64, scale: f64) -> f64 {
    if shape <= 0.0 || scale <= 0.0 {
        return 0.0;
    }
    if shape < 1.0 {
        let u = open01(rng);
        return gamma(rng, shape + 1.0, scale) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = open01(rng);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

/// Inter-arrival gaps of a renewal process with `rate` arrivals per unit time and gamma shape
/// `burstiness` (1 = Poisson, below 1 burstier, above 1 more regular).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrivals {
    /// Mean arrivals per unit time.
    pub rate: f64,
    /// Gamma shape of the gaps.
    pub burstiness: f64,
}

impl Arrivals {
    /// The next gap, in the rate's time unit.
    pub fn gap(&self, rng: &mut dyn RngCore) -> f64 {
        if self.rate <= 0.0 {
            return f64::INFINITY;
        }
        let mean = 1.0 / self.rate;
        if (self.burstiness - 1.0).abs() < 1e-12 {
            exponential(rng, mean)
        } else {
            gamma(rng, self.burstiness, mean / self.burstiness)
        }
    }
}

/// A length distribution: lognormal with a given mean and CV, clamped to `[min, max]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lengths {
    /// Mean before clamping.
    pub mean: f64,
    /// Coefficient of variation before clamping (0 gives the mean every time).
    pub cv: f64,
    /// Smallest value.
    pub min: u32,
    /// Largest value.
    pub max: u32,
}

impl Lengths {
    /// The same distribution (spread and clamps) around another mean.
    pub fn with_mean(self, mean: f64) -> Self {
        Lengths { mean, ..self }
    }

    /// A fixed length.
    pub fn fixed(n: u32) -> Self {
        Lengths {
            mean: f64::from(n),
            cv: 0.0,
            min: n,
            max: n,
        }
    }

    /// Lognormal with this mean and CV, clamped to `[1, u32::MAX]`.
    pub fn lognormal(mean: f64, cv: f64) -> Self {
        Lengths {
            mean,
            cv,
            min: 1,
            max: u32::MAX,
        }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut dyn RngCore) -> u32 {
        let x = if self.cv <= 0.0 {
            self.mean
        } else {
            // For a lognormal, CV^2 = exp(sigma^2) - 1 and mean = exp(mu + sigma^2 / 2).
            let sigma2 = (1.0 + self.cv * self.cv).ln();
            let mu = self.mean.max(1e-9).ln() - sigma2 / 2.0;
            (mu + sigma2.sqrt() * normal(rng)).exp()
        };
        let lo = f64::from(self.min.max(1));
        let hi = f64::from(self.max.max(self.min.max(1)));
        x.round().clamp(lo, hi) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn moments(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn lognormal_matches_mean_and_cv() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let d = Lengths::lognormal(957.0, 0.75);
        let xs: Vec<f64> = (0..200_000)
            .map(|_| f64::from(d.sample(&mut rng)))
            .collect();
        let (mean, cv) = moments(&xs);
        assert!((mean - 957.0).abs() < 10.0, "{mean}");
        assert!((cv - 0.75).abs() < 0.03, "{cv}");
    }

    #[test]
    fn clamping_holds() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let d = Lengths {
            min: 436,
            max: 3079,
            ..Lengths::lognormal(957.0, 0.75)
        };
        assert!((0..10_000)
            .map(|_| d.sample(&mut rng))
            .all(|x| (436..=3079).contains(&x)));
        assert_eq!(Lengths::fixed(7).sample(&mut rng), 7);
    }

    #[test]
    fn gamma_arrivals_have_cv_one_over_sqrt_shape() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for (shape, want_cv) in [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)] {
            let a = Arrivals {
                rate: 0.2,
                burstiness: shape,
            };
            let xs: Vec<f64> = (0..200_000).map(|_| a.gap(&mut rng)).collect();
            let (mean, cv) = moments(&xs);
            assert!((mean - 5.0).abs() < 0.1, "shape {shape}: mean {mean}");
            assert!((cv - want_cv).abs() < 0.05, "shape {shape}: cv {cv}");
        }
    }
}
