//! One continuation prefilling at a time per endpoint.
//!
//! A continuation recomputes its prompt and the text streamed so far, a full prefill, and an
//! engine admits waiting prompts first come first served. When a replica dies, every stream it
//! was decoding breaks at once; sent together, their continuations queue on the survivors
//! ahead of every request that arrives after them. Through the gateway on four emulated
//! engines (`scripts/routing-bench.sh replica-loss`) that stalled all first tokens for ~2.6 s
//! after the kill, and the TTFT P95 of the next 30 s rose ~10x. Held at the gateway until the
//! previous continuation's first bytes, each waits on the engine behind at most one other, and
//! a request arriving in between waits for one continuation's prefill, not all of them. The
//! continuations themselves lose little: the engine would have prefilled them one after the
//! other anyway.

use kvgate_core::EndpointId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Per-endpoint limits on continuations sent and not yet answered.
#[derive(Debug)]
pub(crate) struct Gates {
    per_endpoint: u32,
    gates: Mutex<HashMap<EndpointId, Arc<Semaphore>>>,
}

impl Gates {
    /// `per_endpoint` continuations at once on each endpoint; 0 for no limit.
    pub(crate) fn new(per_endpoint: u32) -> Self {
        Gates {
            per_endpoint,
            gates: Mutex::default(),
        }
    }

    /// Waits for a place on `endpoint`, held until the permit is dropped; `None` at once when
    /// there is no limit.
    pub(crate) async fn enter(&self, endpoint: EndpointId) -> Option<OwnedSemaphorePermit> {
        if self.per_endpoint == 0 {
            return None;
        }
        let gate = {
            let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
            // Only gates someone waits at or holds a place in are kept (a permit holds its
            // semaphore), so endpoints that come and go leave nothing behind.
            gates.retain(|_, gate| Arc::strong_count(gate) > 1);
            gates
                .entry(endpoint)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_endpoint as usize)))
                .clone()
        };
        // The semaphore is never closed.
        gate.acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::timeout;

    // Paused time: a timeout fires only once every task is blocked, so "still waiting" is
    // decided by the gate, not by how fast the machine runs the spawned task.
    #[tokio::test(start_paused = true)]
    async fn a_second_continuation_to_an_endpoint_waits_for_the_first_and_others_do_not() {
        let gates = Arc::new(Gates::new(1));
        let first = gates.enter(EndpointId(0)).await;
        assert!(first.is_some());
        let mut waiting = {
            let gates = gates.clone();
            tokio::spawn(async move { gates.enter(EndpointId(0)).await.is_some() })
        };
        let elsewhere = timeout(Duration::from_secs(1), gates.enter(EndpointId(1))).await;
        assert!(elsewhere.expect("another endpoint is free").is_some());
        let early = timeout(Duration::from_secs(1), &mut waiting).await;
        assert!(early.is_err(), "entered while the first was inside");
        drop(first);
        let entered = timeout(Duration::from_secs(1), waiting).await;
        assert!(entered.expect("entered once the first left").unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn gates_nobody_is_at_are_forgotten() {
        let gates = Gates::new(1);
        let held = gates.enter(EndpointId(0)).await;
        for id in 1..100 {
            drop(gates.enter(EndpointId(id)).await);
        }
        let mut kept: Vec<u32> = gates.gates.lock().unwrap().keys().map(|e| e.0).collect();
        kept.sort_unstable();
        assert_eq!(kept, [0, 99]);
        drop(held);
        drop(gates.enter(EndpointId(5)).await);
        assert_eq!(gates.gates.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_lets_every_continuation_through() {
        let gates = Gates::new(0);
        for _ in 0..3 {
            let entered = timeout(Duration::from_secs(1), gates.enter(EndpointId(0))).await;
            assert_eq!(entered.map(|p| p.is_some()), Ok(false));
        }
    }
}
