//! Difficulty routing on the request path: a request for a routed name is scored and sent to
//! the cheap or the strong model of its group; with a cascade, the cheap model is asked first
//! (not streamed, logprobs on) and an unsure answer escalates to the strong one within the
//! escalation budget and the strong tier's cap.
//!
//! Each tier's request runs through every stage of `crate::proxy` (admission, tenancy, the
//! pick, retries), so an escalated request is two requests in the access log, the metrics and
//! the tenant's spend, as it is on the engines. Response headers say what happened:
//! `x-kvgate-tier` (`cheap`, `strong`), `x-kvgate-difficulty` (score, threshold, scorer,
//! reason), `x-kvgate-confidence` (the cheap answer's, or `none` without logprobs) and
//! `x-kvgate-escalation` (`granted`, `denied-budget`, `denied-cap`, `chain-exhausted`).

mod answer;

use crate::difficulty::{OnDenied, RouteNote, Routed, StrongSlot, Verdict};
use crate::error::ApiError;
use crate::parse::Api;
use crate::proxy;
use crate::state::Shared;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, request::Parts, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use kvgate_core::difficulty::confidence::{confidence, Step};
use serde_json::Value;
use std::sync::Arc;

/// Response header: the tier that answered.
pub(crate) const TIER_HEADER: &str = "x-kvgate-tier";
/// Response header: the score, the threshold and why.
pub(crate) const DIFFICULTY_HEADER: &str = "x-kvgate-difficulty";
/// Response header: the cheap answer's confidence.
pub(crate) const CONFIDENCE_HEADER: &str = "x-kvgate-confidence";
/// Response header: what became of an escalation (or of a strong verdict over the cap).
pub(crate) const ESCALATION_HEADER: &str = "x-kvgate-escalation";

/// The largest cheap answer read back for its logprobs.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// Serves an inference request: routed names here, every other through the proxy unread.
pub(crate) async fn serve(shared: Arc<Shared>, api: Api, req: Request) -> Response {
    if !shared.difficulty.any() {
        return proxy::serve(shared, api, req).await;
    }
    let (mut parts, body) = req.into_parts();
    let limit = shared.config.requests.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            let error = if over {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid("body_read_error", format!("could not read the body: {e}"))
            };
            return error.into_response();
        }
    };
    let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
    let shared2 = shared.clone();
    let routed = parsed.as_ref().and_then(|v| {
        let routed = shared2.difficulty.get(v["model"].as_str()?)?;
        Some((v, routed))
    });
    // The tenant whose escalation budget applies (one shared budget without keys); a bad key
    // goes on to the proxy, which refuses it as it refuses any other request.
    let key = routed.and_then(|_| proxy::intake::identify(&shared, &parts.headers).ok());
    let (Some((body, routed)), Some(key)) = (routed, key) else {
        return proxy::serve(shared, api, Request::from_parts(parts, Body::from(bytes))).await;
    };
    // A key limited to some models must list the routed name (and, for the tiers' requests,
    // its cheap and strong models): the name is no way round the key's list.
    if let Some(k) = key
        .as_ref()
        .filter(|k| k.models.as_ref().is_some_and(|m| !m.contains(&routed.name)))
    {
        return ApiError::model_not_allowed(&k.name, &routed.name).into_response();
    }
    let tenant = key
        .map(|k| k.tenant.clone().unwrap_or_else(|| k.name.clone()))
        .unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    let call = Call {
        shared,
        api,
        parts,
        body,
        routed,
        tenant: &tenant,
    };
    call.route().await
}

/// One routed request.
struct Call<'a> {
    shared: Arc<Shared>,
    api: Api,
    parts: Parts,
    body: &'a Value,
    routed: &'a Routed,
    tenant: &'a str,
}

/// What the headers report.
struct Report {
    verdict: Verdict,
    confidence: Option<Option<f64>>,
    escalation: Option<&'static str>,
}

impl Report {
    /// The verdict, as `x-kvgate-difficulty` says it.
    fn verdict_text(&self) -> String {
        let v = &self.verdict;
        format!(
            "score={:.4} threshold={:.4} scorer={} reason={}",
            v.score.p,
            v.threshold,
            v.score.scorer.name(),
            v.score.reason
        )
    }

    /// Everything known so far, for the access log.
    fn describe(&self) -> String {
        let mut out = self.verdict_text();
        if let Some(c) = self.confidence {
            let c = c.map_or_else(|| "none".to_owned(), |c| format!("{c:.4}"));
            out.push_str(&format!(" confidence={c}"));
        }
        if let Some(e) = self.escalation {
            out.push_str(&format!(" escalation={e}"));
        }
        out
    }
}

