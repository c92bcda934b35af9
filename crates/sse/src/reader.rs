//! The incremental reader: the event-stream interpretation of the WHATWG HTML standard
//! ("Server-sent events", section 9.2.6, "Interpreting an event stream"), fed in pieces.

use crate::event::{Data, Event};
use crate::Error;
use std::ops::Range;

/// What a reader holds of one event by default: far more than any chunk of an OpenAI-style
/// stream (a few hundred bytes), small enough that an upstream that never ends an event cannot
/// take much memory.
pub const DEFAULT_LIMIT: usize = 1 << 20;

/// Reads a server-sent-events stream from byte chunks split anywhere (inside a line, a CRLF
/// pair or a UTF-8 character). Events come out as their blank line arrives; an event's data
/// is borrowed from the chunk when one data line holds it all, copied otherwise.
///
/// Memory is bounded by the limit: an event whose bytes (from the end of the previous event to
/// its blank line, comments and other fields included) pass it is reported once as
/// [`Error::TooLarge`] and skipped to its blank line.
#[derive(Debug)]
pub struct Reader {
    limit: usize,
    /// Stream offset of the next byte.
    pos: u64,
    /// Stream offset where the current event began: just after the previous blank line.
    start: u64,
    /// The unfinished line of earlier chunks (when it is kept).
    carry: Vec<u8>,
    /// A line is unfinished (carried, or skipped): the next line end is not a blank line.
    mid_line: bool,
    /// The current event's data once it is not one line of the chunk being read.
    data: Vec<u8>,
    /// A data line came in the current event (its data may still be empty).
    has_data: bool,
    /// The `event:` field of the current event.
    kind: Vec<u8>,
    /// The last `id:` field, which the standard carries over to later events.
    id: Vec<u8>,
    /// The last valid `retry:` field.
    retry: Option<u64>,
    /// The last byte read was a CR ending a line: an LF first in the next chunk completes it.
    cr: bool,
    /// That line was blank: its event is dispatched once its end is known (LF or not).
    blank_cr: bool,
    /// Inside an event over the limit: everything up to its blank line is skipped.
    skipping: bool,
    /// An event was handed out: its state is cleared before the next byte is read.
    dispatched: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Reader::with_limit(DEFAULT_LIMIT)
    }
}

impl Reader {
    /// A reader holding at most [`DEFAULT_LIMIT`] bytes of an event.
    pub fn new() -> Self {
        Reader::default()
    }

    /// A reader holding at most `limit` bytes of an event.
    pub fn with_limit(limit: usize) -> Self {
        Reader {
            limit,
            pos: 0,
            start: 0,
            carry: Vec::new(),
            mid_line: false,
            data: Vec::new(),
            has_data: false,
            kind: Vec::new(),
            id: Vec::new(),
            retry: None,
            cr: false,
            blank_cr: false,
            skipping: false,
            dispatched: false,
        }
    }

    /// Reads the next chunk: its events come from [`Feed::next_event`]. Dropping the feed reads
    /// the rest of the chunk (events not asked for are lost, the state stays right).
    pub fn feed<'r, 'c>(&'r mut self, chunk: &'c [u8]) -> Feed<'r, 'c> {
        Feed {
            reader: self,
            input: chunk,
            at: 0,
            borrowed: None,
        }
    }

    /// Reads a chunk for its framing only ([`Reader::boundary`]), its events unread.
    pub fn advance(&mut self, chunk: &[u8]) {
        drop(self.feed(chunk));
    }

    /// The stream ended: the event it ended inside, if any (an event whose blank line never
    /// came; the standard discards it, a caller counting what was sent may not). The reader is
    /// then ready for a new stream at the same offsets.
    pub fn finish(&mut self) -> Option<Event<'_>> {
        self.clear_dispatched();
        self.cr = false;
        self.mid_line = false;
        if !std::mem::take(&mut self.blank_cr) && !self.carry.is_empty() && !self.skipping {
            let mut line = std::mem::take(&mut self.carry);
            self.field(&line, None);
            line.clear();
            self.carry = line;
        }
        self.carry.clear();
        let span = self.dispatch()?;
        Some(self.event(span, None, &[]))
    }

    /// Stream offset just after the last blank line: everything before it belongs to events
    /// that were handed out (or had no data).
    pub fn boundary(&self) -> u64 {
        self.start
    }

    /// Stream offset of the next byte.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Inside an event over the limit, which is being skipped.
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// The last valid `retry:` field, in milliseconds.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    fn clear_dispatched(&mut self) {
        if std::mem::take(&mut self.dispatched) {
            self.reset_event();
        }
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.kind.clear();
        self.has_data = false;
    }

    /// Ends the current event at a blank line (or the end of the stream) just before `pos`:
    /// its span when it is handed out, which it is when a data line came (as the standard
    /// says) and it was not over the limit.
    fn dispatch(&mut self) -> Option<Range<u64>> {
        let span = self.start..self.pos;
        self.start = self.pos;
        if std::mem::take(&mut self.skipping) || !self.has_data {
            self.reset_event();
            return None;
        }
        self.dispatched = true;
        Some(span)
    }

    /// The event just dispatched: its data is `input[borrowed]` or the reader's copy.
    fn event<'a>(
        &'a self,
        span: Range<u64>,
        borrowed: Option<Range<usize>>,
        input: &'a [u8],
    ) -> Event<'a> {
        let data = match borrowed {
            Some(r) => &input[r],
            None => &self.data[..],
        };
        if data.trim_ascii() == b"[DONE]" {
            return Event::Done(span);
        }
        Event::Data(Data::new(data, &self.kind, &self.id, span))
    }

    /// Applies one complete, non-blank line. `at` places the line in the chunk being read
    /// when it is read from there: the range of its value is returned when it is the event's
    /// first data, to be borrowed rather than copied.
    fn field(&mut self, line: &[u8], at: Option<usize>) -> Option<Range<usize>> {
        if line.first() == Some(&b':') {
            return None;
        }
        let (name, offset) = match memchr::memchr(b':', line) {
            Some(c) => (
                &line[..c],
                c + 1 + usize::from(line.get(c + 1) == Some(&b' ')),
            ),
            None => (line, line.len()),
        };
        let value = &line[offset..];
        match name {
            b"data" => {
                if !self.has_data {
                    self.has_data = true;
                    if let Some(at) = at {
                        return Some(at + offset..at + line.len());
                    }
                } else {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
            b"event" => {
                self.kind.clear();
                self.kind.extend_from_slice(value);
            }
            b"id" if memchr::memchr(0, value).is_none() => {
                self.id.clear();
                self.id.extend_from_slice(value);
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Some(ms) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                    self.retry = Some(ms);
                }
            }
            _ => {}
        }
        None
    }
}

