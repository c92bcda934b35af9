//! Rate limits as tenancy applies them: taken at admission, corrected at settlement, and the
//! refusal and `x-ratelimit-*` headers a client sees.

use super::*;

pub(super) fn rate_limited(e: &Exceeded, tenant: &str) -> ApiError {
    let secs = e.retry_after.as_secs_f64();
    let mut err = ApiError::rate_limited(format!(
        "rate limit of {} {} per minute reached for {tenant}; retry in {:.1} s",
        e.limit,
        e.kind.label().replace('_', " "),
        secs
    ));
    err.retry_after_secs = Some(secs.ceil().max(1.0) as u64);
    err
}

/// OpenAI's `x-ratelimit-*` headers for the limiter's rates.
pub(super) fn ratelimit_headers(l: &mut RateLimiter, now: Nanos) -> Vec<(&'static str, String)> {
    use kvgate_core::tenancy::LimitKind::*;
    let mut out = Vec::new();
    for (kind, limit, remaining, reset) in l.snapshot(now) {
        let (l_name, r_name, t_name) = match kind {
            Requests => (
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ),
            InputTokens => (
                "x-ratelimit-limit-input-tokens",
                "x-ratelimit-remaining-input-tokens",
                "x-ratelimit-reset-input-tokens",
            ),
            OutputTokens => (
                "x-ratelimit-limit-output-tokens",
                "x-ratelimit-remaining-output-tokens",
                "x-ratelimit-reset-output-tokens",
            ),
            Concurrency => continue,
        };
        out.push((l_name, format!("{limit:.0}")));
        out.push((r_name, format!("{:.0}", remaining.floor())));
        out.push((t_name, format!("{reset:.3}s")));
    }
    out
}

impl Tenancy {
    /// Checks every scope, then commits to all of them; the ids committed and the first one's
    /// `x-ratelimit-*` headers.
    pub(super) fn take_limits(
        &self,
        scopes: &[(String, &LimitsConfig)],
        estimate: &Charge,
        now: Nanos,
        label: &str,
        tenant: &str,
    ) -> Result<(Vec<String>, Headers), ApiError> {
        if scopes.is_empty() {
            return Ok((Vec::new(), Box::new([])));
        }
        let weights = self.config.charge.weights;
        let mut limiters = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        for (id, config) in scopes {
            let l = limiters
                .entry(id.clone())
                .or_insert_with(|| RateLimiter::new(config, weights, now));
            if let Err(e) = l.check(now, estimate) {
                self.refuse(label, e.kind.label());
                let mut err = rate_limited(&e, if tenant.is_empty() { id } else { tenant });
                err.headers = ratelimit_headers(l, now).into_boxed_slice();
                return Err(err);
            }
        }
        let mut ids = Vec::with_capacity(scopes.len());
        let mut headers = Vec::new();
        for (id, _) in scopes {
            if let Some(l) = limiters.get_mut(id) {
                l.commit(now, estimate);
                if ids.is_empty() {
                    headers = ratelimit_headers(l, now);
                }
                ids.push(id.clone());
            }
        }
        drop(limiters);
        self.share_limits(&ids, 1.0, estimate, &Charge::default());
        Ok((ids, headers.into_boxed_slice()))
    }

    pub(super) fn release_limits(
        &self,
        ids: &[String],
        estimate: &Charge,
        actual: &Charge,
        now: Nanos,
    ) {
        if ids.is_empty() {
            return;
        }
        let mut limiters = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            if let Some(l) = limiters.get_mut(id) {
                l.settle(now, estimate, actual);
            }
        }
        drop(limiters);
        self.share_limits(ids, 0.0, actual, estimate);
    }
}
