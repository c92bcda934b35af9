//! The open-loop scheduler: one task walks the schedule and spawns every request at its
//! intended time, whatever is still in flight, so a slow server cannot slow the sender.
//!
//! The schedule merges the arrival process with the workload's units (an agentic session spreads
//! its turns over time) through a min-heap of pending requests ordered by scheduled time, built
//! lazily so memory stays bounded by what is due soon. Each request is sent to every target at the
//! same scheduled instant (targets are interleaved in one run, side by side). Records travel back
//! to one collector over a channel.

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

impl Iterator for Schedule {
    /// (scheduled offset in seconds, request)
    type Item = (f64, RequestSpec);

    fn next(&mut self) -> Option<(f64, RequestSpec)> {
        if self.limits.num_requests.is_some_and(|n| self.emitted >= n) {
            return None;
        }
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
        let p = self.heap.pop()?;
        self.emitted += 1;
        Some((p.at_s, p.spec))
    }
}

/// Runs one schedule against every target; returns each target's records in target order and
/// the schedule's workload for a next schedule to continue (`None` if the scheduler panicked).
pub async fn run_schedule(
    mut schedule: Schedule,
    targets: Arc<[Target]>,
    opts: &BodyOptions,
    sender: Sender,
    progress: &ProgressBar,
) -> (Vec<Vec<Record>>, Option<Workload>) {
    let sender = Arc::new(Sender {
        run_start: Instant::now() + Duration::from_millis(5),
        ..sender
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Record)>();
    let n_targets = targets.len();
    let bar = progress.clone();
    let collector = tokio::spawn(async move {
        let mut out: Vec<Vec<Record>> = vec![Vec::new(); n_targets];
        while let Some((i, rec)) = rx.recv().await {
            out[i].push(rec);
            bar.inc(1);
        }
        out
    });
    // The schedule runs on its own thread and sleeps with the OS timer (tens of microseconds of
    // slack) instead of tokio's millisecond timer wheel; requests are spawned onto the runtime.
    let handle = tokio::runtime::Handle::current();
    let opts = opts.clone();
    let scheduler = tokio::task::spawn_blocking(move || {
        let start = sender.run_start.into_std();
        for (at_s, spec) in schedule.by_ref() {
            let at = start + Duration::from_secs_f64(at_s);
            // Serialise while waiting, so the wake-up only spawns.
            let body = client::body(&spec, &opts);
            let now = std::time::Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            let at = Instant::from_std(at);
            for i in 0..n_targets {
                let (sender, targets, tx, body) =
                    (sender.clone(), targets.clone(), tx.clone(), body.clone());
                handle.spawn(async move {
                    let rec = sender.measure(&targets[i], body, at).await;
                    let _ = tx.send((i, rec));
                });
            }
        }
        schedule.into_workload()
    });
    // The scheduler thread owns the last sender clones; a panic there ends the run early.
    let workload = scheduler.await.ok();
    let mut out = collector.await.unwrap_or_default();
    for records in &mut out {
        records.sort_by(|a, b| a.scheduled_s.total_cmp(&b.scheduled_s));
    }
    (out, workload)
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
    use crate::workload::{AgenticConfig, Kind, RandomConfig};

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

    #[test]
    fn agentic_sessions_interleave_in_time_order() {
        let cfg = AgenticConfig {
            tenants: 2,
            system_len: 4,
            turns: 3,
            user_len: 2,
            output_len: 2,
            think_time_s: 1.0,
            fan_out: 1,
        };
        let s = Schedule::new(
            Arrivals::new(arrivals::Config::poisson(10.0), 3),
            Workload::new(Kind::Agentic(cfg), 3, None),
            Limits {
                duration_s: None,
                num_requests: Some(30),
            },
        );
        let items: Vec<(f64, RequestSpec)> = s.collect();
        assert_eq!(items.len(), 30);
        assert!(items.windows(2).all(|w| w[0].0 <= w[1].0));
        // Later turns (longer conversations) appear among the requests.
        assert!(items.iter().any(|(_, r)| r.messages.len() == 6));
    }
}
