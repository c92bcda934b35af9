//! The LoRA gate's waits ([`kvgate_core::lora::LoraGate`]): a first attempt for an adapter
//! that the gate holds gets a [`Held`] instead of a target, parks on its own wake-up (no
//! polling: a oneshot channel per held request, keyed by request id) and picks again when the
//! dispatch core says the gate released it (a first token, an end, a report, a membership
//! change) or when its bound passes. Releases are woken in the order the gate gives, which is
//! arrival order.

use super::{Core, Pool, Target};
use crate::metrics::ReasonLabel;
use kvgate_core::dispatch::Picked;
use kvgate_core::lora::Hold;
use kvgate_core::{EndpointId, Rejection, Request};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::oneshot;

/// Each held request's wake-up.
pub(super) type Waiters = Mutex<HashMap<u64, oneshot::Sender<()>>>;

/// A pick through the LoRA gate.
#[derive(Debug)]
pub enum Placed {
    /// Where the attempt goes, recorded as dispatched.
    Go(Box<Target>),
    /// The gate holds the request: [`Pool::hold`] it, then pick again.
    Held(Held),
}

/// A request the gate holds.
#[derive(Debug)]
pub struct Held {
    request: u64,
    /// Where and behind which adapter, and until when at most.
    pub hold: Hold,
    wake: oneshot::Receiver<()>,
}

impl Pool {
    /// [`Pool::pick`] for a first attempt, through the LoRA gate: a request naming an adapter
    /// may be held while another adapter waits behind the batch its adapter runs.
    pub fn pick_gated(&self, request: &Request, tried: &[EndpointId]) -> Result<Placed, Rejection> {
        self.place(request, tried, super::Attempt::First, true)
    }

    /// Waits until the gate releases `held` or its bound passes; the caller then picks again.
    /// Dropped before (the client went away), the gate forgets the request.
    pub async fn hold(&self, held: Held) {
        struct Forget<'a>(&'a Pool, u64, bool);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    self.0.forget_held(self.1);
                }
            }
        }
        let mut forget = Forget(self, held.request, false);
        let left = held.hold.until - self.clock.now();
        let _ = tokio::time::timeout(Duration::from_nanos(left.0), held.wake).await;
        self.waiters_lock().remove(&held.request);
        forget.2 = true;
    }

    /// Requests the gate holds now.
    pub fn lora_held(&self) -> usize {
        self.lock().dispatch.held()
    }

    /// Registers the wake-up of a request the gate just held (under the pool's lock, so no
    /// release can come between the hold and the registration).
    pub(super) fn held(&self, core: &mut Core, request: u64, hold: Hold) -> Placed {
        let (tx, wake) = oneshot::channel();
        self.waiters_lock().insert(request, tx);
        self.metrics.lora_holding.set(core.dispatch.held() as i64);
        Placed::Held(Held {
            request,
            hold,
            wake,
        })
    }

    /// Wakes the requests the gate released, in its order.
    pub(super) fn wake_released(&self, core: &mut Core) {
        let released = core.dispatch.released();
        if released.is_empty() {
            return;
        }
        let mut waiters = self.waiters_lock();
        for id in released {
            if let Some(tx) = waiters.remove(&id) {
                let _ = tx.send(());
            }
        }
        self.metrics.lora_holding.set(core.dispatch.held() as i64);
    }

    /// Counts a pick that ends a hold, by why it went, with the time it was held.
    pub(super) fn count_hold(&self, picked: &Picked) {
        let Some((pass, hold)) = &picked.held else {
            return;
        };
        let label = ReasonLabel {
            reason: pass.label(),
        };
        self.metrics.lora_held.get_or_create(&label).inc();
        let held = self.clock.now() - hold.since;
        self.metrics.lora_hold.observe(held.as_secs_f64());
    }

    fn forget_held(&self, request: u64) {
        self.waiters_lock().remove(&request);
        let mut core = self.lock();
        core.dispatch.forget_held(request);
        let gone = ReasonLabel { reason: "gone" };
        self.metrics.lora_held.get_or_create(&gone).inc();
        self.metrics.lora_holding.set(core.dispatch.held() as i64);
    }

    fn waiters_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<()>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}