/// One chunk being read.
#[derive(Debug)]
pub struct Feed<'r, 'c> {
    reader: &'r mut Reader,
    input: &'c [u8],
    at: usize,
    /// The current event's data as one line of `input`, not yet copied.
    borrowed: Option<Range<usize>>,
}

impl Feed<'_, '_> {
    /// The next event of the chunk, or an event over the limit; `None` once the chunk is read.
    pub fn next_event(&mut self) -> Option<Result<Event<'_>, Error>> {
        self.reader.clear_dispatched();
        if self.reader.cr && self.at < self.input.len() {
            self.reader.cr = false;
            let mut err = None;
            if self.input[self.at] == b'\n' {
                self.at += 1;
                self.reader.pos += 1;
                err = self.over_limit();
            }
            if std::mem::take(&mut self.reader.blank_cr) {
                if let Some(span) = self.reader.dispatch() {
                    return Some(Ok(self.reader.event(span, None, self.input)));
                }
            }
            if let Some(err) = err {
                return Some(Err(err));
            }
        }
        loop {
            let input = self.input;
            let rest = &input[self.at..];
            if rest.is_empty() {
                self.copy_borrowed();
                return None;
            }
            let Some(i) = memchr::memchr2(b'\n', b'\r', rest) else {
                return self.partial_line().map(Err);
            };
            let mut end = i + 1;
            if rest[i] == b'\r' {
                match rest.get(i + 1) {
                    Some(b'\n') => end += 1,
                    Some(_) => {}
                    None => self.reader.cr = true,
                }
            }
            let start = self.at;
            self.at += end;
            self.reader.pos += end as u64;
            let continued = std::mem::take(&mut self.reader.mid_line);
            let blank = i == 0 && !continued;
            // Over the limit, the line is still read: a blank one ends the skipped event.
            let err = self.over_limit();
            if blank && self.reader.cr {
                // Wait for the next byte: an LF there belongs to this line.
                self.reader.blank_cr = true;
            } else if blank {
                let borrowed = self.borrowed.take();
                if let Some(span) = self.reader.dispatch() {
                    return Some(Ok(self.reader.event(span, borrowed, input)));
                }
            } else {
                self.line(start, i);
            }
            if let Some(err) = err {
                return Some(Err(err));
            }
        }
    }

    /// The non-blank line `input[start..start + len]`, with what was carried before it.
    fn line(&mut self, start: usize, len: usize) {
        if self.reader.skipping {
            return;
        }
        // More lines in the event: its data so far is kept before this line may add to it.
        self.copy_borrowed();
        let input = self.input;
        if self.reader.carry.is_empty() {
            self.borrowed = self.reader.field(&input[start..start + len], Some(start));
            return;
        }
        let mut line = std::mem::take(&mut self.reader.carry);
        line.extend_from_slice(&input[start..start + len]);
        self.reader.field(&line, None);
        line.clear();
        self.reader.carry = line;
    }

    /// Moves borrowed data into the reader, before more lines join the event or the chunk
    /// ends.
    fn copy_borrowed(&mut self) {
        if let Some(r) = self.borrowed.take() {
            self.reader.data.extend_from_slice(&self.input[r]);
        }
    }

    /// The rest of the chunk is an unfinished line: it is carried over (unless skipped).
    fn partial_line(&mut self) -> Option<Error> {
        let rest = &self.input[self.at..];
        self.at = self.input.len();
        self.reader.pos += rest.len() as u64;
        let err = self.over_limit();
        self.reader.mid_line = true;
        if !self.reader.skipping {
            self.reader.carry.extend_from_slice(rest);
        }
        self.copy_borrowed();
        err
    }

    /// The event has passed the limit: it is reported once and skipped.
    fn over_limit(&mut self) -> Option<Error> {
        let r = &mut *self.reader;
        if r.skipping || r.pos - r.start <= r.limit as u64 {
            return None;
        }
        r.skipping = true;
        r.carry.clear();
        r.reset_event();
        self.borrowed = None;
        Some(Error::TooLarge {
            limit: r.limit,
            start: r.start,
        })
    }
}

impl Drop for Feed<'_, '_> {
    fn drop(&mut self) {
        while self.next_event().is_some() {}
    }
}
