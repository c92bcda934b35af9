//! The ext_proc messages an endpoint picker reads and writes (Envoy's `envoy.service.ext_proc.v3`,
//! as the Gateway API Inference Extension's endpoint-picker protocol uses them).

use crate::error::ApiError;
use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, common_response::ResponseStatus, processing_response::Response, BodyMutation,
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The header and metadata key naming the picked endpoint (`ip:port`).
pub(crate) const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of [`DESTINATION`].
pub(crate) const LB_NAMESPACE: &str = "envoy.lb";
/// The request metadata namespace and key restricting the pick to a subset.
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub(crate) const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// A continue with nothing changed.
fn proceed() -> CommonResponse {
    CommonResponse {
        status: ResponseStatus::Continue as i32,
        ..CommonResponse::default()
    }
}

/// The picked endpoint as a header set on the request (routing recomputed) and as
/// `envoy.lb` dynamic metadata; the protocol wants both, with the same value.
fn destination(endpoint: &str) -> (CommonResponse, Struct) {
    let header = HeaderValueOption {
        header: Some(HeaderValue {
            key: DESTINATION.into(),
            raw_value: endpoint.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    };
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: vec![header],
            ..HeaderMutation::default()
        }),
        clear_route_cache: true,
        ..proceed()
    };
    let inner = Struct {
        fields: [(DESTINATION.to_string(), string(endpoint))].into(),
    };
    let metadata = Struct {
        fields: [(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    };
    (common, metadata)
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// Request headers let through unchanged.
pub(crate) fn headers_continue() -> ProcessingResponse {
    response(Response::RequestHeaders(HeadersResponse {
        response: Some(proceed()),
    }))
}

/// Response headers let through unchanged.
pub(crate) fn response_headers_continue() -> ProcessingResponse {
    response(Response::ResponseHeaders(HeadersResponse {
        response: Some(proceed()),
    }))
}

/// The pick, on the request-headers response (full-duplex streaming: the headers were held
/// until the body was read).
pub(crate) fn headers_with_destination(endpoint: &str) -> ProcessingResponse {
    let (common, metadata) = destination(endpoint);
    ProcessingResponse {
        dynamic_metadata: Some(metadata),
        ..response(Response::RequestHeaders(HeadersResponse {
            response: Some(common),
        }))
    }
}

/// The pick, on the request-body response (buffered body: the headers can still change).
pub(crate) fn body_with_destination(endpoint: &str) -> ProcessingResponse {
    let (common, metadata) = destination(endpoint);
    ProcessingResponse {
        dynamic_metadata: Some(metadata),
        ..response(Response::RequestBody(BodyResponse {
            response: Some(common),
        }))
    }
}

/// A body chunk passed back as it came (full-duplex streaming: the processor returns the
/// body it lets through); `request` says which direction.
pub(crate) fn streamed_body(
    body: Vec<u8>,
    end_of_stream: bool,
    request: bool,
) -> ProcessingResponse {
    let common = CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(
                StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..StreamedBodyResponse::default()
                },
            )),
        }),
        ..proceed()
    };
    let body = BodyResponse {
        response: Some(common),
    };
    response(if request {
        Response::RequestBody(body)
    } else {
        Response::ResponseBody(body)
    })
}

/// A response-body chunk let through unchanged (buffered or no body mode).
pub(crate) fn response_body_continue() -> ProcessingResponse {
    response(Response::ResponseBody(BodyResponse {
        response: Some(proceed()),
    }))
}

/// The request answered by the proxy itself: `error` as an OpenAI-style JSON body with its
/// status (400 for a bad body, 503 when no endpoint can take it).
pub(crate) fn immediate(error: &ApiError) -> ProcessingResponse {
    let content_type = HeaderValueOption {
        header: Some(HeaderValue {
            key: "content-type".into(),
            raw_value: b"application/json".to_vec(),
            ..HeaderValue::default()
        }),
        ..HeaderValueOption::default()
    };
    response(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(error.status.as_u16()),
        }),
        headers: Some(HeaderMutation {
            set_headers: vec![content_type],
            ..HeaderMutation::default()
        }),
        body: error.body().into_bytes(),
        details: "kvgate_epp".into(),
        ..ImmediateResponse::default()
    }))
}

fn response(r: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(r),
        ..ProcessingResponse::default()
    }
}

/// The `ip:port` endpoints the data plane restricts the pick to, if it does.
pub(crate) fn subset(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let list = match &hint.fields.get(SUBSET_KEY)?.kind {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => s.split(',').map(|e| e.trim().to_owned()).collect(),
        _ => Vec::new(),
    };
    Some(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    #[test]
    fn the_pick_is_the_same_in_the_header_and_the_metadata() {
        let r = headers_with_destination("10.0.0.7:8000");
        let Some(Response::RequestHeaders(h)) = &r.response else {
            panic!("{r:?}")
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let set = &common.header_mutation.as_ref().unwrap().set_headers[0];
        let header = set.header.as_ref().unwrap();
        assert_eq!(
            (header.key.as_str(), &header.raw_value[..]),
            (DESTINATION, &b"10.0.0.7:8000"[..])
        );
        let lb = &r.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(inner)) = &lb.kind else {
            panic!()
        };
        assert_eq!(inner.fields[DESTINATION], string("10.0.0.7:8000"));
    }

    #[test]
    fn the_subset_hint_is_read_as_a_list_or_a_comma_separated_string() {
        let hint = |value: Value| Metadata {
            filter_metadata: [(
                SUBSET_NAMESPACE.to_string(),
                Struct {
                    fields: [(SUBSET_KEY.to_string(), value)].into(),
                },
            )]
            .into(),
            ..Metadata::default()
        };
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string("a:1"), string("b:2")],
            })),
        };
        assert_eq!(
            subset(Some(&hint(list))),
            Some(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(
            subset(Some(&hint(string("a:1, b:2")))),
            Some(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(subset(None), None);
        assert_eq!(subset(Some(&Metadata::default())), None);
    }
}
