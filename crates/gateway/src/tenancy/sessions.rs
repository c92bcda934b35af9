//! A cap on one session's requests in flight (docs/background.md#agentic-workloads: cap concurrency
//! per session for fan-out), so one agent's burst of forty calls waits its turn instead of taking
//! the fleet. Calls over the cap wait in arrival order (tokio's semaphore is fair) within the queue
//! timeout; a session's entry lives only while it has calls in flight or waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type Sessions = Arc<Mutex<HashMap<String, Arc<Semaphore>>>>;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct SessionCaps {
    cap: u32,
    sessions: Sessions,
}

/// A session slot, held until the request ends.
#[derive(Debug)]
pub(crate) struct SessionSlot {
    permit: Option<OwnedSemaphorePermit>,
    sessions: Sessions,
    session: String,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let permit = self.permit.take();
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        drop(permit);
        // Only the map holds it and nobody is in flight: forget the session.
        if map
            .get(&self.session)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            map.remove(&self.session);
        }
    }
}

impl SessionCaps {
    /// At most `cap` requests per session.
    pub(crate) fn new(cap: u32) -> Self {
        SessionCaps {
            cap,
            sessions: Arc::default(),
        }
    }

    /// Waits up to `wait` for a slot of `session`; `None` when none freed in time.
    pub(crate) async fn acquire(&self, session: &str, wait: Duration) -> Option<SessionSlot> {
        let semaphore = {
            let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(session.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.cap as usize)))
                .clone()
        };
        let mut slot = SessionSlot {
            permit: None,
            sessions: self.sessions.clone(),
            session: session.to_owned(),
        };
        // The slot's drop forgets the session when this was its last user, whatever happens.
        let acquired = tokio::time::timeout(wait, semaphore.acquire_owned()).await;
        slot.permit = Some(acquired.ok()?.ok()?);
        Some(slot)
    }

    /// Sessions with calls in flight or waiting.
    pub(crate) fn active(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_session_over_its_cap_waits_and_its_entry_goes_when_idle() {
        let caps = SessionCaps::new(2);
        let a = caps.acquire("s", Duration::from_secs(1)).await.unwrap();
        let _b = caps.acquire("s", Duration::from_secs(1)).await.unwrap();
        let _other = caps.acquire("t", Duration::from_secs(1)).await.unwrap();
        assert!(caps
            .acquire("s", Duration::from_millis(100))
            .await
            .is_none());
        let (third, ()) = tokio::join!(caps.acquire("s", Duration::from_secs(1)), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(a);
        });
        let third = third.unwrap();
        assert_eq!(caps.active(), 2);
        drop((third, _b, _other));
        assert_eq!(caps.active(), 0);
    }
}
