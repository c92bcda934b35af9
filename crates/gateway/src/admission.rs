//! Admission: at most `max_concurrency` requests upstream at once, at most `max_queue` waiting
//! for a slot (FIFO: tokio's semaphore is fair), a 429 with Retry-After when the queue is full,
//! and a 504 for a request whose deadline passes while it waits (DOMAIN.md §8: shed before the
//! engine queue grows, and never serve a request nobody waits for any more).

use crate::config::AdmissionConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use kvgate_core::Priority;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The pool's admission gate.
#[derive(Debug)]
pub(crate) struct Admission {
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
    config: AdmissionConfig,
    metrics: Arc<Metrics>,
}

/// A slot; the request holds it until its response body ends.
#[derive(Debug)]
pub(crate) struct Permit {
    _slot: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.metrics.pending.dec();
    }
}

struct Queued<'a>(&'a Admission);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.queue_depth.dec();
        self.0.metrics.pending.dec();
    }
}

impl Admission {
    /// A gate with `config`'s limits.
    pub(crate) fn new(config: AdmissionConfig, metrics: Arc<Metrics>) -> Self {
        Admission {
            slots: Arc::new(Semaphore::new(config.max_concurrency)),
            queued: AtomicUsize::new(0),
            config,
            metrics,
        }
    }

    /// Waits for a slot, at most until `deadline` (from arrival) or the configured queue
    /// timeout, whichever comes first.
    ///
    /// Batch requests (DOMAIN.md §8: work that may wait or be shed) may only take the first half
    /// of the queue, so a backlog of batch work never makes interactive requests bounce.
    pub(crate) async fn admit(
        &self,
        deadline: Option<Duration>,
        priority: Priority,
    ) -> Result<Permit, ApiError> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            self.metrics.pending.inc();
            return Ok(Permit {
                _slot: slot,
                metrics: self.metrics.clone(),
            });
        }
        let bound = match priority {
            Priority::Interactive => self.config.max_queue,
            Priority::Batch => self.config.max_queue / 2,
        };
        if self.queued.fetch_add(1, Ordering::Relaxed) >= bound {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::overloaded(self.config.retry_after_secs));
        }
        self.metrics.queue_depth.inc();
        self.metrics.pending.inc();
        let queued = Queued(self);
        let started = Instant::now();
        // A client's deadline can shorten the operator's queue timeout, never lengthen it.
        let queue_timeout = Duration::from_millis(self.config.queue_timeout_ms);
        let wait = deadline.map_or(queue_timeout, |d| d.min(queue_timeout));
        let slot = tokio::time::timeout(wait, self.slots.clone().acquire_owned()).await;
        self.metrics
            .queue_wait
            .observe(started.elapsed().as_secs_f64());
        drop(queued);
        match slot {
            Ok(Ok(slot)) => {
                self.metrics.pending.inc();
                Ok(Permit {
                    _slot: slot,
                    metrics: self.metrics.clone(),
                })
            }
            Ok(Err(_closed)) => Err(ApiError::no_endpoint("the gateway is shutting down")),
            Err(_elapsed) => Err(ApiError::deadline_exceeded()),
        }
    }
}

/// On paused tokio time: every timeout fires exactly when the test's timeline says, however
/// busy the machine is.
#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[tokio::test(start_paused = true)]
    async fn full_queue_is_429_and_late_requests_are_504() {
        let gate = Admission::new(
            AdmissionConfig {
                max_concurrency: 1,
                max_queue: 1,
                queue_timeout_ms: 50,
                retry_after_secs: 2,
            },
            Arc::new(Metrics::new()),
        );
        let held = gate.admit(None, Priority::Interactive).await.unwrap();
        let (queued, full) = tokio::join!(
            gate.admit(Some(Duration::from_millis(30)), Priority::Interactive),
            async {
                tokio::task::yield_now().await;
                gate.admit(None, Priority::Interactive).await
            }
        );
        let full = full.unwrap_err();
        assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.retry_after_secs, Some(2));
        assert_eq!(queued.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
        drop(held);
        assert!(gate.admit(None, Priority::Interactive).await.is_ok());
        assert_eq!(gate.metrics.pending.get(), 0);
        assert_eq!(gate.metrics.queue_depth.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_deadline_cannot_outlast_the_queue_timeout() {
        let gate = Admission::new(
            AdmissionConfig {
                max_concurrency: 1,
                max_queue: 1,
                queue_timeout_ms: 20,
                retry_after_secs: 1,
            },
            Arc::new(Metrics::new()),
        );
        let _held = gate.admit(None, Priority::Interactive).await.unwrap();
        let waited = tokio::time::timeout(
            Duration::from_secs(2),
            gate.admit(Some(Duration::from_secs(3_600)), Priority::Interactive),
        )
        .await
        .expect("the operator's 20 ms queue timeout must bound an hour-long client deadline");
        assert_eq!(waited.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn batch_work_only_uses_half_the_queue() {
        let gate = Admission::new(
            AdmissionConfig {
                max_concurrency: 1,
                max_queue: 2,
                queue_timeout_ms: 50,
                retry_after_secs: 1,
            },
            Arc::new(Metrics::new()),
        );
        let _held = gate.admit(None, Priority::Batch).await.unwrap();
        let (first, second, interactive) = tokio::join!(
            gate.admit(None, Priority::Batch),
            async {
                tokio::task::yield_now().await;
                gate.admit(None, Priority::Batch).await
            },
            async {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
                gate.admit(None, Priority::Interactive).await
            }
        );
        assert_eq!(second.unwrap_err().status, StatusCode::TOO_MANY_REQUESTS);
        // The interactive request found room in the second half and waited (then timed out).
        assert_eq!(interactive.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(first.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
    }
}
