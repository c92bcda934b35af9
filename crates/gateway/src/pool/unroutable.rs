//! Why an endpoint takes no traffic now, and why a request found no endpoint at all: the
//! reason `/admin/endpoints` and `/ui` show beside each endpoint, and the message of the 503
//! when nothing could take a request. The dispatch core only says "no routable endpoint"; an
//! operator needs which endpoints, why, and for how long.

use super::endpoint::EndpointInfo;
use super::Pool;
use kvgate_core::Nanos;
use std::fmt::Write as _;

/// Why one endpoint takes no request now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    Down,
    Draining,
    CoolingDown,
    AtLimits,
}

/// At most this many endpoints are named in a 503's message.
const NAMED: usize = 5;

/// Why `e` takes no request at `now` (`None`: nothing keeps it out but, perhaps, its rate
/// limits, which only a request's size decides).
fn out_of_routing(e: &EndpointInfo, now: Nanos) -> Option<(Out, String)> {
    let seconds = |until: Nanos| (until.0.saturating_sub(now.0) as f64 / 1e9).ceil();
    if e.draining {
        return Some((Out::Draining, "draining: taken out of routing".into()));
    }
    if !e.healthy || e.reports_down {
        let why = e.trouble.as_ref().map_or_else(
            || "it failed its health checks".to_string(),
            ToString::to_string,
        );
        return Some((Out::Down, format!("down: {why}")));
    }
    if let Some(until) = e.breaker.open_until(now) {
        return Some((
            Out::CoolingDown,
            format!(
                "cooling down: its circuit breaker opened after failed requests; tried again in \
                 {} s",
                seconds(until)
            ),
        ));
    }
    if now < e.avoid_until {
        return Some((
            Out::CoolingDown,
            format!(
                "cooling down: it answered Retry-After; takes traffic again in {} s",
                seconds(e.avoid_until)
            ),
        ));
    }
    None
}

/// What an operator reads beside `e` at `now`: why it takes no traffic, if it takes none.
pub(super) fn reason(e: &EndpointInfo, now: Nanos) -> Option<String> {
    out_of_routing(e, now).map(|(_, why)| why)
}

/// What an operator reads beside `e` while it is routed with less than it should have.
pub(super) fn warning(e: &EndpointInfo) -> Option<String> {
    e.metrics_missing.map(|status| {
        format!(
            "GET /metrics answered {status}: routed without its load signals (is the URL the \
             engine's base URL, without /v1?)"
        )
    })
}

impl Pool {
    /// Why no endpoint could take a request for `model` now: the message of its 503.
    pub fn why_unroutable(&self, model: Option<&str>) -> String {
        let now = self.clock.now();
        let snapshot = self.snapshot.load();
        if snapshot.endpoints.is_empty() {
            return "the pool has no endpoints (configure some, or check discovery)".into();
        }
        let serving: Vec<&EndpointInfo> = snapshot
            .endpoints
            .iter()
            .filter(|e| e.about.serves(model))
            .collect();
        let serving_what = model.map_or_else(String::new, |m| format!(" serving `{m}`"));
        if serving.is_empty() {
            return format!("no endpoint{serving_what}");
        }
        let outs: Vec<(Out, String)> = serving
            .iter()
            .map(|e| {
                out_of_routing(e, now).unwrap_or((
                    Out::AtLimits,
                    "at its limits (requests or tokens per minute, or requests in flight)".into(),
                ))
            })
            .collect();
        if let [(_, why)] = outs.as_slice() {
            let name = &serving[0].about.name;
            return format!("the only endpoint{serving_what}, {name}, is {why}");
        }
        let first = outs[0].0;
        let headline = match first {
            _ if outs.iter().any(|(o, _)| *o != first) => "none can take it now",
            Out::Down => "all are down",
            Out::Draining => "all are draining",
            Out::CoolingDown => "all are cooling down after failures",
            Out::AtLimits => "all are at their limits",
        };
        let mut message = format!("{} endpoints{serving_what}, {headline}: ", serving.len());
        for (i, (e, (_, why))) in serving.iter().zip(&outs).take(NAMED).enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            let _ = write!(message, "{sep}{} is {why}", e.about.name);
        }
        if serving.len() > NAMED {
            let _ = write!(message, "; and {} more", serving.len() - NAMED);
        }
        message
    }
}
