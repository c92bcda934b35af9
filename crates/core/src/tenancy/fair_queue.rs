//! The admission queue: who goes next when a slot frees.
//!
//! Between tenants, the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language
//! Models", OSDI 2024): each tenant has a counter of the weighted tokens it was served divided by
//! its weight, and the waiting tenant with the smallest counter goes next. A tenant that starts
//! waiting again is lifted to the smallest counter of those waiting (or to the last served one when
//! nobody waits), so idling earns no credit to burst later with. The caller charges the prompt when
//! a request leaves the queue and output as it streams ([`FairQueue::charge`]), so a tenant whose
//! answers are long falls behind while they stream, not after.
//!
//! Between priorities: interactive requests go before batch ones, except that a batch request
//! waiting longer than `batch_max_wait` goes first (the starvation bound); batch work may fill only
//! half the queue, and a full queue sheds its newest batch request to make room for an interactive
//! one: low priority waits or is shed, never the person waiting for a first token.
//!
//! Within a tenant and priority, first come first served. The queue decides only *when* a
//! request dispatches; *where* is still the routing policy's choice at that moment, so prefix
//! locality is kept per request (the policy sees the fleet as it is when the request leaves).

use crate::{Nanos, Priority};
use std::collections::{HashMap, VecDeque};

/// Names a waiting request, to take it out when it gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// What [`FairQueue::push`] did.
#[derive(Debug)]
pub enum Pushed<T> {
    /// Queued.
    Queued(Ticket),
    /// Queued, and this batch item was shed to make room.
    QueuedShedding(Ticket, T),
    /// The queue (or batch's half of it) is full; the item is handed back.
    Full(T),
}

struct Waiter<T> {
    ticket: u64,
    since: Nanos,
    cost: f64,
    item: T,
}

struct Tenant<T> {
    counter: f64,
    weight: f64,
    waiting: [VecDeque<Waiter<T>>; 2],
}

impl<T> Default for Tenant<T> {
    fn default() -> Self {
        Tenant {
            counter: 0.0,
            weight: 1.0,
            waiting: [VecDeque::new(), VecDeque::new()],
        }
    }
}

impl<T> Tenant<T> {
    fn is_waiting(&self) -> bool {
        self.waiting.iter().any(|q| !q.is_empty())
    }
}

/// A tenant's place in the queue, for the admin status.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantDepth {
    /// The tenant.
    pub tenant: String,
    /// Interactive requests waiting.
    pub interactive: usize,
    /// Batch requests waiting.
    pub batch: usize,
    /// Its virtual token counter.
    pub counter: f64,
}

/// See the module documentation.
pub struct FairQueue<T> {
    tenants: HashMap<String, Tenant<T>>,
    /// Ticket to (tenant, class), to take a waiter out.
    index: HashMap<u64, (String, usize)>,
    len: [usize; 2],
    capacity: usize,
    batch_max_wait: Nanos,
    last_served: f64,
    largest_cost: f64,
    next_ticket: u64,
}

const INTERACTIVE: usize = 0;
const BATCH: usize = 1;

fn class(p: Priority) -> usize {
    match p {
        Priority::Interactive => INTERACTIVE,
        Priority::Batch => BATCH,
    }
}

