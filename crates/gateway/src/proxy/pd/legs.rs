//! The legs on the wire. vLLM (its `toy_proxy_server`): the prefill leg first, its answer's
//! `kv_transfer_params` then carried by the decode leg. SGLang (`sgl-model-gateway`'s PD
//! router): both legs at once with the same bootstrap room; the client gets the decode's
//! answer.

use super::{prefill_refusals, Launch, Legs};
use crate::disagg::{body, Protocol, ProtocolLabel};
use crate::dispatch::{AttemptFuture, AttemptOutcome, Dispatch};
use crate::pool::Attempt;
use crate::state::Shared;
use crate::upstream::Sending;
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use kvgate_core::decision::FailureKind;
use kvgate_core::Request;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a prefill leg produced no KV for its decode leg.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LegError {
    /// A 4xx: the request itself is refused; the decode endpoint answers it as it will.
    Rejected,
    /// Anything else: the decode endpoint prefills instead.
    Failed,
}

/// A decode leg that prefills its own prompt; its uncached tokens wait in the ledger until
/// its first bytes.
pub(super) fn local(launch: Launch<'_>, decode: Dispatch, uncached: f64) -> AttemptFuture {
    let queued = launch
        .shared
        .disagg
        .ledger
        .enqueue(decode.target.id, uncached);
    let send = decode.send(launch.sending, launch.body, launch.forwarded);
    Box::pin(async move {
        let outcome = send.await;
        drop(queued);
        outcome
    })
}

/// Both legs, as the pool's protocol runs them.
pub(super) fn remote(
    launch: Launch<'_>,
    decode: Dispatch,
    prefill: Dispatch,
    legs: Arc<Legs>,
) -> AttemptFuture {
    let shared = launch.shared.clone();
    let mut sending = launch.sending.clone();
    let timeout = Duration::from_millis(shared.disagg.config.prefill_timeout_ms);
    let leg = Leg {
        shared: shared.clone(),
        request: launch.request.clone(),
        members: launch.members,
        sending: launch.sending.clone(),
        forwarded: launch.forwarded,
        legs,
    };
    sending.first_token_timeout = Some(timeout);
    match shared.disagg.config.protocol {
        Protocol::Vllm => Box::pin(leg.vllm(decode, prefill, sending, launch.body)),
        Protocol::Sglang => Box::pin(leg.sglang(decode, prefill, sending, launch.body)),
    }
}

/// What both legs share.
struct Leg {
    shared: Arc<Shared>,
    request: Arc<Request>,
    members: Vec<crate::pool::RoleMember>,
    /// The client's sending settings (the decode leg's).
    sending: Sending,
    forwarded: Arc<HeaderMap>,
    legs: Arc<Legs>,
}

impl Leg {
    fn timed(&self, started: Instant) {
        let secs = started.elapsed().as_secs_f64();
        let _ = self.legs.prefill_secs.set(secs);
        let protocol = self.shared.disagg.config.protocol.label();
        self.shared
            .disagg
            .metrics
            .prefill_leg
            .get_or_create(&ProtocolLabel { protocol })
            .observe(secs);
    }

    async fn vllm(
        self,
        mut decode: Dispatch,
        prefill: Dispatch,
        prefill_sending: Sending,
        client_body: Bytes,
    ) -> AttemptOutcome {
        let started = Instant::now();
        let params = match body::vllm_prefill(&client_body) {
            Some(leg_body) => self.vllm_prefill(prefill, &prefill_sending, leg_body).await,
            None => Err(LegError::Failed),
        };
        self.timed(started);
        let rejected = params == Err(LegError::Rejected);
        let decode_body = params.ok().and_then(|p| body::vllm_decode(&client_body, p));
        let outcome = match (&decode_body, rejected) {
            (Some(_), _) => "remote",
            (None, true) => "rejected",
            (None, false) => "fallback",
        };
        self.legs.settle(&self.shared, outcome);
        decode.restart_clock();
        let body = decode_body.unwrap_or(client_body);
        decode.send(&self.sending, body, self.forwarded).await
    }

    /// The prefill leg on `first`, and once more on another prefill endpoint if it failed:
    /// the answer's `kv_transfer_params`.
    async fn vllm_prefill(
        &self,
        first: Dispatch,
        sending: &Sending,
        leg_body: Bytes,
    ) -> Result<serde_json::Value, LegError> {
        let tried = first.target.id;
        let answer = match self.prefill_once(first, sending, leg_body.clone()).await {
            Err(LegError::Failed) => {
                let refused = prefill_refusals(&self.members, tried);
                let again =
                    Dispatch::pick(&self.shared, &self.request, &refused, Attempt::First, false)
                        .map_err(|_| LegError::Failed)?;
                self.prefill_once(again, sending, leg_body).await
            }
            other => other,
        }?;
        body::answer_params(&answer).ok_or(LegError::Failed)
    }

