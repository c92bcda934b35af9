//! Admission: at most `max_concurrency` requests upstream at once, at most `max_queue` waiting for
//! a slot, a 429 with Retry-After when the queue is full, and a 504 for a request whose deadline
//! passes while it waits (shed before the engine queue grows, and never serve a request nobody
//! waits for any more).
//!
//! Who gets a freed slot is kvgate-core's [`FairQueue`]: the waiting tenant with the least
//! weighted service (`order: fair`, the default) or plain arrival order (`order: fifo`), and
//! interactive work before batch work within the starvation bound. The queue only decides when a
//! request is sent; the routing policy still decides where, on the fleet as it is then.
//!
//! Under a backlog, `max_prefills` also bounds the requests sent whose first bytes have not come
//! back: the ones an engine is still queueing or prefilling. An engine computes an iteration's
//! prefill before anything else it holds can start, so a long prompt makes every request that lands
//! behind it wait its whole iteration; decoding requests cost an iteration little. Held to fewer
//! prefills than engines, backlogged tenants leave an engine free of long prefills, and the policy
//! sends an underserved tenant's request (which skips the bound, as it skips the slot limit) there.

use crate::error::{ApiError, ConfigError};
use crate::metrics::{latency_histogram, Gauge, Histogram, Registry, Unit};
use kvgate_core::tenancy::{FairQueue, Pushed, TenantDepth, Ticket};
use kvgate_core::{Nanos, Priority};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Who is asking, as the queue weighs them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Claim<'a> {
    /// The tenant.
    pub(crate) tenant: &'a str,
    /// Its fair-share weight.
    pub(crate) weight: f64,
    /// The weighted service of the request's prompt, charged when it is admitted.
    pub(crate) cost: f64,
    /// Its priority.
    pub(crate) priority: Priority,
}

#[derive(Debug)]
struct Gate {
    in_flight: usize,
    /// Admitted requests without their first bytes yet.
    prefilling: usize,
    queue: FairQueue<oneshot::Sender<()>>,
}

#[derive(Debug)]
struct Inner {
    gate: Mutex<Gate>,
    config: AdmissionConfig,
    metrics: AdmissionMetrics,
    epoch: Instant,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Slots beyond `max_concurrency` for underserved tenants: an eighth, at least one.
    fn headroom(&self) -> usize {
        self.config
            .fair_headroom
            .unwrap_or((self.config.max_concurrency / 8).max(1))
    }

    fn now(&self) -> Nanos {
        Nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Whether a waiting request may be sent now.
    fn open(&self, gate: &Gate) -> bool {
        gate.in_flight < self.config.max_concurrency
            && self.config.max_prefills.is_none_or(|m| gate.prefilling < m)
    }

    /// Hands freed capacity to the next waiters still listening, unless headroom admissions
    /// still hold the gate over its limits.
    fn grant(&self, gate: &mut Gate) {
        let now = self.now();
        while self.open(gate) {
            let Some((_, grant)) = gate.queue.pop(now) else {
                break;
            };
            self.metrics.queue_depth.dec();
            if grant.send(()).is_ok() {
                gate.in_flight += 1;
                gate.prefilling += 1;
            }
        }
    }

    /// A request ended (`prefilling`: before its first bytes).
    fn release(&self, gate: &mut Gate, prefilling: bool) {
        gate.in_flight -= 1;
        if prefilling {
            gate.prefilling -= 1;
        }
        self.grant(gate);
    }
}

/// The pool's admission gate.
#[derive(Debug)]
pub(crate) struct Admission {
    inner: Arc<Inner>,
}

/// A slot; the request holds it until its response body ends.
#[derive(Debug)]
pub(crate) struct Permit {
    inner: Arc<Inner>,
    /// Still counted among the prefilling.
    prefilling: bool,
}

impl Permit {
    /// The first bytes of the answer are in: the request no longer counts against
    /// `max_prefills`.
    pub(crate) fn prefilled(&mut self) {
        if std::mem::take(&mut self.prefilling) {
            let mut gate = self.inner.lock();
            gate.prefilling -= 1;
            self.inner.grant(&mut gate);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.inner.metrics.pending.dec();
        let mut gate = self.inner.lock();
        self.inner.release(&mut gate, self.prefilling);
    }
}

/// A request in the queue; dropping it (the client went away, or it timed out) takes it out,
/// and if a slot was handed to it meanwhile, passes the slot on.
struct Waiting<'a> {
    inner: &'a Arc<Inner>,
    ticket: Ticket,
    grant: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.inner.metrics.pending.dec();
        let mut gate = self.inner.lock();
        if gate.queue.remove(self.ticket).is_some() {
            self.inner.metrics.queue_depth.dec();
        } else if self.grant.try_recv().is_ok() {
            // Granted under the lock just before we took it: give the slot to the next one.
            self.inner.release(&mut gate, true);
        }
    }
}

