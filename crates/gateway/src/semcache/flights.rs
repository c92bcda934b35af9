//! Singleflight: of identical requests that miss together, the first (the leader) goes
//! upstream and the others wait for its answer to be stored, up to a bound, then look again;
//! past the bound, or when the leader ends without storing, each makes its own call (fail
//! open). vLLM Semantic Router coalesces identical misses the same way.

use kvgate_core::semcache::Key;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The requests in flight by exact key.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    leaders: Mutex<HashMap<Key, watch::Receiver<()>>>,
}

/// What joining a flight made of a request.
#[derive(Debug)]
pub(crate) enum Joined {
    /// It leads: the others wait until this guard drops (after its answer is stored).
    Leader(Flight),
    /// It follows: the leader's end shows as the channel closing.
    Follower(watch::Receiver<()>),
}

/// A leader's place; dropping it releases the followers.
#[derive(Debug)]
pub(crate) struct Flight {
    flights: Arc<Flights>,
    key: Key,
    _tx: watch::Sender<()>,
}

impl Flights {
    /// Leads `key`'s flight, or follows the one under way.
    pub(crate) fn join(self: &Arc<Self>, key: &Key) -> Joined {
        let mut leaders = self.leaders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = leaders.get(key) {
            return Joined::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        leaders.insert(key.clone(), rx);
        Joined::Leader(Flight {
            flights: self.clone(),
            key: key.clone(),
            _tx: tx,
        })
    }

    /// Flights under way.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.leaders.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut leaders = self
            .flights
            .leaders
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        leaders.remove(&self.key);
    }
}

/// Waits until the leader of `rx` ends, at most `wait`; false when the wait ran out.
pub(crate) async fn follow(mut rx: watch::Receiver<()>, wait: std::time::Duration) -> bool {
    // The sender never sends: `changed` returns only when the leader's guard drops.
    tokio::time::timeout(wait, rx.changed()).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::semcache::Fingerprint;
    use std::time::Duration;

    fn key() -> Key {
        Key {
            scope: "t".into(),
            fingerprint: Fingerprint([0; 32]),
            message: "m".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn followers_wake_when_the_leader_ends_or_the_wait_runs_out() {
        let flights = Arc::new(Flights::default());
        let Joined::Leader(lead) = flights.join(&key()) else {
            panic!("the first leads")
        };
        let Joined::Follower(rx) = flights.join(&key()) else {
            panic!("the second follows")
        };
        let Joined::Follower(late) = flights.join(&key()) else {
            panic!("the third follows")
        };
        assert!(!follow(late, Duration::from_millis(50)).await, "timed out");
        let waiting = tokio::spawn(follow(rx, Duration::from_secs(10)));
        drop(lead);
        assert!(waiting.await.unwrap(), "released by the leader's end");
        assert_eq!(flights.len(), 0);
        assert!(matches!(flights.join(&key()), Joined::Leader(_)));
    }
}
