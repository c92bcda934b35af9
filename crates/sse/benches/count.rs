//! Counting a stream's events on the proxy's path: the line scanner the gateway used before
//! this crate (kept here as the baseline) against [`kvgate_sse::Reader`], on a vLLM chat
//! stream framed as engines write it (one event per frame) and as TCP segments cut it.

#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kvgate_sse::{Event, Reader};

/// The gateway's counter before the shared reader: the first bytes of each line, to tell
/// `data: [DONE]` apart.
#[derive(Default)]
struct LineCounter {
    line: Vec<u8>,
    long: bool,
    events: u32,
    done: bool,
}

impl LineCounter {
    const KEEP: usize = 32;

    fn feed(&mut self, data: &[u8]) {
        for part in data.split_inclusive(|b| *b == b'\n') {
            let (text, ends) = match part.split_last() {
                Some((b'\n', text)) => (text, true),
                _ => (part, false),
            };
            let room = Self::KEEP.saturating_sub(self.line.len());
            self.line.extend_from_slice(&text[..text.len().min(room)]);
            self.long |= text.len() > room;
            if ends {
                if let Some(value) = self.line.strip_prefix(b"data:") {
                    if !self.long && value.trim_ascii() == b"[DONE]" {
                        self.done = true;
                    } else {
                        self.events += 1;
                    }
                }
                self.line.clear();
                self.long = false;
            }
        }
    }
}

/// The same count from the reader.
#[derive(Default)]
struct EventCounter {
    reader: Reader,
    events: u32,
    done: bool,
}

impl EventCounter {
    fn feed(&mut self, data: &[u8]) {
        let mut feed = self.reader.feed(data);
        while let Some(event) = feed.next_event() {
            match event {
                Ok(Event::Done(_)) => self.done = true,
                Ok(Event::Data(_)) | Err(_) => self.events += 1,
            }
        }
    }
}

/// A 2 000-event answer from the vLLM fixture's chunks, as frames of one event each and as
/// 1 448-byte segments.
fn frames() -> (Vec<Vec<u8>>, Vec<Vec<u8>>, u32) {
    let fixture = include_str!("../../../test-data/vllm/chat-completion-stream.txt");
    let events: Vec<&str> = fixture
        .split_inclusive("\n\n")
        .filter(|e| e.contains("\"content\":\"") && !e.contains("\"content\":\"\""))
        .collect();
    let mut per_event: Vec<Vec<u8>> = (0..2_000)
        .map(|i| events[i % events.len()].as_bytes().to_vec())
        .collect();
    per_event.push(b"data: [DONE]\n\n".to_vec());
    let segments = per_event
        .concat()
        .chunks(1448)
        .map(<[u8]>::to_vec)
        .collect();
    (per_event, segments, 2_000)
}

fn count(c: &mut Criterion) {
    let (per_event, segments, events) = frames();
    let bytes: usize = per_event.iter().map(Vec::len).sum();
    let mut group = c.benchmark_group("count");
    group.throughput(Throughput::Bytes(bytes as u64));
    for (framing, frames) in [("event_frames", &per_event), ("tcp_segments", &segments)] {
        group.bench_function(format!("lines/{framing}"), |b| {
            b.iter(|| {
                let mut counter = LineCounter::default();
                for f in frames {
                    counter.feed(black_box(f));
                }
                assert_eq!((counter.events, counter.done), (events, true));
            })
        });
        group.bench_function(format!("reader/{framing}"), |b| {
            b.iter(|| {
                let mut counter = EventCounter::default();
                for f in frames {
                    counter.feed(black_box(f));
                }
                assert_eq!((counter.events, counter.done), (events, true));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, count);
criterion_main!(benches);
