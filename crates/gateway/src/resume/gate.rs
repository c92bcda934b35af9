//! Continuations placed one at a time per endpoint, each routed when it leaves.
//!
//! A continuation recomputes its prompt and the text streamed so far, a full prefill, and an
//! engine admits waiting prompts first come first served. When a replica dies, every stream it
//! was decoding breaks at once; sent together, their continuations queue on the survivors
//! ahead of every request that arrives after them. Through the gateway on four emulated
//! engines (`scripts/routing-bench.sh replica-loss`) that stalled all first tokens for ~2.6 s
//! after the kill, and the TTFT P95 of the next 30 s rose ~10x. So at most `per_endpoint`
//! continuations await their first bytes on an endpoint; a request arriving meanwhile waits on
//! the engine behind at most that many.
//!
//! The others wait at the gateway unrouted, and each is routed when it leaves, among the
//! endpoints with room: the policy places it on the fleet as it is then, and counts it in
//! flight only from then on. Routed when its stream broke and held for its endpoint, it sat
//! in the policy's queue model ahead of new requests that in fact went before it; in the sim
//! (`kvgate sim --scenario replica-loss`, 10 seeds) that cost `predicted_ttft` 3% of its
//! capacity, and one endpoint's queue of continuations (cache-affine policies send them all to
//! the same place) waited while another endpoint had room.

use kvgate_core::dispatch::ContinuationGate;
use kvgate_core::EndpointId;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a yielding continuation looks again for an endpoint with no request awaiting its
/// first token: well under a typical time to first token, and a pick is microseconds.
pub(crate) const YIELD_POLL: Duration = Duration::from_millis(20);

/// Continuations sent to each endpoint and not yet answered, with a limit per endpoint: the
/// dispatch core's `ContinuationGate` (the simulator counts them the same way), and the waiting.
#[derive(Debug)]
pub(crate) struct Gates {
    per_endpoint: u32,
    open: Mutex<ContinuationGate>,
    /// Signalled whenever a place frees.
    freed: Notify,
}

/// A continuation's place on its endpoint, given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    gates: Arc<Gates>,
    endpoint: EndpointId,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.gates.lock().leave(self.endpoint);
        self.gates.freed.notify_waiters();
    }
}

