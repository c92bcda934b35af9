//! One HTTP request as an endpoint picker sees it over one ext_proc stream: its headers and
//! body come in, the pick goes out (or an immediate answer: 400 for a body the gateway would
//! refuse, 503 when no endpoint can take it), then the response passes through and tells the
//! pool what a proxied request would have told it (first token, usage, end). A stream that
//! ends before the response did leaves a cancelled dispatch, as a client that went away does.
//!
//! The request passes the proxy's first stages on the same code (`crate::proxy`): the client's
//! key, the body parsed, tenancy's lease (rate limits, budgets); its [`Ending`] writes the access
//! log line, the request metrics and the span, and settles the lease, as a proxied request's
//! does. The admission queue and the agent controls' holds are not applied: the data plane
//! waits on the picker's answer within its message timeout (Envoy's ext_proc: 200 ms by
//! default), so a picker does not queue.

use super::wire;
use crate::dispatch::Dispatch;
use crate::ending::Ending;
use crate::error::ApiError;
use crate::pool::Attempt;
use crate::proxy::{admit, intake};
use crate::relay::SseEvents;
use crate::state::Shared;
use crate::usage::UsageTail;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::BytesMut;
use envoy_types::pb::envoy::config::core::v3::HeaderMap as EnvoyHeaders;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use kvgate_core::resilience::Outcome;
use kvgate_core::EndpointId;
use std::sync::Arc;

/// `ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED`: the proxy streams the body without
/// waiting for answers, and the processor sends back the body it lets through.
const FULL_DUPLEX_STREAMED: i32 = 4;

/// The state of one ext_proc stream.
pub(crate) struct Exchange {
    shared: Arc<Shared>,
    /// Request and response body modes are full-duplex streaming (else buffered).
    duplex: (bool, bool),
    headers: HeaderMap,
    path: String,
    body: BytesMut,
    subset: Option<Vec<String>>,
    dispatch: Option<Dispatch>,
    ok: bool,
    first: bool,
    usage: UsageTail,
    events: SseEvents,
    /// How the request ends, from its headers' arrival; dropped (written) when it ended.
    ending: Option<Ending>,
}

