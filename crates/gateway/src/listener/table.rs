//! Every open client connection, oldest first, with what the listener needs to bound them: how
//! many requests each has in flight and when it last had one, so that at the cap the oldest
//! connection without a request can make room, and connections that never send a request, or
//! stop sending them, are closed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Why the gateway closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Close {
    /// No complete request within the header timeout.
    HeaderTimeout,
    /// No request for the idle timeout.
    Idle,
    /// Made room at the cap.
    Evicted,
}

impl Close {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Close::HeaderTimeout => "header_timeout",
            Close::Idle => "idle",
            Close::Evicted => "evicted",
        }
    }
}

/// One client connection.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    epoch: Instant,
    active: AtomicU32,
    used: AtomicBool,
    /// Milliseconds from `epoch` to the last request's start or end (or the accept).
    last_ms: AtomicU64,
    close: Notify,
    reason: Mutex<Option<Close>>,
}

impl Conn {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Requests in flight on it.
    pub(crate) fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    /// A request starts; it ends when the guard drops (with the response body).
    pub(crate) fn begin(self: &Arc<Self>) -> RequestGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.used.store(true, Ordering::Release);
        self.last_ms.store(self.now_ms(), Ordering::Release);
        RequestGuard(self.clone())
    }

    /// Resolves once the table asks this connection to close.
    pub(crate) async fn closing(&self) -> Close {
        self.close.notified().await;
        self.reason().unwrap_or(Close::Evicted)
    }

    /// Why it was asked to close, if it was.
    pub(crate) fn reason(&self) -> Option<Close> {
        *lock(&self.reason)
    }

    fn ask_to_close(&self, why: Close) {
        lock(&self.reason).get_or_insert(why);
        self.close.notify_one();
    }

    /// Whether it has had no request for long enough to go, and why.
    fn expired(&self, now_ms: u64, header: u64, idle: u64) -> Option<Close> {
        if self.active() > 0 {
            return None;
        }
        let quiet = now_ms.saturating_sub(self.last_ms.load(Ordering::Acquire));
        if !self.used.load(Ordering::Acquire) {
            (quiet >= header).then_some(Close::HeaderTimeout)
        } else {
            (quiet >= idle).then_some(Close::Idle)
        }
    }
}

/// Marks the end of one request on its connection.
#[derive(Debug)]
pub(crate) struct RequestGuard(Arc<Conn>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.last_ms.store(self.0.now_ms(), Ordering::Release);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What became of a new connection.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// It is open; `evicted` was asked to close to make room.
    Open {
        conn: Arc<Conn>,
        evicted: Option<Arc<Conn>>,
    },
    /// At the cap with every connection busy: close it.
    Refused,
}