impl Call<'_> {
    async fn route(self) -> Response {
        let now = self.shared.pool.clock().now();
        let (text, tools) = crate::difficulty::judged(self.body);
        let verdict = self.routed.decide(&text, tools, self.tenant, now).await;
        let mut report = Report {
            verdict,
            confidence: None,
            escalation: None,
        };
        if report.verdict.strong {
            if let Some(slot) = self.routed.strong_slot() {
                return self.strong(slot, report).await;
            }
            report.escalation = Some("denied-cap");
        }
        match self.routed.config.cascade.clone() {
            None => {
                let response = self
                    .send(
                        &self.routed.config.cheap,
                        self.body.clone(),
                        "cheap",
                        &report,
                    )
                    .await;
                self.routed.settled(false);
                finish(response, false, &report)
            }
            Some(cascade) => self.cascade(&cascade, report).await,
        }
    }

    async fn strong(&self, slot: StrongSlot, report: Report) -> Response {
        let response = self
            .send(
                &self.routed.config.strong,
                self.body.clone(),
                "strong",
                &report,
            )
            .await;
        self.routed.settled(true);
        let (p, b) = finish(response, true, &report).into_parts();
        // The slot is given back when the body ends or the client leaves.
        let held = b.into_data_stream().map(move |chunk| {
            let _ = &slot;
            chunk
        });
        Response::from_parts(p, Body::from_stream(held))
    }

    async fn cascade(
        &self,
        cascade: &crate::difficulty::CascadeConfig,
        mut report: Report,
    ) -> Response {
        let response = self
            .send(
                &self.routed.config.cheap,
                self.probe(cascade.top_logprobs),
                "cheap-probe",
                &report,
            )
            .await;
        if !response.status().is_success() {
            self.routed.settled(false);
            return finish(response, false, &report);
        }
        let (head, body) = response.into_parts();
        let Some(mut answer) = axum::body::to_bytes(body, MAX_ANSWER_BYTES)
            .await
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        else {
            self.routed.settled(false);
            return ApiError::upstream("the cheap model's answer could not be read")
                .into_response();
        };
        let tokens = answer::token_logprobs(self.api, &answer);
        let conf = confidence(&tokens, cascade.confidence.quantile);
        report.confidence = Some(conf.map(|c| c.value));
        match cascade.confidence.step(conf.as_ref(), 0) {
            Step::Accept | Step::AcceptUnscored => {}
            Step::ChainExhausted => {
                self.routed.chain_exhausted();
                report.escalation = Some("chain-exhausted");
            }
            Step::Escalate => {
                let now = self.shared.pool.clock().now();
                match self.routed.escalate(self.tenant, now) {
                    Ok(slot) => {
                        report.escalation = Some("granted");
                        return self.strong(slot, report).await;
                    }
                    Err(refusal) => {
                        report.escalation = Some(refusal.label());
                        if cascade.on_denied == OnDenied::Reject {
                            self.routed.settled(false);
                            return finish(
                                rejected(refusal.label(), cascade.retry_after_secs),
                                false,
                                &report,
                            );
                        }
                    }
                }
            }
        }
        self.routed.settled(false);
        finish(self.deliver(head, &mut answer), false, &report)
    }

    /// The body the cheap model is asked in a cascade: whole, with logprobs.
    fn probe(&self, top: u32) -> Value {
        let mut probe = self.body.clone();
        probe["stream"] = Value::Bool(false);
        if let Some(o) = probe.as_object_mut() {
            o.remove("stream_options");
        }
        match self.api {
            Api::Chat => {
                probe["logprobs"] = Value::Bool(true);
                probe["top_logprobs"] = top.into();
            }
            Api::Completions => probe["logprobs"] = top.into(),
        }
        probe
    }

    /// The cheap answer as the client asked for it.
    fn deliver(&self, mut head: axum::http::response::Parts, answer: &mut Value) -> Response {
        let wanted = self
            .body
            .get("logprobs")
            .is_some_and(|l| l != &Value::Null && l != &Value::Bool(false));
        if !wanted {
            answer::strip_logprobs(answer);
        }
        head.headers.remove(header::CONTENT_LENGTH);
        let (bytes, content_type) = if self.body["stream"] == Value::Bool(true) {
            let usage = self.body["stream_options"]["include_usage"] == Value::Bool(true);
            (
                answer::replay(self.api, answer, usage),
                "text/event-stream; charset=utf-8",
            )
        } else {
            (bytes::Bytes::from(answer.to_string()), "application/json")
        };
        head.headers
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        Response::from_parts(head, Body::from(bytes))
    }

    /// Sends `body` for `model` through the proxy's stages, its access-log line noting `tier`
    /// and `report`.
    async fn send(&self, model: &str, mut body: Value, tier: &str, report: &Report) -> Response {
        body["model"] = Value::String(model.to_owned());
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut req = Request::from_parts(self.parts.clone(), Body::from(bytes));
        let note = format!("tier={tier} {}", report.describe());
        req.extensions_mut().insert(RouteNote(note.into()));
        proxy::serve(self.shared.clone(), self.api, req).await
    }
}

fn rejected(label: &'static str, retry_after_secs: u64) -> Response {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "the cheap model's answer was unsure and escalation was refused ({label}); retry later"
        ),
        kind: "server_error",
        param: None,
        code: "escalation_denied",
        retry_after_secs: Some(retry_after_secs),
        headers: Box::new([]),
    }
    .into_response()
}

/// Adds the routing headers.
fn finish(mut response: Response, strong: bool, report: &Report) -> Response {
    let h = response.headers_mut();
    h.insert(
        TIER_HEADER,
        HeaderValue::from_static(if strong { "strong" } else { "cheap" }),
    );
    if let Ok(value) = HeaderValue::from_str(&report.verdict_text()) {
        h.insert(DIFFICULTY_HEADER, value);
    }
    if let Some(c) = report.confidence {
        let text = c.map_or_else(|| "none".to_owned(), |c| format!("{c:.4}"));
        if let Ok(value) = HeaderValue::from_str(&text) {
            h.insert(CONFIDENCE_HEADER, value);
        }
    }
    if let Some(e) = report.escalation {
        h.insert(ESCALATION_HEADER, HeaderValue::from_static(e));
    }
    response
}
