//! Sending a staged continuation's heads (`crate::resume::heads`): each placed as a
//! continuation is, one after another on one endpoint, so a request arriving there waits behind
//! one head's prefill, not the whole prompt's. The sim measured it (`kvgate sim --scenario
//! replica-loss --set resume_stage_tokens=512`, 10 seeds, docs/routing.md, Limits): the median
//! ratio of the TTFT P95 after a lost replica to before 1.65x -> 1.42x, the continued streams'
//! median wait 1.5 -> 2.1 s.

use crate::dispatch::Dispatch;
use crate::resume::{heads, Heads, Place};
use crate::state::Shared;
use crate::upstream::Sending;
use crate::usage::UsageTail;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use kvgate_core::decision::FailureKind;
use kvgate_core::EndpointId;
use prometheus_client::metrics::counter::Counter;
use std::future::Future;

/// What [`warm`] counts: heads that ended with their prefix computed, heads skipped where
/// nobody waited, and heads skipped as already held.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadCounts<'a> {
    pub warmed: &'a Counter,
    pub skipped: &'a Counter,
    pub held: &'a Counter,
}

/// Stages the warm-up or continuation `body` as `resume.stage_tokens` and `stage_grow` say:
/// cuts its heads and [`warm`]s them. Returns the endpoint they warmed, or `None` when staging
/// is off, the body has no head, or a head found no place or failed.
pub(crate) async fn staged<P, F>(
    shared: &Shared,
    body: &[u8],
    sending: &Sending,
    counts: HeadCounts<'_>,
    place: P,
) -> Option<EndpointId>
where
    P: FnMut(Option<EndpointId>) -> F,
    F: Future<Output = Result<(Dispatch, Option<Place>, Option<usize>), &'static str>>,
{
    let config = &shared.config.resume;
    if config.stage_tokens == 0 {
        return None;
    }
    // Cut at the gateway's own estimate of bytes per token.
    let piece = config.stage_tokens as usize * kvgate_core::request::BYTES_PER_TOKEN;
    let heads = heads(body, sending.api, piece);
    if heads.is_empty() {
        return None;
    }
    let grow = config.stage_grow;
    let quiet = |e| grow && shared.pool.awaiting_first_token_at(e) <= 1;
    warm(heads, sending, counts, place, quiet).await
}

/// Sends `heads` one after another, each placed as a continuation is (`place`: the gates,
/// the yield) and each on the endpoint of the head before, and waits for each to end.
/// Returns the endpoint the heads warmed, or `None` when one found no place or failed: the
/// continuation then goes wherever it is routed.
///
/// A head placed where no other request awaits its first token (`quiet`: the gateway's count
/// there, the head included, is at most one) gives way to the next, so the prompt grows by two
/// pieces there: no request is queued there for a small piece to spare, and every head costs
/// the continuation about two of the engine's iterations (its own, and the one that starts
/// before the next head arrives).
/// The last head is always sent, so the continuation still computes one piece. The sim
/// measured it (`kvgate sim --scenario replica-loss --set resume_stage_tokens=256 [--set
/// resume_stage_grow=false]`, 10 seeds, docs/routing.md, Limits): the continued streams' median
/// wait 2.7 -> 2.2 s, the longest 12.0 -> 9.2 s, the TTFT P95 after a loss unchanged.
///
/// A head the endpoint is predicted to hold already (another session's copy of the system
/// prompt, a shared document: `place`'s third value, the bytes of the continuation's prefix
/// key the index said the first endpoint held) gives way to the next too: sent, it would cost
/// the continuation a round trip and an iteration and warm nothing. That prediction is taken
/// at the first head's placement only; later placements see the heads' own dispatches.
pub(crate) async fn warm<P, F, Q>(
    mut heads: Heads,
    sending: &Sending,
    counts: HeadCounts<'_>,
    mut place: P,
    quiet: Q,
) -> Option<EndpointId>
where
    P: FnMut(Option<EndpointId>) -> F,
    F: Future<Output = Result<(Dispatch, Option<Place>, Option<usize>), &'static str>>,
    Q: Fn(EndpointId) -> bool,
{
    let mut warmed = None;
    let mut held = None;
    while let Some(mut cut) = heads.next_cut() {
        let (dispatch, place, predicted) = place(warmed).await.ok()?;
        if warmed.is_none() {
            held = predicted;
        }
        let endpoint = dispatch.target.id;
        if warmed.is_some() && quiet(endpoint) {
            if let Some(next) = heads.next_cut() {
                cut = next;
                counts.skipped.inc();
            }
        }
        let mut head = heads.head(cut)?;
        while heads.held(&head, held) {
            let Some(next) = heads.next_cut() else {
                break;
            };
            head = heads.head(next)?;
            counts.held.inc();
        }
        let body = head.body()?;
        let ended = send_one(sending, dispatch, body).await;
        if ended {
            counts.warmed.inc();
        }
        drop(place);
        if !ended {
            return None;
        }
        warmed = Some(endpoint);
    }
    warmed
}

/// Sends the one-token warm-up `body` on `dispatch` and reads its answer to the end; whether
/// it ended with its prompt computed (a success status and the whole body read). The dispatch
/// learns how it ended, as any request's does.
pub(crate) async fn send_one(sending: &Sending, dispatch: Dispatch, body: Bytes) -> bool {
    let forwarded = sending.forwarded.clone();
    let (dispatch, result) = dispatch.send(sending, body, forwarded).await;
    match result {
        Ok(ready) if ready.head.status.is_success() => {
            let mut tail = UsageTail::default();
            tail.feed(ready.first.as_deref().unwrap_or_default());
            let rest = match ready.rest {
                Some(rest) => Limited::new(rest, 1 << 20)
                    .collect()
                    .await
                    .map(|b| b.to_bytes()),
                None => Ok(Bytes::new()),
            };
            match rest {
                Ok(rest) => {
                    tail.feed(&rest);
                    dispatch.complete(1, tail.usage());
                    true
                }
                Err(_) => {
                    dispatch.fail(FailureKind::Connect, None);
                    false
                }
            }
        }
        Ok(_) => {
            // Answered, not failed (as `proxy` counts it), but nothing was warmed.
            dispatch.complete(0, None);
            false
        }
        Err(error) => {
            dispatch.fail(error.kind(), error.retry_after());
            false
        }
    }
}
