//! Fan-out first-call serialisation (docs/background.md#agentic-workloads): when several calls that
//! share a new prefix (an agent's sub-tasks over one context) arrive together, the first goes and
//! the others wait for its first token, by which time the engine holds the prefix and the routing
//! policy knows where: sent together, every one of them would compute the prefix again.
//!
//! A prefix is "new" until one call with it reached its first token; for `seen_ttl` after that it
//! is known and calls pass straight through, so a conversation's ordinary turns never wait. A held
//! call waits at most `max_wait`, and goes at once if its leader fails.
//!
//! Across replicas (`cluster`), a burst's calls reach different gateways at the same instant, so
//! each would elect its own leader and every leader would prefill the prefix. There a leader
//! claims its prefix on NATS, waits `fanout_window_ms` for rival claims, and the earliest claim
//! (by wall clock, then replica id) leads; the others step down and follow it, released by its
//! first token as local followers are. Calls that arrive once a peer's claim was heard follow at
//! once. The window is paid only by calls that lead, only while peers are present.

use super::shared::{Announcement, Announcer};
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
    /// A peer's call with this prefix leads (since then); calls here follow it.
    PeerLeading(watch::Sender<bool>, Instant),
    /// A call with this prefix reached its first token then.
    Seen(Instant),
}

/// A leader's claim on a prefix: earlier wins, then the lower replica id.
pub(crate) type Claim = (u64, u64);

