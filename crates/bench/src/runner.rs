//! The scheduler: one task walks a [`Source`] and spawns every request at its intended time,
//! whatever is still in flight, so a slow server cannot slow the sender. An open-loop source
//! ([`Schedule`]) merges the arrival process with the workload's units through a min-heap of
//! pending requests, built lazily so memory stays bounded by what is due soon; each request is
//! sent to every target at the same scheduled instant (targets interleaved in one run, side by
//! side). A closed-loop source (`crate::sessions`) is told of every answer and schedules the
//! next turn from it. Records travel back to the scheduler over a channel.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::arrivals::{self, Arrivals};
use crate::client::{self, BodyOptions, Record, Sender, Target};
use crate::workload::{RequestSpec, Workload};

/// When to stop scheduling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// No arrival after this many seconds.
    pub duration_s: Option<f64>,
    /// No more than this many requests (per target).
    pub num_requests: Option<u64>,
}

/// One scheduled request.
#[derive(Debug)]
struct Pending {
    at_s: f64,
    seq: u64,
    spec: RequestSpec,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Reversed, so `BinaryHeap` pops the earliest request first (ties: generation order).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_s
            .total_cmp(&self.at_s)
            .then(other.seq.cmp(&self.seq))
    }
}

/// Lazily merges arrivals and workload units into scheduled requests in time order.
#[derive(Debug)]
pub struct Schedule {
    arrivals: Arrivals,
    workload: Workload,
    limits: Limits,
    heap: BinaryHeap<Pending>,
    next_arrival: Option<f64>,
    generated: u64,
    emitted: u64,
}

impl Schedule {
    /// A schedule from an arrival process, a workload and limits.
    pub fn new(arrivals: Arrivals, workload: Workload, limits: Limits) -> Self {
        Self {
            arrivals,
            workload,
            limits,
            heap: BinaryHeap::new(),
            next_arrival: None,
            generated: 0,
            emitted: 0,
        }
    }

    /// The workload, positioned after the units this schedule generated, so a next schedule
    /// (the next rate of a sweep) continues with fresh requests instead of repeating these.
    pub fn into_workload(self) -> Workload {
        self.workload
    }

    fn arrivals_open(&self) -> bool {
        self.limits.num_requests.is_none_or(|n| self.generated < n)
    }
}

impl Schedule {
    /// Generates units until the earliest pending request is known (or arrivals are over).
    fn fill(&mut self) {
        while self.arrivals_open() {
            let t = *self
                .next_arrival
                .get_or_insert_with(|| self.arrivals.next().unwrap_or(f64::INFINITY));
            if !t.is_finite() || self.limits.duration_s.is_some_and(|d| t > d) {
                self.limits.num_requests = Some(self.generated); // arrivals are over
                break;
            }
            if self.heap.peek().is_some_and(|p| p.at_s < t) {
                break;
            }
            for timed in self.workload.next_unit() {
                let seq = self.generated;
                self.generated += 1;
                self.heap.push(Pending {
                    at_s: t + timed.offset_s,
                    seq,
                    spec: timed.spec,
                });
            }
            self.next_arrival = None;
        }
    }

    fn exhausted(&self) -> bool {
        self.limits.num_requests.is_some_and(|n| self.emitted >= n)
    }
}

impl Iterator for Schedule {
    /// (scheduled offset in seconds, request)
    type Item = (f64, RequestSpec);

    fn next(&mut self) -> Option<(f64, RequestSpec)> {
        if self.exhausted() {
            return None;
        }
        self.fill();
        let p = self.heap.pop()?;
        self.emitted += 1;
        Some((p.at_s, p.spec))
    }
}

/// Where a run's requests come from, in scheduled order.
pub trait Source: Send {
    /// The next request's scheduled offset (seconds from the run's start), if one is known.
    fn peek(&mut self) -> Option<f64>;
    /// The next request: its offset, what it asks, and the tag [`Source::completed`] gets back.
    fn pop(&mut self) -> Option<(f64, RequestSpec, u64)>;
    /// The request with `tag` finished at `at_s`; a closed-loop source may schedule more.
    fn completed(&mut self, _tag: u64, _at_s: f64) {}
    /// Whether more requests may still come (a closed-loop source waits for answers).
    fn open(&self) -> bool;
}

impl Source for Schedule {
    fn peek(&mut self) -> Option<f64> {
        if self.exhausted() {
            return None;
        }
        self.fill();
        self.heap.peek().map(|p| p.at_s)
    }

    fn pop(&mut self) -> Option<(f64, RequestSpec, u64)> {
        Iterator::next(self).map(|(at, spec)| (at, spec, 0))
    }

    fn open(&self) -> bool {
        !self.exhausted() && (!self.heap.is_empty() || self.arrivals_open())
    }
}

/// How the scheduler waits for a request's send time.
///
/// On a multi-threaded runtime (real runs) the last two milliseconds are slept on the OS timer
/// (tokio's timer wheel has millisecond granularity, which would bunch sends at thousands per
/// second); on a current-thread runtime (tests on paused time) only tokio's clock is used, so a
/// test's timeline is exact whatever the machine is doing.
fn precise() -> bool {
    tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
}