impl<T> FairQueue<T> {
    /// A queue of at most `capacity` waiters whose batch requests wait at most `batch_max_wait`
    /// behind interactive ones.
    pub fn new(capacity: usize, batch_max_wait: Nanos) -> Self {
        FairQueue {
            tenants: HashMap::new(),
            index: HashMap::new(),
            len: [0, 0],
            capacity,
            batch_max_wait,
            last_served: 0.0,
            largest_cost: 0.0,
            next_ticket: 0,
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.len[INTERACTIVE] + self.len[BATCH]
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `item` of `tenant` (served in proportion to `weight`), to be charged `cost`
    /// weighted tokens when it leaves the queue.
    pub fn push(
        &mut self,
        tenant: &str,
        weight: f64,
        priority: Priority,
        now: Nanos,
        cost: f64,
        item: T,
    ) -> Pushed<T> {
        let c = class(priority);
        let mut shed = None;
        if c == BATCH && self.len[BATCH] >= self.capacity / 2 {
            return Pushed::Full(item);
        }
        if self.len() >= self.capacity {
            match (c, self.newest_batch()) {
                (INTERACTIVE, Some(ticket)) => shed = self.remove(Ticket(ticket)),
                _ => return Pushed::Full(item),
            }
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.arrive(tenant, weight, cost).waiting[c].push_back(Waiter {
            ticket,
            since: now,
            cost,
            item,
        });
        self.len[c] += 1;
        self.index.insert(ticket, (tenant.to_owned(), c));
        match shed {
            Some(item) => Pushed::QueuedShedding(Ticket(ticket), item),
            None => Pushed::Queued(Ticket(ticket)),
        }
    }

    /// A request of `tenant` arrives: its weight is updated and, if it was not waiting, its
    /// counter lifted (VTC: idling earns no credit).
    fn arrive(&mut self, tenant: &str, weight: f64, cost: f64) -> &mut Tenant<T> {
        self.largest_cost = self.largest_cost.max(cost);
        let floor = self.lift_floor();
        let t = self.tenants.entry(tenant.to_owned()).or_default();
        t.weight = if weight > 0.0 { weight } else { 1.0 };
        if !t.is_waiting() {
            t.counter = t.counter.max(floor);
        }
        t
    }

    /// The counter a tenant that starts waiting is lifted to.
    fn lift_floor(&self) -> f64 {
        self.tenants
            .values()
            .filter(|t| t.is_waiting())
            .map(|t| t.counter)
            .min_by(f64::total_cmp)
            .unwrap_or(self.last_served)
    }

    fn newest_batch(&self) -> Option<u64> {
        self.tenants
            .values()
            .filter_map(|t| t.waiting[BATCH].back())
            .max_by_key(|w| w.ticket)
            .map(|w| w.ticket)
    }

    /// Takes the next request out, charging its prompt to its tenant; returns the tenant too.
    pub fn pop(&mut self, now: Nanos) -> Option<(String, T)> {
        let starving = self
            .tenants
            .iter()
            .filter_map(|(name, t)| t.waiting[BATCH].front().map(|w| (w.since, name)))
            .filter(|(since, _)| now.saturating_since(*since) >= self.batch_max_wait)
            .min_by_key(|(since, _)| *since)
            .map(|(_, name)| name.clone());
        let (name, c) = match starving {
            Some(name) => (name, BATCH),
            None => {
                let c = if self.len[INTERACTIVE] > 0 {
                    INTERACTIVE
                } else {
                    BATCH
                };
                let name = self
                    .tenants
                    .iter()
                    .filter_map(|(name, t)| {
                        t.waiting[c].front().map(|w| (name, t.counter, w.ticket))
                    })
                    // Equal counters: the older request first.
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)))
                    .map(|(name, _, _)| name.clone())?;
                (name, c)
            }
        };
        let t = self.tenants.get_mut(&name)?;
        let w = t.waiting[c].pop_front()?;
        self.len[c] -= 1;
        self.index.remove(&w.ticket);
        t.counter += w.cost / t.weight;
        self.last_served = t.counter;
        self.forget_idle();
        Some((name, w.item))
    }

    /// Whether `tenant` is not backlogged (nothing waiting: it asks for less than its share)
    /// and is within one request of the most-served waiting tenant: VTC keeps backlogged
    /// counters within one request's cost of each other and serves a returning tenant in the
    /// next batch, so a gateway may admit such a tenant at once rather than hold it until a
    /// slot frees (slots free only when requests end, seconds apart for long streams). "One
    /// request" is the largest admission cost seen.
    pub fn underserved(&self, tenant: &str) -> bool {
        let ceiling = self
            .tenants
            .values()
            .filter(|t| t.is_waiting())
            .map(|t| t.counter)
            .max_by(f64::total_cmp)
            .unwrap_or(self.last_served);
        self.tenants
            .get(tenant)
            .is_none_or(|t| !t.is_waiting() && t.counter <= ceiling + self.largest_cost / t.weight)
    }

    /// Records that a request of `tenant` was admitted without waiting (a slot was free and
    /// nobody queued): its prompt is service like any other, so the counter moves the same way.
    pub fn admitted(&mut self, tenant: &str, weight: f64, cost: f64) {
        let t = self.arrive(tenant, weight, cost);
        t.counter += cost / t.weight;
        self.last_served = t.counter;
        self.forget_idle();
    }