impl Exchange {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Exchange {
            shared,
            duplex: (false, false),
            headers: HeaderMap::new(),
            path: String::new(),
            body: BytesMut::new(),
            subset: None,
            dispatch: None,
            ok: true,
            first: false,
            usage: UsageTail::default(),
            events: SseEvents::default(),
            ending: None,
        }
    }

    /// The answers to one message from the proxy.
    pub(crate) fn on(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if let Some(config) = &message.protocol_config {
            self.duplex = (
                config.request_body_mode == FULL_DUPLEX_STREAMED,
                config.response_body_mode == FULL_DUPLEX_STREAMED,
            );
        }
        if let Some(subset) = wire::subset(message.metadata_context.as_ref()) {
            self.subset = Some(subset);
        }
        match message.request {
            Some(Request::RequestHeaders(h)) => self.request_headers(&h),
            Some(Request::RequestBody(b)) => {
                self.body.extend_from_slice(&b.body);
                let limit = self.shared.config.requests.max_body_bytes;
                if self.body.len() > limit {
                    let error = ApiError::too_large(limit);
                    return vec![self.refuse(&error, "bad_request", Some(Outcome::ClientError))];
                }
                if !b.end_of_stream {
                    return Vec::new();
                }
                self.pick()
            }
            Some(Request::ResponseHeaders(h)) => self.response_headers(&h),
            Some(Request::ResponseBody(b)) => self.response_body(b),
            Some(Request::RequestTrailers(_)) | Some(Request::ResponseTrailers(_)) | None => {
                Vec::new()
            }
        }
    }

    /// The request's headers: it arrived.
    fn request_headers(&mut self, h: &HttpHeaders) -> Vec<ProcessingResponse> {
        self.read_headers(h.headers.as_ref());
        let mut ending = Ending::new(self.shared.clone());
        ending.client_request_id(self.headers.get("x-request-id"));
        ending.trace(&self.headers);
        self.ending = Some(ending);
        if h.end_of_stream {
            let error = ApiError::invalid("invalid_body", "an inference request needs a body");
            return vec![self.refuse(&error, "bad_request", Some(Outcome::ClientError))];
        }
        // Buffered: the body comes once the headers are answered, and the pick rides on the
        // body's answer. Full duplex: the headers wait for the pick.
        if self.duplex.0 {
            Vec::new()
        } else {
            vec![wire::headers_continue()]
        }
    }

    /// The response's headers: a status other than 2xx passes to the client as it is.
    fn response_headers(&mut self, h: &HttpHeaders) -> Vec<ProcessingResponse> {
        let status = h
            .headers
            .iter()
            .flat_map(|m| &m.headers)
            .find(|v| v.key == ":status")
            .and_then(|v| header_text(v).parse::<u16>().ok());
        if let (Some(status), Some(d)) = (status, &self.dispatch) {
            if !(200..300).contains(&status) {
                self.ok = false;
                d.refused(status);
            }
        }
        if let Some(e) = &mut self.ending {
            e.facts().status = status;
        }
        if h.end_of_stream {
            self.complete();
        }
        vec![wire::response_headers_continue()]
    }

    /// A piece of the response's body: its first is the first token; each later piece of a
    /// stream is an engine iteration, as in a relayed stream, and ticks the endpoint's
    /// iteration clock.
    fn response_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        if !b.body.is_empty() {
            if let Some(d) = self.dispatch.as_mut().filter(|_| self.ok) {
                if self.first {
                    d.tokens();
                } else {
                    self.first = true;
                    d.first_token();
                    if let Some(e) = self.ending.as_mut().filter(|_| d.stream()) {
                        e.facts().first_token = Some(std::time::Instant::now());
                    }
                }
            }
            self.usage.feed(&b.body);
            self.events.feed(&b.body);
        }
        if b.end_of_stream {
            self.complete();
        }
        vec![if self.duplex.1 {
            wire::streamed_body(b.body, b.end_of_stream, false)
        } else {
            wire::response_body_continue()
        }]
    }

    fn read_headers(&mut self, headers: Option<&EnvoyHeaders>) {
        for h in headers.iter().flat_map(|m| &m.headers) {
            if h.key == ":path" {
                self.path = header_text(h).to_owned();
            } else if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(h.key.as_bytes()),
                HeaderValue::from_str(header_text(h)),
            ) {
                self.headers.append(name, value);
            }
        }
    }

    /// The body is complete: the proxy's first stages (key, parse, lease), then the pick.
    fn pick(&mut self) -> Vec<ProcessingResponse> {
        let path = self.path.split('?').next().unwrap_or_default();
        let Some(api) = intake::api_of(path) else {
            let error = ApiError::invalid(
                "invalid_path",
                format!("{path:?} is not /v1/chat/completions or /v1/completions"),
            );
            return vec![self.refuse(&error, "bad_request", Some(Outcome::ClientError))];
        };
        let key = match intake::identify(&self.shared, &self.headers) {
            Ok(key) => key,
            Err(e) => return vec![self.refuse(&e, "refused", Some(Outcome::Refused))],
        };
        let body = std::mem::take(&mut self.body).freeze();
        let mut inference = match intake::parse(&self.shared, api, &self.headers, body.clone()) {
            Ok(i) => i,
            Err(e) => return vec![self.refuse(&e, "bad_request", Some(Outcome::ClientError))],
        };
        let Some(ending) = self.ending.as_mut() else {
            return Vec::new(); // a body before its headers: the stream is broken
        };
        ending.describe(&inference.request, inference.api, inference.stream);
        let arrived = self.shared.pool.clock().now();
        if let Err(e) = admit::lease(&self.shared, key, &mut inference, arrived, ending) {
            // The lease set the outcome.
            return vec![self.refuse(&e, "refused", None)];
        }
        let mut request = inference.request;
        request.id = ending.id();
        let outside = self.outside_subset();
        let stream = inference.stream;
        let dispatch =
            match Dispatch::pick(&self.shared, &request, &outside, Attempt::First, stream) {
                Ok(d) => d,
                Err(r) => {
                    let why = self.shared.pool.why_unroutable(request.model.as_deref());
                    let error = ApiError::no_endpoint(format!("{r}: {why}"));
                    return vec![self.refuse(&error, "no_endpoint", Some(Outcome::NoEndpoint))];
                }
            };
        let address = address(&dispatch.target.base);
        self.count("picked");
        if let Some(ending) = &mut self.ending {
            ending.at(dispatch.target.name.clone());
            ending.attempts(1, Some(&dispatch.target), None, request.model.as_deref());
        }
        self.dispatch = Some(dispatch);
        if self.duplex.0 {
            vec![
                wire::headers_with_destination(&address),
                wire::streamed_body(body.to_vec(), true, true),
            ]
        } else {
            vec![wire::body_with_destination(&address)]
        }
    }

    /// Endpoints the data plane's subset hint leaves out (none without a hint).
    fn outside_subset(&self) -> Vec<EndpointId> {
        let Some(subset) = &self.subset else {
            return Vec::new();
        };
        self.shared
            .pool
            .configs()
            .into_iter()
            .filter(|(_, c)| !subset.iter().any(|s| *s == address(c.base_url())))
            .map(|(id, _)| id)
            .collect()
    }

    /// Answers at once with `error`; the request ends with `outcome` (`None`: already set).
    fn refuse(
        &mut self,
        error: &ApiError,
        why: &'static str,
        outcome: Option<Outcome>,
    ) -> ProcessingResponse {
        self.count(why);
        if let Some(mut ending) = self.ending.take() {
            if let Some(outcome) = outcome {
                ending.set(outcome);
            }
            ending.facts().status = Some(error.status.as_u16());
        }
        wire::immediate(error)
    }

    fn count(&self, result: &'static str) {
        self.shared
            .metrics
            .requests
            .epp_picks
            .get_or_create(&crate::metrics::reason(result))
            .inc();
    }

    fn complete(&mut self) {
        if let Some(d) = self.dispatch.take() {
            let usage = self.usage.usage();
            let tokens = usage.map_or_else(|| self.events.finish(), |u| u.output_tokens);
            d.complete(if self.ok { tokens } else { 0 }, usage.filter(|_| self.ok));
            if let Some(mut ending) = self.ending.take() {
                ending.answered(self.ok, usage, tokens);
            }
        }
    }
}

fn header_text(h: &envoy_types::pb::envoy::config::core::v3::HeaderValue) -> &str {
    if h.raw_value.is_empty() {
        &h.value
    } else {
        std::str::from_utf8(&h.raw_value).unwrap_or_default()
    }
}

/// `host:port` of a base URL (the port its scheme implies when absent): what the protocol
/// calls the endpoint. InferencePool endpoints are pod IPs, so configured URLs should be too.
pub(crate) fn address(base: &str) -> String {
    let Ok(uri) = base.parse::<axum::http::Uri>() else {
        return base.to_owned();
    };
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    match uri.host() {
        Some(host) => format!("{host}:{port}"),
        None => base.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::address;

    #[test]
    fn an_endpoint_is_its_host_and_port() {
        assert_eq!(address("http://10.0.0.5:8000"), "10.0.0.5:8000");
        assert_eq!(address("https://10.0.0.5"), "10.0.0.5:443");
        assert_eq!(address("http://[fd00::1]:8000"), "[fd00::1]:8000");
    }
}