/// Runs `source` against `targets` (every request to each target at the same scheduled
/// instant); returns each target's records in target order. Each request leaves at its time
/// whatever is in flight (open loop); a closed-loop source learns of each answer and may
/// schedule more.
pub async fn run_schedule(
    source: &mut dyn Source,
    targets: Arc<[Target]>,
    opts: &BodyOptions,
    sender: Sender,
    progress: &ProgressBar,
) -> Vec<Vec<Record>> {
    let sender = Arc::new(Sender {
        run_start: Instant::now() + Duration::from_millis(5),
        ..sender
    });
    let start = sender.run_start;
    let precise = precise();
    let n_targets = targets.len();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, u64, Record)>();
    let mut out: Vec<Vec<Record>> = vec![Vec::new(); n_targets];
    let mut in_flight = 0usize;
    let mut accept = |(i, tag, rec): (usize, u64, Record), source: &mut dyn Source| {
        source.completed(tag, rec.sent_s + rec.e2e_ms / 1e3);
        out[i].push(rec);
        progress.inc(1);
    };
    loop {
        let Some(at_s) = source.peek() else {
            if in_flight == 0 || !source.open() {
                break;
            }
            // A closed-loop source waits for an answer to know what comes next.
            match rx.recv().await {
                Some(done) => {
                    in_flight -= 1;
                    accept(done, source);
                    continue;
                }
                None => break,
            }
        };
        let at = start + Duration::from_secs_f64(at_s.max(0.0));
        // Wait for the send time, taking answers as they come.
        let coarse = if precise {
            at - Duration::from_millis(2)
        } else {
            at
        };
        if Instant::now() < coarse {
            tokio::select! {
                () = tokio::time::sleep_until(coarse) => {}
                Some(done) = rx.recv(), if in_flight > 0 => {
                    in_flight -= 1;
                    accept(done, source);
                    continue;
                }
            }
        }
        if precise {
            let left = at.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                tokio::task::block_in_place(|| std::thread::sleep(left));
            }
        }
        let Some((at_s, spec, tag)) = source.pop() else {
            continue;
        };
        let at = start + Duration::from_secs_f64(at_s.max(0.0));
        send_to_every_target(&spec, tag, at, opts, &sender, &targets, &tx);
        in_flight += n_targets;
    }
    while in_flight > 0 {
        match rx.recv().await {
            Some(done) => {
                in_flight -= 1;
                accept(done, source);
            }
            None => break,
        }
    }
    for records in &mut out {
        records.sort_by(|a, b| a.scheduled_s.total_cmp(&b.scheduled_s));
    }
    out
}

/// Sends `spec` to every target, each request scheduled at `at`; each record comes back on
/// `tx` with its target's index and the source's `tag`.
fn send_to_every_target(
    spec: &RequestSpec,
    tag: u64,
    at: Instant,
    opts: &BodyOptions,
    sender: &Arc<Sender>,
    targets: &Arc<[Target]>,
    tx: &mpsc::UnboundedSender<(usize, u64, Record)>,
) {
    let body = client::body(spec, opts);
    for i in 0..targets.len() {
        let (sender, targets, tx, body) =
            (sender.clone(), targets.clone(), tx.clone(), body.clone());
        let session = spec.user.clone();
        tokio::spawn(async move {
            let mut rec = sender.measure(&targets[i], body, at).await;
            rec.session = session;
            let _ = tx.send((i, tag, rec));
        });
    }
}

/// The arrival configuration for one offered `rate`.
pub fn arrival_config(rate: f64, burstiness: f64, ramp: arrivals::Ramp) -> arrivals::Config {
    arrivals::Config {
        rate,
        burstiness,
        ramp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Kind, RandomConfig};

    fn random() -> Workload {
        Workload::new(
            Kind::Random(RandomConfig {
                input_len: 3,
                output_len: 2,
                range_ratio: 0.0,
            }),
            1,
            None,
        )
    }

    #[test]
    fn schedule_respects_num_requests_and_is_sorted() {
        let s = Schedule::new(
            Arrivals::new(arrivals::Config::poisson(100.0), 1),
            random(),
            Limits {
                duration_s: None,
                num_requests: Some(50),
            },
        );
        let times: Vec<f64> = s.map(|(t, _)| t).collect();
        assert_eq!(times.len(), 50);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_next_schedule_continues_the_workload() {
        let limits = Limits {
            duration_s: None,
            num_requests: Some(5),
        };
        let mut first = Schedule::new(
            Arrivals::new(arrivals::Config::poisson(100.0), 1),
            random(),
            limits,
        );
        let sent: Vec<RequestSpec> = first.by_ref().map(|(_, r)| r).collect();
        let next = Schedule::new(
            Arrivals::new(arrivals::Config::poisson(100.0), 1),
            first.into_workload(),
            limits,
        );
        let continued: Vec<RequestSpec> = next.map(|(_, r)| r).collect();
        let mut fresh = random();
        fresh.skip_units(5);
        let expected: Vec<RequestSpec> = (0..5)
            .flat_map(|_| fresh.next_unit())
            .map(|t| t.spec)
            .collect();
        assert_eq!(continued, expected, "the sixth to tenth requests");
        assert!(
            sent.iter().all(|r| !continued.contains(r)),
            "no prompt repeats"
        );
    }

    #[test]
    fn schedule_respects_duration() {
        let s = Schedule::new(
            Arrivals::new(arrivals::Config::poisson(100.0), 2),
            random(),
            Limits {
                duration_s: Some(2.0),
                num_requests: None,
            },
        );
        let times: Vec<f64> = s.map(|(t, _)| t).collect();
        assert!((170..=230).contains(&times.len()), "{}", times.len());
        assert!(times.iter().all(|&t| t <= 2.0));
    }
}