    /// Charges `weighted` tokens of service to `tenant` (output as it streams, or a correction
    /// from usage).
    pub fn charge(&mut self, tenant: &str, weighted: f64) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counter = (t.counter + weighted / t.weight).max(0.0);
        }
    }

    /// Takes a waiter out (it gave up or timed out).
    pub fn remove(&mut self, ticket: Ticket) -> Option<T> {
        let (name, c) = self.index.remove(&ticket.0)?;
        let t = self.tenants.get_mut(&name)?;
        let at = t.waiting[c].iter().position(|w| w.ticket == ticket.0)?;
        let w = t.waiting[c].remove(at)?;
        self.len[c] -= 1;
        Some(w.item)
    }

    /// Drops idle tenants whose counter a lift would raise anyway, so that memory follows the
    /// tenants that matter, not every key ever seen.
    fn forget_idle(&mut self) {
        if self.tenants.len() > 64 + 2 * self.len() {
            let floor = self.last_served.min(self.lift_floor());
            self.tenants
                .retain(|_, t| t.is_waiting() || t.counter > floor);
        }
    }

    /// Every tenant with requests waiting or a counter, for the admin status.
    pub fn depths(&self) -> Vec<TenantDepth> {
        let mut out: Vec<TenantDepth> = self
            .tenants
            .iter()
            .map(|(name, t)| TenantDepth {
                tenant: name.clone(),
                interactive: t.waiting[INTERACTIVE].len(),
                batch: t.waiting[BATCH].len(),
                counter: t.counter,
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }
}

impl<T> std::fmt::Debug for FairQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairQueue")
            .field("len", &self.len)
            .field("tenants", &self.tenants.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const I: Priority = Priority::Interactive;
    const B: Priority = Priority::Batch;

    fn ticket<T>(p: Pushed<T>) -> Ticket {
        match p {
            Pushed::Queued(t) | Pushed::QueuedShedding(t, _) => t,
            Pushed::Full(_) => panic!("full"),
        }
    }

    #[test]
    fn a_heavy_backlog_cannot_starve_a_light_tenant() {
        let mut q = FairQueue::new(1000, Nanos(u64::MAX));
        for i in 0..100 {
            q.push("heavy", 1.0, I, Nanos(i), 1000.0, i);
        }
        q.push("light", 1.0, I, Nanos(100), 100.0, 1000);
        // The light tenant was lifted to the heavy one's counter (0) and is cheaper: it goes
        // within the first two, not after a hundred.
        let order: Vec<u64> = (0..3).map(|_| q.pop(Nanos(200)).unwrap().1).collect();
        assert!(order[..2].contains(&1000), "{order:?}");
    }

    #[test]
    fn only_a_tenant_without_backlog_and_below_the_waiting_ones_is_underserved() {
        let mut q = FairQueue::new(100, Nanos(u64::MAX));
        q.admitted("heavy", 1.0, 1000.0);
        q.push("heavy", 1.0, I, Nanos(0), 1000.0, ());
        assert!(q.underserved("light"), "a new tenant");
        assert!(!q.underserved("heavy"), "a backlogged tenant");
        // Lifted to the heavy tenant's 1000 on arrival, then served 100: within one request.
        q.admitted("light", 1.0, 100.0);
        assert!(q.underserved("light"));
        // More than one request (1000) ahead of every waiting tenant: it queues like anyone.
        q.admitted("light", 1.0, 1000.0);
        assert!(!q.underserved("light"));
        // The heavy tenant is served (2000) and queues again: the light one may go again.
        q.pop(Nanos(0));
        q.push("heavy", 1.0, I, Nanos(0), 1000.0, ());
        assert!(q.underserved("light"));
    }

    #[test]
    fn service_follows_weights() {
        let mut q = FairQueue::new(10_000, Nanos(u64::MAX));
        for i in 0..3000 {
            q.push("a", 2.0, I, Nanos(i), 100.0, 0u8);
            q.push("b", 1.0, I, Nanos(i), 100.0, 1u8);
        }
        let served: Vec<u8> = (0..3000).map(|_| q.pop(Nanos(0)).unwrap().1).collect();
        let a = served.iter().filter(|&&x| x == 0).count();
        assert!((1950..=2050).contains(&a), "a got {a} of 3000");
    }

    #[test]
    fn interactive_first_batch_within_its_bound_and_shed_first() {
        let bound = Nanos(1_000);
        let mut q = FairQueue::new(4, bound);
        ticket(q.push("t", 1.0, B, Nanos(0), 1.0, "b1"));
        ticket(q.push("t", 1.0, B, Nanos(0), 1.0, "b2"));
        assert!(matches!(
            q.push("t", 1.0, B, Nanos(0), 1.0, "b3"),
            Pushed::Full(_)
        ));
        ticket(q.push("u", 1.0, I, Nanos(0), 1.0, "i1"));
        ticket(q.push("u", 1.0, I, Nanos(0), 1.0, "i2"));
        match q.push("u", 1.0, I, Nanos(0), 1.0, "i3") {
            Pushed::QueuedShedding(_, shed) => assert_eq!(shed, "b2"),
            other => panic!("expected the newest batch request shed, got {other:?}"),
        }
        assert_eq!(q.pop(Nanos(10)).unwrap().1, "i1");
        // b1 has now waited past the bound: it goes before the remaining interactive work.
        assert_eq!(q.pop(Nanos(2_000)).unwrap().1, "b1");
        assert_eq!(q.pop(Nanos(2_000)).unwrap().1, "i2");
    }

    #[test]
    fn a_removed_waiter_leaves_no_trace() {
        let mut q = FairQueue::new(4, Nanos(0));
        let t = ticket(q.push("t", 1.0, I, Nanos(0), 1.0, 7));
        assert_eq!(q.remove(t), Some(7));
        assert_eq!(q.remove(t), None);
        assert!(q.is_empty() && q.pop(Nanos(0)).is_none());
    }

    proptest! {
        /// Under any interleaving of pushes, pops and removals: the length matches what is
        /// inside, capacity holds, every pushed item comes out exactly once (popped, removed,
        /// shed or refused), and no waiting tenant's counter is more than one request's cost
        /// ahead of another backlogged tenant's when both stayed backlogged (VTC's bound).
        #[test]
        fn the_queue_conserves_items_and_keeps_counters_close(
            ops in prop::collection::vec((0u8..4, 0usize..4, any::<bool>(), 1u32..100), 1..300)
        ) {
            let mut q = FairQueue::new(16, Nanos(50));
            let mut seen = std::collections::HashSet::new();
            let mut tickets = Vec::new();
            let mut out = 0usize;
            for (i, (op, tenant, batch, cost)) in ops.iter().enumerate() {
                let now = Nanos(i as u64);
                match op {
                    0 | 1 => {
                        let p = if *batch { B } else { I };
                        match q.push(&format!("t{tenant}"), 1.0, p, now, f64::from(*cost), i) {
                            Pushed::Queued(t) => tickets.push(t),
                            Pushed::QueuedShedding(t, shed) => { tickets.push(t); prop_assert!(seen.insert(shed)); out += 1; }
                            Pushed::Full(item) => { prop_assert!(seen.insert(item)); out += 1; }
                        }
                    }
                    2 => if let Some((_, item)) = q.pop(now) { prop_assert!(seen.insert(item)); out += 1; },
                    _ => if let Some(t) = tickets.pop() { if let Some(item) = q.remove(t) { prop_assert!(seen.insert(item)); out += 1; } },
                }
                prop_assert!(q.len() <= 16);
                let pushed = ops[..=i].iter().filter(|o| o.0 < 2).count();
                prop_assert_eq!(pushed, out + q.len());
                let d = q.depths();
                prop_assert_eq!(d.iter().map(|t| t.interactive + t.batch).sum::<usize>(), q.len());
            }
        }

        #[test]
        fn backlogged_tenants_stay_within_one_request_of_each_other(
            costs in prop::collection::vec((0usize..3, 1u32..500), 30..300)
        ) {
            let mut q = FairQueue::new(10_000, Nanos(u64::MAX));
            for (i, (tenant, cost)) in costs.iter().enumerate() {
                q.push(&format!("t{tenant}"), 1.0, I, Nanos(i as u64), f64::from(*cost), ());
            }
            let max_cost = 500.0;
            while q.pop(Nanos(0)).is_some() {
                let waiting: Vec<f64> = q.depths().iter().filter(|d| d.interactive > 0).map(|d| d.counter).collect();
                if let (Some(lo), Some(hi)) = (waiting.iter().copied().reduce(f64::min), waiting.iter().copied().reduce(f64::max)) {
                    prop_assert!(hi - lo <= max_cost + 1e-9, "{waiting:?}");
                }
            }
        }
    }
}