    /// One prefill leg read to its end: its answer.
    async fn prefill_once(
        &self,
        dispatch: Dispatch,
        sending: &Sending,
        leg_body: Bytes,
    ) -> Result<Bytes, LegError> {
        let tokens =
            (self.legs.verdict).remote_tokens(dispatch.target.id, self.request.prompt_tokens);
        let queued = self
            .shared
            .disagg
            .ledger
            .enqueue(dispatch.target.id, f64::from(tokens));
        let (dispatch, result) = dispatch
            .send(sending, leg_body, self.forwarded.clone())
            .await;
        drop(queued);
        let ready = match result {
            Ok(ready) => ready,
            Err(error) => {
                dispatch.fail(error.kind(), error.retry_after());
                return Err(LegError::Failed);
            }
        };
        if !ready.head.status.is_success() {
            // `upstream::attempt` fails 5xx and 429: this is a 4xx, passed on as it is.
            dispatch.complete(0, None);
            return Err(LegError::Rejected);
        }
        let first = ready.first.unwrap_or_default();
        let rest = match ready.rest {
            Some(rest) => Limited::new(rest, 1 << 20)
                .collect()
                .await
                .map(|b| b.to_bytes()),
            None => Ok(Bytes::new()),
        };
        let Ok(rest) = rest else {
            dispatch.fail(FailureKind::Connect, None);
            return Err(LegError::Failed);
        };
        let answer = [first, rest].concat();
        dispatch.complete(1, crate::usage::parse(&answer));
        Ok(Bytes::from(answer))
    }

    async fn sglang(
        self,
        mut decode: Dispatch,
        prefill: Dispatch,
        prefill_sending: Sending,
        client_body: Bytes,
    ) -> AttemptOutcome {
        let member = self.members.iter().find(|m| m.id == prefill.target.id);
        let port = member.and_then(|m| m.bootstrap_port);
        let host = body::host_of(&prefill.target.base).unwrap_or_default();
        let seed = self.shared.seed ^ self.request.id.rotate_left(17);
        // SGLang's rooms are random in [0, 2^63 - 1].
        let room = rand_chacha::ChaCha8Rng::seed_from_u64(seed).random::<u64>() >> 1;
        let Some(leg_body) = body::sglang(&client_body, &host, port, room) else {
            self.legs.settle(&self.shared, "fallback");
            drop(prefill);
            return decode
                .send(&self.sending, client_body, self.forwarded)
                .await;
        };
        let stream = decode.stream();
        let started = Instant::now();
        decode.restart_clock();
        let mut decode_leg = decode.send(&self.sending, leg_body.clone(), self.forwarded.clone());
        let mut prefill_leg = Box::pin(self.prefill_once(prefill, &prefill_sending, leg_body));
        let failed = tokio::select! {
            biased;
            answered = &mut decode_leg => {
                // A decode engine answers once its room's KV arrived, so the prefill's own
                // answer is on its way; without it the decode engine prefilled alone.
                let prefilled = prefill_leg.await;
                self.timed(started);
                let outcome = match prefilled {
                    Ok(_) => "remote",
                    Err(LegError::Rejected) => "rejected",
                    Err(LegError::Failed) => "fallback",
                };
                self.legs.settle(&self.shared, outcome);
                return answered;
            }
            prefilled = &mut prefill_leg => prefilled.err(),
        };
        self.timed(started);
        let Some(error) = failed else {
            self.legs.settle(&self.shared, "remote");
            return decode_leg.await;
        };
        let outcome = if error == LegError::Rejected {
            "rejected"
        } else {
            "fallback"
        };
        self.legs.settle(&self.shared, outcome);
        // The decode leg waits for a room no prefill will fill: withdrawn, and sent again
        // without bootstrap fields to prefill locally (left waiting when nothing can take it).
        let refused = super::decode_refusals(&self.members, &[]);
        match Dispatch::pick(
            &self.shared,
            &self.request,
            &refused,
            Attempt::Retry,
            stream,
        ) {
            Ok(fresh) => {
                drop(decode_leg);
                drop(prefill_leg);
                fresh
                    .send(&self.sending, client_body, self.forwarded.clone())
                    .await
            }
            Err(_) => decode_leg.await,
        }
    }
}