impl Gates {
    /// `per_endpoint` continuations at once on each endpoint; 0 for no limit.
    pub(crate) fn new(per_endpoint: u32) -> Self {
        Gates {
            per_endpoint,
            open: Mutex::new(ContinuationGate::new(per_endpoint)),
            freed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ContinuationGate> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Places a continuation: `pick` chooses among the endpoints not in the list it is given
    /// (those without room) and returns its choice and the endpoint chosen. Until
    /// `yield_until`, `pick` is told the continuation yields (its second argument), so it also
    /// passes over endpoints where a new request awaits its first token; nothing signals those
    /// first tokens here, so a yielding continuation asks again every [`YIELD_POLL`]. When
    /// `pick` finds nothing while some endpoint is full or the continuation yields, this waits
    /// and asks again; otherwise `pick`'s error is the answer. The place is held until
    /// dropped; `None` with no limit. Waiters are not served in any set order.
    pub(crate) async fn place<T, E>(
        self: &Arc<Self>,
        yield_until: Option<Instant>,
        mut pick: impl FnMut(&ContinuationGate, bool) -> Result<(T, EndpointId), E>,
    ) -> Result<(T, Option<Place>), E> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a place freed after the look still wakes us.
            freed.as_mut().enable();
            let until = yield_until.filter(|&u| Instant::now() < u);
            {
                let mut open = self.lock();
                match pick(&open, until.is_some()) {
                    Ok((chosen, _)) if self.per_endpoint == 0 => return Ok((chosen, None)),
                    Ok((chosen, endpoint)) => {
                        open.enter(endpoint);
                        let place = Place {
                            gates: self.clone(),
                            endpoint,
                        };
                        return Ok((chosen, Some(place)));
                    }
                    Err(e) if open.full().is_empty() && until.is_none() => return Err(e),
                    Err(_) => {}
                }
            }
            match until {
                Some(until) => {
                    let poll = tokio::time::sleep_until(until.min(Instant::now() + YIELD_POLL));
                    tokio::select! {
                        () = freed => {}
                        () = poll => {}
                    }
                }
                None => freed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::time::timeout;

    /// Picks the lowest-numbered endpoint of `0..n` not in `full` or `tried`.
    fn lowest(
        n: u32,
        tried: &'static [u32],
    ) -> impl FnMut(&ContinuationGate, bool) -> Result<(u32, EndpointId), &'static str> {
        move |gate, _| {
            (0..n)
                .find(|e| !tried.contains(e) && gate.has_room(EndpointId(*e)))
                .map(|e| (e, EndpointId(e)))
                .ok_or("no_endpoint")
        }
    }

    // Paused time: a timeout fires only once every task is blocked, so "still waiting" is
    // decided by the gate, not by how fast the machine runs the spawned task.
    #[tokio::test(start_paused = true)]
    async fn a_continuation_goes_where_there_is_room_and_waits_when_there_is_none() {
        let gates = Arc::new(Gates::new(1));
        let (first, p0) = gates.place(None, lowest(2, &[])).await.unwrap();
        let (second, p1) = gates.place(None, lowest(2, &[])).await.unwrap();
        assert_eq!(
            (first, second),
            (0, 1),
            "the second goes where there is room"
        );
        let mut waiting = {
            let gates = gates.clone();
            tokio::spawn(async move { gates.place(None, lowest(2, &[])).await.map(|(e, _)| e) })
        };
        let early = timeout(Duration::from_secs(1), &mut waiting).await;
        assert!(early.is_err(), "placed while both endpoints were full");
        drop(p1);
        let placed = timeout(Duration::from_secs(1), waiting).await;
        assert_eq!(placed.expect("placed once a place freed").unwrap(), Ok(1));
        drop(p0);
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_full_the_picks_refusal_is_the_answer() {
        let gates = Arc::new(Gates::new(1));
        let refused = gates.place(None, lowest(2, &[0, 1])).await;
        assert_eq!(refused.map(|(e, _)| e), Err("no_endpoint"));
        // Endpoint 1 is full, and 0 was tried: wait for 1, not refuse.
        let (_, held) = gates.place(None, lowest(2, &[0])).await.unwrap();
        let waiting = timeout(Duration::from_secs(1), gates.place(None, lowest(2, &[0]))).await;
        assert!(
            waiting.is_err(),
            "refused or placed while the only endpoint was full"
        );
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn places_given_back_are_forgotten() {
        let gates = Arc::new(Gates::new(1));
        let (_, held) = gates.place(None, lowest(1, &[])).await.unwrap();
        for id in 1..100 {
            let only = move |_: &ContinuationGate, _| Ok::<_, ()>(((), EndpointId(id)));
            drop(gates.place(None, only).await.unwrap());
        }
        assert_eq!(gates.lock().full(), [EndpointId(0)]);
        drop(held);
        assert!(gates.lock().full().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_lets_every_continuation_through() {
        let gates = Arc::new(Gates::new(0));
        for _ in 0..3 {
            let placed = timeout(Duration::from_secs(1), gates.place(None, lowest(1, &[]))).await;
            let (e, place) = placed.expect("no wait").unwrap();
            assert_eq!(e, 0);
            assert!(place.is_none());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_yielding_continuation_waits_for_a_lull_or_the_end_of_its_yield() {
        let gates = Arc::new(Gates::new(0));
        // One endpoint, where a new request awaits its first token while `busy` holds.
        let busy = Arc::new(AtomicBool::new(true));
        let pick = |busy: Arc<AtomicBool>| {
            move |_: &ContinuationGate, yielding: bool| {
                if yielding && busy.load(Ordering::SeqCst) {
                    Err("no_endpoint")
                } else {
                    Ok((0, EndpointId(0)))
                }
            }
        };
        let until = Instant::now() + Duration::from_secs(1);
        let mut waiting = {
            let (gates, busy) = (gates.clone(), busy.clone());
            tokio::spawn(async move { gates.place(Some(until), pick(busy)).await.map(|_| ()) })
        };
        let early = timeout(Duration::from_millis(300), &mut waiting).await;
        assert!(
            early.is_err(),
            "placed ahead of a request awaiting its first token"
        );
        busy.store(false, Ordering::SeqCst);
        let placed = timeout(YIELD_POLL * 2, waiting).await;
        assert_eq!(placed.expect("placed at the lull").unwrap(), Ok(()));

        // Busy throughout: placed when the yield ends, not before.
        busy.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let until = started + Duration::from_secs(1);
        let placed = gates.place(Some(until), pick(busy.clone())).await;
        assert!(placed.is_ok());
        assert!(Instant::now() >= until && Instant::now() < until + YIELD_POLL);
        // Past its yield a continuation is placed at once, and a refusal is final again.
        assert!(gates.place(Some(started), pick(busy)).await.is_ok());
        let refuse = |_: &ContinuationGate, _| Err::<((), EndpointId), _>("no_endpoint");
        assert_eq!(
            gates.place(Some(started), refuse).await.map(|_| ()),
            Err("no_endpoint")
        );
    }
}