/// The open connections of every listener of one gateway.
#[derive(Debug)]
pub(crate) struct Connections {
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    cap: usize,
    epoch: Instant,
    count: watch::Sender<usize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Connections {
    pub(crate) fn new(cap: usize) -> Self {
        Connections {
            conns: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            cap,
            epoch: Instant::now(),
            count: watch::channel(0).0,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Registers a new connection, making room at the cap.
    pub(crate) fn admit(&self) -> Admitted {
        let mut conns = lock(&self.conns);
        let mut evicted = None;
        if conns.len() >= self.cap {
            match Self::oldest_idle(&conns) {
                Some(id) => {
                    let old = conns.remove(&id).expect("listed");
                    old.ask_to_close(Close::Evicted);
                    evicted = Some(old);
                }
                None => return Admitted::Refused,
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            epoch: self.epoch,
            active: AtomicU32::new(0),
            used: AtomicBool::new(false),
            last_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
            reason: Mutex::new(None),
        });
        conns.insert(id, conn.clone());
        self.count.send_replace(conns.len());
        Admitted::Open { conn, evicted }
    }

    fn oldest_idle(conns: &BTreeMap<u64, Arc<Conn>>) -> Option<u64> {
        conns
            .iter()
            .find(|(_, c)| c.active() == 0)
            .map(|(&id, _)| id)
    }

    /// Asks the oldest connection without a request to close (to free a descriptor).
    pub(crate) fn evict_one(&self) -> Option<Arc<Conn>> {
        let mut conns = lock(&self.conns);
        let id = Self::oldest_idle(&conns)?;
        let old = conns.remove(&id).expect("listed");
        old.ask_to_close(Close::Evicted);
        self.count.send_replace(conns.len());
        Some(old)
    }

    /// Forgets a connection that ended.
    pub(crate) fn remove(&self, conn: &Conn) {
        let mut conns = lock(&self.conns);
        if conns.remove(&conn.id).is_some() {
            self.count.send_replace(conns.len());
        }
    }

    /// Asks every connection quiet for too long to close; returns them.
    pub(crate) fn sweep(&self, header: Duration, idle: Duration) -> Vec<Arc<Conn>> {
        let now = self.now_ms();
        let (header, idle) = (header.as_millis() as u64, idle.as_millis() as u64);
        let mut conns = lock(&self.conns);
        let expired: Vec<(u64, Close)> = conns
            .iter()
            .filter_map(|(&id, c)| c.expired(now, header, idle).map(|why| (id, why)))
            .collect();
        let out = expired
            .into_iter()
            .filter_map(|(id, why)| {
                let c = conns.remove(&id)?;
                c.ask_to_close(why);
                Some(c)
            })
            .collect();
        self.count.send_replace(conns.len());
        out
    }

    /// Connections open now.
    pub(crate) fn len(&self) -> usize {
        *self.count.borrow()
    }

    /// Resolves when no connection is open.
    pub(crate) async fn drained(&self) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|&n| n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(t: &Connections) -> Arc<Conn> {
        match t.admit() {
            Admitted::Open { conn, .. } => conn,
            Admitted::Refused => panic!("refused"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_oldest_connection_without_a_request_makes_room() {
        let t = Connections::new(3);
        let (a, b, c) = (open(&t), open(&t), open(&t));
        let _busy = a.begin();
        let Admitted::Open { conn: d, evicted } = t.admit() else {
            panic!("refused")
        };
        let evicted = evicted.expect("one evicted");
        assert_eq!(evicted.id, b.id, "a is busy, b is the oldest idle one");
        assert_eq!(b.reason(), Some(Close::Evicted));
        assert_eq!(b.closing().await, Close::Evicted, "the notice is kept");
        assert_eq!(t.len(), 3);
        let _busy_c = c.begin();
        let _busy_d = d.begin();
        assert!(matches!(t.admit(), Admitted::Refused), "every one busy");
        assert_eq!(t.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn connections_without_a_request_expire_by_header_then_idle_timeout() {
        let t = Connections::new(10);
        let (silent, used, busy) = (open(&t), open(&t), open(&t));
        drop(used.begin());
        let _in_flight = busy.begin();
        let (header, idle) = (Duration::from_secs(2), Duration::from_secs(5));
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(t.sweep(header, idle).is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        let gone = t.sweep(header, idle);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].id, silent.id);
        assert_eq!(silent.reason(), Some(Close::HeaderTimeout));
        tokio::time::advance(Duration::from_secs(3)).await;
        let gone = t.sweep(header, idle);
        assert_eq!(gone.len(), 1);
        assert_eq!(used.reason(), Some(Close::Idle));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(
            t.sweep(header, idle).is_empty(),
            "a request in flight keeps it"
        );
        assert_eq!(t.len(), 1);
        t.remove(&busy);
        t.remove(&busy);
        assert_eq!(t.len(), 0);
        t.drained().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_ending_restarts_the_idle_clock() {
        let t = Connections::new(10);
        let c = open(&t);
        let guard = c.begin();
        tokio::time::advance(Duration::from_secs(100)).await;
        drop(guard);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(t
            .sweep(Duration::from_secs(1), Duration::from_secs(5))
            .is_empty());
        assert!(t.evict_one().is_some());
        assert!(t.evict_one().is_none());
    }
}