impl Admission {
    /// A gate with `config`'s limits.
    pub(crate) fn new(config: AdmissionConfig, metrics: AdmissionMetrics) -> Self {
        let batch_max_wait = Nanos(config.batch_max_wait_ms.saturating_mul(1_000_000));
        Admission {
            inner: Arc::new(Inner {
                gate: Mutex::new(Gate {
                    in_flight: 0,
                    prefilling: 0,
                    queue: FairQueue::new(config.max_queue, batch_max_wait),
                }),
                config,
                metrics,
                epoch: Instant::now(),
            }),
        }
    }

    fn permit(&self) -> Permit {
        Permit {
            inner: self.inner.clone(),
            prefilling: true,
        }
    }

    /// The queue key: the tenant when fair, one shared key when first come first served.
    fn key<'a>(&self, claim: &Claim<'a>) -> &'a str {
        match self.inner.config.order {
            QueueOrder::Fair => claim.tenant,
            QueueOrder::Fifo => "",
        }
    }

    /// Waits for a slot, at most until `deadline` (from arrival) or the configured queue
    /// timeout, whichever comes first.
    pub(crate) async fn admit(
        &self,
        claim: Claim<'_>,
        deadline: Option<Duration>,
    ) -> Result<Permit, ApiError> {
        let inner = &self.inner;
        let key = self.key(&claim);
        let (tx, rx) = oneshot::channel();
        let (ticket, shed) = {
            let mut gate = inner.lock();
            // With nobody waiting there is no backlog to hold back: `max_prefills` applies to
            // requests leaving the queue.
            let free = gate.in_flight < inner.config.max_concurrency && gate.queue.is_empty();
            // A tenant with nothing waiting and no more service than the least-served waiting
            // one would go first anyway: it takes one of the few headroom slots instead of
            // waiting for a request to end (which, for minute-long streams, is what makes a
            // light tenant's TTFT suffer behind a heavy backlog even with fair order).
            let headroom = inner.config.order == QueueOrder::Fair
                && claim.priority == Priority::Interactive
                && !gate.queue.is_empty()
                && gate.in_flight < inner.config.max_concurrency + inner.headroom()
                && gate.queue.underserved(key);
            if free || headroom {
                gate.in_flight += 1;
                gate.prefilling += 1;
                gate.queue.admitted(key, claim.weight, claim.cost);
                inner.metrics.pending.inc();
                return Ok(self.permit());
            }
            let now = inner.now();
            match gate
                .queue
                .push(key, claim.weight, claim.priority, now, claim.cost, tx)
            {
                Pushed::Full(_) => return Err(ApiError::overloaded(inner.config.retry_after_secs)),
                Pushed::Queued(t) => (t, false),
                // The shed request's receiver sees its sender dropped and answers 429.
                Pushed::QueuedShedding(t, _shed) => (t, true),
            }
        };
        if !shed {
            inner.metrics.queue_depth.inc();
        }
        inner.metrics.pending.inc();
        let mut waiting = Waiting {
            inner,
            ticket,
            grant: rx,
            done: false,
        };
        let started = Instant::now();
        // A client's deadline can shorten the operator's queue timeout, never lengthen it.
        let queue_timeout = Duration::from_millis(inner.config.queue_timeout_ms);
        let wait = deadline.map_or(queue_timeout, |d| d.min(queue_timeout));
        let granted = tokio::time::timeout(wait, &mut waiting.grant).await;
        inner
            .metrics
            .queue_wait
            .observe(started.elapsed().as_secs_f64());
        match granted {
            Ok(Ok(())) => {
                waiting.done = true;
                Ok(self.permit())
            }
            Ok(Err(_shed)) => {
                // Taken out of the queue by the one that shed it.
                waiting.done = true;
                inner.metrics.pending.dec();
                Err(ApiError::shed(inner.config.retry_after_secs))
            }
            Err(_elapsed) => {
                let mut gate = inner.lock();
                if gate.queue.remove(ticket).is_some() {
                    inner.metrics.queue_depth.dec();
                    inner.metrics.pending.dec();
                    waiting.done = true;
                    return Err(ApiError::deadline_exceeded());
                }
                drop(gate);
                // A slot arrived as the timer fired: take it. Otherwise it was shed.
                waiting.done = waiting.grant.try_recv().is_ok();
                if waiting.done {
                    Ok(self.permit())
                } else {
                    Err(ApiError::shed(inner.config.retry_after_secs))
                }
            }
        }
    }

    /// Charges `weighted` tokens of service to `tenant` (streamed output, corrections).
    pub(crate) fn charge(&self, tenant: &str, weighted: f64) {
        if self.inner.config.order == QueueOrder::Fair && weighted != 0.0 {
            self.inner.lock().queue.charge(tenant, weighted);
        }
    }

    /// In flight, of them still prefilling, queued, and every tenant's place, for the admin
    /// status.
    pub(crate) fn status(&self) -> (usize, usize, usize, Vec<TenantDepth>) {
        let gate = self.inner.lock();
        (
            gate.in_flight,
            gate.prefilling,
            gate.queue.len(),
            gate.queue.depths(),
        )
    }
}

