//! An incremental reader of server-sent events (the `text/event-stream` format of the WHATWG
//! HTML standard, section 9.2 "Server-sent events") for OpenAI-style streams: byte chunks in,
//! split anywhere, and typed events out, with views of the chunk JSON parsed only on request.
//!
//! ```
//! use kvgate_sse::{Event, Reader};
//!
//! let mut reader = Reader::new();
//! let (mut chunks, mut done) = (0, false);
//! for piece in [&b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n"[..], b"\ndata: [DO", b"NE]\n\n"] {
//!     let mut feed = reader.feed(piece);
//!     while let Some(event) = feed.next_event() {
//!         match event.unwrap() {
//!             Event::Data(d) => chunks += usize::from(d.chunk().unwrap().has_content),
//!             Event::Done(_) => done = true,
//!         }
//!     }
//! }
//! assert_eq!((chunks, done), (1, true));
//! ```

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod event;
mod reader;

pub use event::{Chunk, Data, ErrorObject, Event, Usage};
pub use reader::{Feed, Reader, DEFAULT_LIMIT};

/// What goes wrong reading a stream.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An event passed the reader's limit; it is skipped to its blank line.
    #[error("an event of more than {limit} bytes, from byte {start} of the stream")]
    TooLarge {
        /// The reader's limit.
        limit: usize,
        /// Stream offset where the event began.
        start: u64,
    },
    /// An event's data is not the JSON of a chunk.
    #[error("not a stream chunk: {0}")]
    Json(#[from] serde_json::Error),
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
