//! One HTTP request as an endpoint picker sees it over one ext_proc stream: its headers and
//! body come in, the pick goes out (or an immediate answer: 400 for a body the gateway would
//! refuse, 503 when no endpoint can take it), then the response passes through and tells the
//! pool what a proxied request would have told it (first token, usage, end). A stream that
//! ends before the response did leaves a cancelled dispatch, as a client that went away does.

use super::wire;
use crate::dispatch::Dispatch;
use crate::error::ApiError;
use crate::parse::Api;
use crate::pool::Attempt;
use crate::relay::SseEvents;
use crate::state::Shared;
use crate::usage::UsageTail;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::BytesMut;
use envoy_types::pb::envoy::config::core::v3::HeaderMap as EnvoyHeaders;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, ProcessingRequest, ProcessingResponse,
};
use kvgate_core::EndpointId;
use std::sync::atomic::Ordering;
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
            Some(Request::RequestHeaders(h)) => {
                self.read_headers(h.headers.as_ref());
                if h.end_of_stream {
                    let error =
                        ApiError::invalid("invalid_body", "an inference request needs a body");
                    return vec![self.refuse(&error, "bad_request")];
                }
                // Buffered: the body comes once the headers are answered, and the pick rides on
                // the body's answer. Full duplex: the headers wait for the pick.
                if self.duplex.0 {
                    Vec::new()
                } else {
                    vec![wire::headers_continue()]
                }
            }
            Some(Request::RequestBody(b)) => {
                self.body.extend_from_slice(&b.body);
                let limit = self.shared.config.requests.max_body_bytes;
                if self.body.len() > limit {
                    return vec![self.refuse(&ApiError::too_large(limit), "bad_request")];
                }
                if !b.end_of_stream {
                    return Vec::new();
                }
                self.pick()
            }
            Some(Request::ResponseHeaders(h)) => {
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
                if h.end_of_stream {
                    self.complete();
                }
                vec![wire::response_headers_continue()]
            }
            Some(Request::ResponseBody(b)) => {
                if !b.body.is_empty() {
                    if let Some(d) = self.dispatch.as_mut().filter(|_| self.ok) {
                        // Each later piece of a stream is an engine iteration, as in a relayed
                        // stream: it ticks the endpoint's iteration clock.
                        if self.first {
                            d.tokens();
                        } else {
                            self.first = true;
                            d.first_token();
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
            Some(Request::RequestTrailers(_)) | Some(Request::ResponseTrailers(_)) | None => {
                Vec::new()
            }
        }
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

    /// The body is complete: parse it as the gateway would, pick, and answer with the pick.
    fn pick(&mut self) -> Vec<ProcessingResponse> {
        let path = self.path.split('?').next().unwrap_or_default();
        let api = if path.ends_with("/chat/completions") {
            Api::Chat
        } else if path.ends_with("/completions") {
            Api::Completions
        } else {
            let error = ApiError::invalid(
                "invalid_path",
                format!("{path:?} is not /v1/chat/completions or /v1/completions"),
            );
            return vec![self.refuse(&error, "bad_request")];
        };
        let body = std::mem::take(&mut self.body).freeze();
        let inference =
            match crate::proxy::intake::parse(&self.shared, api, &self.headers, body.clone()) {
                Ok(i) => i,
                Err(e) => return vec![self.refuse(&e, "bad_request")],
            };
        let mut request = inference.request;
        request.id = self.shared.next_request.fetch_add(1, Ordering::Relaxed);
        let outside = self.outside_subset();
        let picked = match self.shared.pool.pick(&request, &outside, Attempt::First) {
            Ok(t) => t,
            Err(r) => return vec![self.refuse(&ApiError::no_endpoint(r), "no_endpoint")],
        };
        let address = address(&picked.base);
        self.count("picked");
        self.dispatch = Some(Dispatch::new(
            self.shared.clone(),
            request.id,
            picked,
            inference.stream,
        ));
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

    fn refuse(&self, error: &ApiError, why: &'static str) -> ProcessingResponse {
        self.count(why);
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