/// On paused tokio time: every timeout fires exactly when the test's timeline says, however
/// busy the machine is.
/// The pool's concurrency limit and queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Requests in flight upstream at once.
    pub max_concurrency: usize,
    /// Requests waiting for a slot; beyond it the gateway answers 429.
    pub max_queue: usize,
    /// Longest wait in the queue when the request carries no deadline.
    pub queue_timeout_ms: u64,
    /// The Retry-After sent with a 429 from a full queue.
    pub retry_after_secs: u64,
    /// Who gets a freed slot: the tenant with the least weighted service (`fair`) or the
    /// oldest request (`fifo`).
    pub order: QueueOrder,
    /// A waiting batch request goes before interactive ones once it has waited this long.
    pub batch_max_wait_ms: u64,
    /// Slots beyond `max_concurrency` that an interactive request of a tenant with nothing
    /// waiting and no more service than any waiting tenant may take at once (`order: fair`);
    /// `max_concurrency / 8` (at least 1) when absent, 0 turns it off.
    pub fair_headroom: Option<usize>,
    /// While requests wait, one leaves the queue only if fewer than this many requests sent
    /// are without their first bytes (queued or prefilling in an engine); headroom admissions
    /// skip it. Fewer than the endpoints keeps an engine free of backlogged tenants' long
    /// prefills for the others (`crate::admission`). Off when absent. A non-streamed request
    /// counts until its answer: the gateway cannot see its first token.
    pub max_prefills: Option<usize>,
}

/// The order of the admission queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOrder {
    /// Virtual token counter per tenant (Sheng et al., OSDI 2024).
    #[default]
    Fair,
    /// Arrival order.
    Fifo,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_concurrency: 4096,
            max_queue: 4096,
            queue_timeout_ms: 30_000,
            retry_after_secs: 1,
            order: QueueOrder::Fair,
            batch_max_wait_ms: 10_000,
            fair_headroom: None,
            max_prefills: None,
        }
    }
}

/// More slots or queue places than this is a typo, not a plan.
const MAX_SLOTS: usize = 1 << 24;

impl AdmissionConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_SLOTS).contains(&self.max_concurrency) {
            return Err(ConfigError::invalid(
                "admission.max_concurrency",
                format!("must be from 1 to {MAX_SLOTS}"),
            ));
        }
        if self.max_queue > MAX_SLOTS || self.fair_headroom.is_some_and(|h| h > MAX_SLOTS) {
            return Err(ConfigError::invalid(
                "admission.max_queue",
                format!("and admission.fair_headroom must be at most {MAX_SLOTS}"),
            ));
        }
        if self
            .max_prefills
            .is_some_and(|m| !(1..=MAX_SLOTS).contains(&m))
        {
            return Err(ConfigError::invalid(
                "admission.max_prefills",
                format!("must be from 1 to {MAX_SLOTS}"),
            ));
        }
        Ok(())
    }
}

/// The admission queue.
#[derive(Clone, Debug)]
pub(crate) struct AdmissionMetrics {
    /// Requests waiting for an admission slot.
    pub(crate) queue_depth: Gauge,
    /// Time spent waiting for admission.
    pub(crate) queue_wait: Histogram,
    /// Queued plus in-flight requests: the autoscaling signal.
    pub(crate) pending: Gauge,
}

impl AdmissionMetrics {
    /// Every family, registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = AdmissionMetrics {
            queue_depth: Gauge::default(),
            queue_wait: latency_histogram(),
            pending: Gauge::default(),
        };
        registry.register(
            "queue_depth",
            "Requests waiting for admission",
            metrics.queue_depth.clone(),
        );
        registry.register_with_unit(
            "queue_wait",
            "Time spent waiting for admission",
            Unit::Seconds,
            metrics.queue_wait.clone(),
        );
        registry.register(
            "pending_requests",
            "Queued plus in-flight requests: an autoscaling signal",
            metrics.pending.clone(),
        );
        metrics
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
