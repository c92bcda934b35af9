//! Re-homing's probes and warm-ups (the record of sessions and the rules are
//! `crate::resume::Rehome`'s): signs of loss arrive on the watch's loss signal, from the
//! scrape loops and from attempts, and are handled here, where requests are sent.

use super::continuation::place;
use super::stage;
use crate::metrics;
use crate::resume::{one_token, Turn};
use crate::state::Shared;
use crate::watch::Loss;
use bytes::Bytes;
use kvgate_core::EndpointId;
use prometheus_client::metrics::counter::Counter;
use serde_json::{Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Handles signs of loss until the gateway stops: a suspected endpoint is asked at once (a
/// scrape) and re-homing starts if it does not answer; a lost one's sessions are warmed
/// elsewhere, the most recent first. A dead engine refuses the connection at once, so a crash
/// loses next to nothing of the head start (the sim: starting one second late keeps less than
/// half of the gain), and a link that dropped one stream while its engine still serves costs
/// no wave of warm-ups.
pub(crate) async fn handle_losses(shared: Arc<Shared>, mut losses: mpsc::UnboundedReceiver<Loss>) {
    let mut stop = shared.stop.subscribe();
    loop {
        let loss = tokio::select! {
            loss = losses.recv() => loss,
            _ = stop.changed() => return,
        };
        match loss {
            None => return,
            Some(Loss::Suspected(endpoint)) => {
                if shared.rehome.should_probe(endpoint) {
                    tokio::spawn(probe(shared.clone(), endpoint));
                }
            }
            Some(Loss::Lost(endpoint)) => lost(&shared, endpoint),
        }
    }
}

/// Asks a suspected endpoint; re-homes its sessions if it does not answer.
async fn probe(shared: Arc<Shared>, endpoint: EndpointId) {
    let answered = shared.watch.probe(endpoint).await;
    shared.rehome.probed(endpoint);
    let result = match answered {
        Some(true) => "answered",
        Some(false) => "lost",
        None => return,
    };
    let reason = metrics::reason(result);
    shared
        .metrics
        .resume
        .rehome_probes
        .get_or_create(&reason)
        .inc();
    if answered == Some(false) {
        lost(&shared, endpoint);
    }
}

/// Warms elsewhere the sessions whose last turn ended on `lost` within the window.
fn lost(shared: &Arc<Shared>, lost: EndpointId) {
    let until = Instant::now() + shared.rehome.window();
    for (session, turn) in shared.rehome.displaced(lost) {
        tokio::spawn(warm(shared.clone(), lost, session, turn, until));
    }
}

/// Sends `turn`'s prompt again for one token to an endpoint other than `lost` (staged when
/// continuations are), yielding until `until`, unless the session's next turn comes first.
async fn warm(shared: Arc<Shared>, lost: EndpointId, session: String, turn: Turn, until: Instant) {
    let count = |why: &'static str| {
        let reason = metrics::reason(why);
        shared
            .metrics
            .resume
            .rehome_warmups
            .get_or_create(&reason)
            .inc();
    };
    let Ok(mut fields) = serde_json::from_slice::<Map<String, Value>>(&turn.body) else {
        return count("unreadable");
    };
    one_token(&mut fields);
    let Ok(body) = serde_json::to_vec(&fields).map(Bytes::from) else {
        return count("unreadable");
    };
    let id = turn.request.id;
    let tried = [lost];
    let live = || shared.rehome.current(&session, id);
    // Placed as a continuation is; dropped (its dispatch cancelled) once the session's next
    // turn has come, which may be while it waited at the gate.
    let place = |pinned| {
        let placed = place(&shared, &turn.request, &tried, Some(until), pinned, false);
        async move {
            if !live() {
                return Err("superseded");
            }
            let placed = placed.await?;
            match live() {
                true => Ok(placed),
                false => Err("superseded"),
            }
        }
    };
    // Only the heads that warmed are exported for re-homing; the ones that gave way are not.
    let (skipped, held) = (Counter::default(), Counter::default());
    let counts = stage::HeadCounts {
        warmed: &shared.metrics.resume.rehome_heads,
        skipped: &skipped,
        held: &held,
    };
    let warmed = stage::staged(&shared, &body, &turn.sending, counts, place).await;
    let placed = match place(warmed).await {
        Err("superseded") => Err("superseded"),
        Err(_) if warmed.is_some() => place(None).await,
        placed => placed,
    };
    match placed {
        Ok((dispatch, _gate, _)) => match stage::send_one(&turn.sending, dispatch, body).await {
            true => count("sent"),
            false => count("failed"),
        },
        Err(why) => count(why),
    }
}
