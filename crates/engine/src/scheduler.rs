//! The scheduler task: sole owner of the engine model, run in real time.
//!
//! It takes submissions and aborts from request handlers over one channel, steps the model,
//! sleeps each iteration's modelled duration times the time scale (sleeping until an advancing
//! deadline, so short iterations do not each pay timer granularity), and then hands every
//! sequence its tokens over a per-request channel. Tokens become visible when the iteration
//! that produced them ends, as in a real engine. At time scale 0 there is nothing to sleep: it
//! runs up to [`MAX_BURST`] iterations back to back, then sends the burst's updates and yields,
//! so each handler wakes once per burst and writes its tokens in one frame (waking every
//! handler once per token would cost a task switch and a socket write per token).
//!
//! Per-request metrics (vLLM's histograms) are measured here on the wall clock: TTFT from arrival
//! to the end of the first-token iteration; queue time from arrival to the start of that iteration
//! and prefill time as its length (the model reports when a sequence produced its first token, not
//! when it was first scheduled, so a prompt prefilled in several chunks counts its earlier chunks
//! as queue time); inter-token latency per token; decode time from first to last token; e2e from
//! arrival to the last token.

use crate::backend::{Iteration, SeqEvent, SeqRequest, StepModel};
use crate::faults::FaultState;
use crate::kv_events::KvEventSink;
use crate::metrics::MetricsState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a request handler hears about its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Update {
    /// The first token; `cached_tokens` of the prompt were prefix-cache hits.
    First { cached_tokens: u32 },
    /// One more token.
    Token,
    /// The sequence is complete.
    Finished { output_tokens: u32 },
}

/// A message to the scheduler.
#[derive(Debug)]
pub(crate) enum Command {
    /// Start a sequence.
    Submit {
        request: SeqRequest,
        /// Whether reaching `max_output_tokens` means the length limit (`finish_reason`
        /// "length") rather than a sampled end of sequence ("stop").
        length_limited: bool,
        arrived: Instant,
        updates: mpsc::UnboundedSender<Update>,
        /// Leading prompt tokens whose KV a prefill engine sent (`crate::pd`).
        transferred: u32,
        /// The LoRA adapter it names (`None`: the base model).
        adapter: Option<String>,
    },
    /// The client went away.
    Abort { id: u64 },
}

#[derive(Debug)]
struct Tracked {
    updates: mpsc::UnboundedSender<Update>,
    arrived: Instant,
    first_at: Option<Instant>,
    last_at: Instant,
    prompt_tokens: u32,
    length_limited: bool,
    /// The model finished it; its last updates wait in the outbox.
    finished: bool,
    /// Start of the iteration that produced its first token (queue time ends there).
    scheduled_at: Option<Instant>,
}

/// Iterations run back to back at time scale 0 before handlers are woken (see module docs).
const MAX_BURST: u32 = 16;

/// Updates produced since the last flush, sent together so that each handler wakes once per
/// burst instead of once per token.
#[derive(Debug, Default)]
struct Outbox {
    pending: Vec<(u64, Update)>,
    finished: Vec<u64>,
}

impl Outbox {
    fn flush(&mut self, tracked: &mut HashMap<u64, Tracked>) {
        for (id, update) in self.pending.drain(..) {
            // Aborted sequences are gone from `tracked`; their updates are dropped.
            if let Some(t) = tracked.get(&id) {
                let _ = t.updates.send(update);
            }
        }
        for id in self.finished.drain(..) {
            tracked.remove(&id);
        }
    }
}