/// What the gate says to peers, and how it ranks itself among them.
#[derive(Debug)]
struct Peers {
    outbox: Arc<dyn Announcer>,
    replica: u64,
    window: Duration,
    /// The earliest rival claim heard per prefix, and when it was heard.
    claims: Mutex<HashMap<u64, (Claim, Instant)>>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FanoutGate {
    heads: Arc<Mutex<HashMap<u64, Head>>>,
    max_wait: Duration,
    seen_ttl: Duration,
    peers: Arc<std::sync::OnceLock<Peers>>,
}

/// What a replica's gate tells its peers' gates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FanoutEvent {
    /// A call leads this prefix, claimed at this instant by this replica.
    Lead(u64, Claim),
    /// Its leader reached its first token: the prefix is cached.
    Seen(u64),
    /// Its leader failed; followers go.
    Released(u64),
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
    peers: Arc<std::sync::OnceLock<Peers>>,
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
        if let Some(p) = self.peers.get() {
            p.outbox.announce(Announcement::Fanout(if seen {
                FanoutEvent::Seen(self.key)
            } else {
                FanoutEvent::Released(self.key)
            }));
        }
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
            peers: Arc::default(),
        }
    }

    /// Joins a cluster: leaders claim their prefixes through `outbox` and wait `window` for
    /// rival claims while peers are present.
    pub(crate) fn join_cluster(&self, outbox: Arc<dyn Announcer>, replica: u64, window: Duration) {
        let _ = self.peers.set(Peers {
            outbox,
            replica,
            window,
            claims: Mutex::default(),
        });
    }

    /// The role of a call whose shared prefix hashes to `key`.
    pub(crate) fn enter(&self, key: u64) -> Role {
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        match heads.get(&key) {
            Some(Head::Leading(tx)) => return Role::Follow(tx.subscribe()),
            // A peer's leader is trusted for as long as a follower would wait for it.
            Some(Head::PeerLeading(tx, at)) if at.elapsed() < self.max_wait => {
                return Role::Follow(tx.subscribe())
            }
            Some(Head::Seen(at)) if at.elapsed() < self.seen_ttl => return Role::Pass,
            _ => {}
        }
        if heads.len() >= MAX_TRACKED {
            let ttl = self.seen_ttl;
            let wait = self.max_wait;
            heads.retain(|_, h| match h {
                Head::Seen(at) => at.elapsed() < ttl,
                Head::PeerLeading(_, at) => at.elapsed() < wait,
                Head::Leading(_) => true,
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
            peers: self.peers.clone(),
        })
    }

    /// In a cluster with peers present: claims `leader`'s prefix, waits the window, and leads
    /// only if no earlier rival claim was heard; otherwise steps down to follow the rival
    /// (with this replica's followers of it). Without peers the leader leads at once.
    pub(crate) async fn contest(&self, leader: Leader) -> Role {
        let Some(p) = self.peers.get().filter(|p| p.outbox.peers() > 0) else {
            return Role::Lead(leader);
        };
        // Wall clocks: replicas on different hosts compare claims by them (NTP keeps them within
        // a millisecond or so; a worse skew only makes two leaders, as without a cluster).
        let ours: Claim = (crate::clock::now_micros(), p.replica);
        p.outbox
            .announce(Announcement::Fanout(FanoutEvent::Lead(leader.key, ours)));
        tokio::time::sleep(p.window).await;
        let rival = p
            .claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&leader.key)
            .map(|c| c.0);
        if rival.is_none_or(|r| r > ours) {
            return Role::Lead(leader);
        }
        let mut leader = leader;
        leader.done = true;
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        let tx = match heads.remove(&leader.key) {
            Some(Head::Leading(tx) | Head::PeerLeading(tx, _)) => tx,
            _ => watch::channel(false).0,
        };
        let rx = tx.subscribe();
        heads.insert(leader.key, Head::PeerLeading(tx, Instant::now()));
        Role::Follow(rx)
    }

    /// In a cluster with peers present, how long a released follower waits before it is
    /// routed: followers at every replica are released by one first token within a NATS hop of
    /// each other, and routed at the same instant they would each miss the others' dispatches
    /// and pile onto the engine holding the prefix. A uniform draw over three windows spreads
    /// them so that most see the earlier ones.
    pub(crate) fn release_jitter(&self) -> Option<Duration> {
        let p = self.peers.get().filter(|p| p.outbox.peers() > 0)?;
        Some(p.window.mul_f64(3.0 * rand::random::<f64>()))
    }

    /// A peer's word about a prefix.
    pub(crate) fn peer(&self, event: FanoutEvent) {
        let Some(p) = self.peers.get() else { return };
        let mut claims = p.claims.lock().unwrap_or_else(|e| e.into_inner());
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            FanoutEvent::Lead(key, claim) => {
                let earliest = claims.get(&key).is_none_or(|c| claim < c.0);
                if earliest {
                    claims.insert(key, (claim, Instant::now()));
                }
                let free = match heads.get(&key) {
                    None => true,
                    Some(Head::Seen(at)) => at.elapsed() >= self.seen_ttl,
                    Some(Head::PeerLeading(_, at)) => at.elapsed() >= self.max_wait,
                    Some(Head::Leading(_)) => false,
                };
                if free && heads.len() < MAX_TRACKED {
                    heads.insert(
                        key,
                        Head::PeerLeading(watch::channel(false).0, Instant::now()),
                    );
                }
                if claims.len() > MAX_TRACKED {
                    let wait = self.max_wait;
                    claims.retain(|_, c| c.1.elapsed() < wait);
                }
            }
            FanoutEvent::Seen(key) | FanoutEvent::Released(key) => {
                claims.remove(&key);
                if let Some(Head::PeerLeading(..)) = heads.get(&key) {
                    let old = if matches!(event, FanoutEvent::Seen(_)) {
                        heads.insert(key, Head::Seen(Instant::now()))
                    } else {
                        heads.remove(&key)
                    };
                    if let Some(Head::PeerLeading(tx, _)) = old {
                        let _ = tx.send(true);
                    }
                } else if matches!(event, FanoutEvent::Seen(_)) && !heads.contains_key(&key) {
                    heads.insert(key, Head::Seen(Instant::now()));
                }
            }
        }
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

    /// A cluster of one peer, whose announcements the test reads.
    #[derive(Debug)]
    struct Heard(std::sync::mpsc::Sender<Announcement>);

    impl Announcer for Heard {
        fn announce(&self, what: Announcement) {
            let _ = self.0.send(what);
        }
        fn peers(&self) -> i64 {
            1
        }
    }

    fn clustered() -> (FanoutGate, std::sync::mpsc::Receiver<Announcement>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let gate = FanoutGate::new(Duration::from_secs(2), Duration::from_secs(60));
        gate.join_cluster(Arc::new(Heard(tx)), 5, Duration::from_millis(3));
        (gate, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn across_replicas_the_earliest_claim_leads_and_the_others_follow_it() {
        let (gate, out) = clustered();
        let Role::Lead(leader) = gate.enter(9) else {
            panic!()
        };
        let Role::Follow(local_follower) = gate.enter(9) else {
            panic!()
        };
        // A rival replica claimed the same prefix a moment earlier; its claim arrives during
        // the window.
        gate.peer(FanoutEvent::Lead(9, (1, 77)));
        let Role::Follow(rx) = gate.contest(leader).await else {
            panic!("an earlier rival claim leads")
        };
        assert!(matches!(
            out.try_recv(),
            Ok(Announcement::Fanout(FanoutEvent::Lead(9, (_, 5))))
        ));
        assert!(
            out.try_recv().is_err(),
            "a leader that stepped down reports neither seen nor released"
        );
        gate.peer(FanoutEvent::Seen(9));
        assert!(gate.follow(rx).await && gate.follow(local_follower).await);
        assert!(matches!(gate.enter(9), Role::Pass));
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_rival_does_not_unseat_a_leader_and_peers_follow_a_claim_heard() {
        let (gate, out) = clustered();
        let Role::Lead(leader) = gate.enter(3) else {
            panic!()
        };
        gate.peer(FanoutEvent::Lead(3, (u64::MAX, 1)));
        let Role::Lead(leader) = gate.contest(leader).await else {
            panic!("the earlier claim is ours")
        };
        leader.first_token();
        let _claim = out.try_recv().unwrap();
        assert!(matches!(
            out.try_recv(),
            Ok(Announcement::Fanout(FanoutEvent::Seen(3)))
        ));
        // A claim heard before any call here arrives: calls follow it at once, and go when
        // its leader fails.
        gate.peer(FanoutEvent::Lead(4, (1, 2)));
        let Role::Follow(rx) = gate.enter(4) else {
            panic!()
        };
        gate.peer(FanoutEvent::Released(4));
        assert!(gate.follow(rx).await);
        assert!(matches!(gate.enter(4), Role::Lead(_)), "still new");
    }
}
