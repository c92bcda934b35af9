//! Fan-out first-call serialisation (DOMAIN.md §13): when several calls that share a new prefix
//! (an agent's sub-tasks over one context) arrive together, the first goes and the others wait
//! for its first token, by which time the engine holds the prefix and the routing policy knows
//! where: sent together, every one of them would compute the prefix again.
//!
//! A prefix is "new" until one call with it reached its first token; for `seen_ttl` after that it
//! is known and calls pass straight through, so a conversation's ordinary turns never wait. A held
//! call waits at most `max_wait`, and goes at once if its leader fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// At most this many prefixes are tracked; beyond it, calls with untracked prefixes pass.
const MAX_TRACKED: usize = 65_536;

#[derive(Debug)]
enum Head {
    /// A call with this prefix is on its way to its first token.
    Leading(watch::Sender<bool>),
    /// A call with this prefix reached its first token then.
    Seen(Instant),
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FanoutGate {
    heads: Arc<Mutex<HashMap<u64, Head>>>,
    max_wait: Duration,
    seen_ttl: Duration,
}

/// What a call does at the gate.
#[derive(Debug)]
pub(crate) enum Role {
    /// Go; nobody waits for this call.
    Pass,
    /// Go; the calls that arrive meanwhile wait for this one's first token.
    Lead(Leader),
    /// Wait for the leader first.
    Follow(watch::Receiver<bool>),
}

/// The first call of a new prefix. [`Leader::first_token`] releases the followers; dropping it
/// without (the call failed) releases them too, and the prefix stays new.
#[derive(Debug)]
pub(crate) struct Leader {
    heads: Arc<Mutex<HashMap<u64, Head>>>,
    key: u64,
    done: bool,
}

impl Leader {
    /// The leader's first token arrived: the prefix is cached somewhere now.
    pub(crate) fn first_token(mut self) {
        self.finish(true);
    }

    fn finish(&mut self, seen: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        let old = if seen {
            heads.insert(self.key, Head::Seen(Instant::now()))
        } else {
            heads.remove(&self.key)
        };
        if let Some(Head::Leading(tx)) = old {
            let _ = tx.send(true);
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.finish(false);
    }
}

impl FanoutGate {
    /// A gate holding followers at most `max_wait`, remembering prefixes for `seen_ttl`.
    pub(crate) fn new(max_wait: Duration, seen_ttl: Duration) -> Self {
        FanoutGate {
            heads: Arc::default(),
            max_wait,
            seen_ttl,
        }
    }

    /// The role of a call whose shared prefix hashes to `key`.
    pub(crate) fn enter(&self, key: u64) -> Role {
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        match heads.get(&key) {
            Some(Head::Leading(tx)) => return Role::Follow(tx.subscribe()),
            Some(Head::Seen(at)) if at.elapsed() < self.seen_ttl => return Role::Pass,
            _ => {}
        }
        if heads.len() >= MAX_TRACKED {
            let ttl = self.seen_ttl;
            heads.retain(|_, h| {
                matches!(h, Head::Seen(at) if at.elapsed() < ttl) || matches!(h, Head::Leading(_))
            });
            if heads.len() >= MAX_TRACKED {
                return Role::Pass;
            }
        }
        heads.insert(key, Head::Leading(watch::channel(false).0));
        Role::Lead(Leader {
            heads: self.heads.clone(),
            key,
            done: false,
        })
    }

    /// Waits for the leader's first token, its failure or `max_wait`; whether it was released
    /// (false: timed out).
    pub(crate) async fn follow(&self, mut rx: watch::Receiver<bool>) -> bool {
        // A closed channel (the leader failed and its sender dropped) ends the wait too.
        tokio::time::timeout(self.max_wait, rx.wait_for(|released| *released))
            .await
            .is_ok()
    }

    /// Prefixes tracked now.
    pub(crate) fn tracked(&self) -> usize {
        self.heads.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn siblings_wait_for_the_first_token_then_the_prefix_is_known() {
        let gate = FanoutGate::new(Duration::from_secs(2), Duration::from_secs(60));
        let Role::Lead(leader) = gate.enter(7) else {
            panic!("the first call leads")
        };
        let Role::Follow(rx) = gate.enter(7) else {
            panic!("a sibling follows")
        };
        let released = tokio::spawn({
            let started = tokio::time::Instant::now();
            async move {
                let gate = FanoutGate::new(Duration::from_secs(2), Duration::from_secs(60));
                (gate.follow(rx).await, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        leader.first_token();
        let (ok, waited) = released.await.unwrap();
        assert!(ok && waited == Duration::from_millis(300));
        assert!(matches!(gate.enter(7), Role::Pass));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_leader_releases_and_a_slow_one_is_bounded() {
        let gate = FanoutGate::new(Duration::from_millis(500), Duration::from_secs(60));
        let Role::Lead(leader) = gate.enter(1) else {
            panic!()
        };
        let Role::Follow(rx) = gate.enter(1) else {
            panic!()
        };
        drop(leader);
        assert!(gate.follow(rx).await);
        // Still new: the next call leads again.
        let Role::Lead(_slow) = gate.enter(1) else {
            panic!()
        };
        let Role::Follow(rx) = gate.enter(1) else {
            panic!()
        };
        let started = tokio::time::Instant::now();
        assert!(!gate.follow(rx).await);
        assert_eq!(started.elapsed(), Duration::from_millis(500));
    }
}