/// Runs until `shutdown` fires or every command sender is gone.
pub(crate) async fn run(
    mut model: Box<dyn StepModel>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    metrics: Arc<Mutex<MetricsState>>,
    faults: Arc<FaultState>,
    kv_sink: Option<KvEventSink>,
    time_scale: f64,
    shutdown: CancellationToken,
) {
    let mut tracked: HashMap<u64, Tracked> = HashMap::new();
    let mut outbox = Outbox::default();
    let mut deadline = tokio::time::Instant::now();
    let mut idle = true;
    let mut burst = 0;
    loop {
        // Take every pending command; block only when the model has nothing to do.
        if idle {
            let command = tokio::select! {
                _ = shutdown.cancelled() => return,
                c = commands.recv() => c,
            };
            let Some(command) = command else { return };
            apply(command, model.as_mut(), &mut tracked, &metrics);
            deadline = tokio::time::Instant::now();
        }
        loop {
            match commands.try_recv() {
                Ok(command) => apply(command, model.as_mut(), &mut tracked, &metrics),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
        let started = Instant::now();
        let Some(iteration) = model.step() else {
            idle = true;
            outbox.flush(&mut tracked);
            publish_gauges(model.as_ref(), &metrics);
            continue;
        };
        idle = false;
        if time_scale > 0.0 {
            let factor = if iteration.decode_seqs > 0 {
                faults.decode_factor()
            } else {
                1.0
            };
            let real =
                Duration::from_secs_f64(iteration.duration.0 as f64 * 1e-9 * time_scale * factor);
            // Catch up after a late wake-up, but never by more than 50 ms of backlog.
            let now = tokio::time::Instant::now();
            let floor = now.checked_sub(Duration::from_millis(50)).unwrap_or(now);
            deadline = deadline.max(floor) + real;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {}
            }
        } else if shutdown.is_cancelled() {
            return;
        }
        deliver(
            iteration,
            started,
            model.as_ref(),
            &mut tracked,
            &mut outbox,
            &metrics,
            kv_sink.as_ref(),
        );
        burst += 1;
        if time_scale > 0.0 || burst >= MAX_BURST {
            outbox.flush(&mut tracked);
            burst = 0;
            if time_scale == 0.0 {
                tokio::task::yield_now().await;
            }
        }
    }
}

fn apply(
    command: Command,
    model: &mut dyn StepModel,
    tracked: &mut HashMap<u64, Tracked>,
    metrics: &Mutex<MetricsState>,
) {
    match command {
        Command::Submit {
            request,
            length_limited,
            arrived,
            updates,
            transferred,
            adapter,
        } => {
            tracked.insert(
                request.id,
                Tracked {
                    updates,
                    arrived,
                    first_at: None,
                    last_at: arrived,
                    prompt_tokens: request.prompt.len() as u32,
                    length_limited,
                    finished: false,
                    scheduled_at: None,
                },
            );
            model.submit(request, adapter.as_deref(), transferred);
        }
        Command::Abort { id } => {
            // A sequence that finished in the current burst is already counted as finished.
            if let Some(t) = tracked.remove(&id) {
                if !t.finished {
                    model.abort(id);
                    lock(metrics).success_abort += 1;
                }
            }
        }
    }
}

fn lock(metrics: &Mutex<MetricsState>) -> std::sync::MutexGuard<'_, MetricsState> {
    metrics.lock().unwrap_or_else(|e| e.into_inner())
}

fn publish_gauges(model: &dyn StepModel, metrics: &Mutex<MetricsState>) {
    let stats = model.stats();
    let mut m = lock(metrics);
    m.running = stats.running;
    m.waiting = stats.waiting;
    m.kv_usage = stats.kv_usage;
    m.prefix_queries = stats.prefix_queries_tokens;
    m.prefix_hits = stats.prefix_hits_tokens;
    m.preemptions = stats.preemptions;
    m.lora = model.lora_stats();
}

fn deliver(
    iteration: Iteration,
    started: Instant,
    model: &dyn StepModel,
    tracked: &mut HashMap<u64, Tracked>,
    outbox: &mut Outbox,
    metrics: &Mutex<MetricsState>,
    kv_sink: Option<&KvEventSink>,
) {
    let now = Instant::now();
    if let Some(sink) = kv_sink {
        if !iteration.kv_events.is_empty() {
            sink.publish(iteration.kv_events);
        }
    }
    publish_gauges(model, metrics);
    let mut m = lock(metrics);
    for event in iteration.events {
        match event {
            SeqEvent::FirstToken { id, cached_tokens } => {
                let Some(t) = tracked.get_mut(&id) else {
                    continue;
                };
                t.first_at = Some(now);
                t.scheduled_at = Some(started);
                t.last_at = now;
                m.ttft.observe(now.duration_since(t.arrived).as_secs_f64());
                m.queue
                    .observe(started.saturating_duration_since(t.arrived).as_secs_f64());
                m.prefill.observe(now.duration_since(started).as_secs_f64());
                m.prompt_tokens += u64::from(t.prompt_tokens);
                m.generation_tokens += 1;
                outbox.pending.push((id, Update::First { cached_tokens }));
            }
            SeqEvent::Token { id } => {
                let Some(t) = tracked.get_mut(&id) else {
                    continue;
                };
                m.itl.observe(now.duration_since(t.last_at).as_secs_f64());
                m.generation_tokens += 1;
                t.last_at = now;
                outbox.pending.push((id, Update::Token));
            }
            SeqEvent::Finished { id, output_tokens } => {
                let Some(t) = tracked.get_mut(&id) else {
                    continue;
                };
                t.finished = true;
                m.decode
                    .observe(now.duration_since(t.first_at.unwrap_or(now)).as_secs_f64());
                m.e2e.observe(now.duration_since(t.arrived).as_secs_f64());
                if let Some(first) = t.first_at {
                    m.inference.observe(
                        now.duration_since(t.scheduled_at.unwrap_or(first))
                            .as_secs_f64(),
                    );
                    if output_tokens > 1 {
                        let after_first = now.duration_since(first).as_secs_f64();
                        m.tpot.observe(after_first / f64::from(output_tokens - 1));
                    }
                }
                if t.length_limited {
                    m.success_length += 1;
                } else {
                    m.success_stop += 1;
                }
                outbox
                    .pending
                    .push((id, Update::Finished { output_tokens }));
                outbox.finished.push(id);
            }
            SeqEvent::Preempted { .. } => {}
        }
    }
}
