//! The reader against the rules of the standard's event-stream interpretation (WHATWG HTML,
//! "Server-sent events", 9.2.6), one test per rule, and its own: `[DONE]`, spans, the limit,
//! the stream's end, the chunk views; and a property: any chunking of a stream reads as the
//! whole stream does.

use kvgate_sse::{Chunk, Error, Event, Reader, Usage};
use proptest::prelude::*;
use std::ops::Range;

/// One thing a reader reported.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Data {
        data: Vec<u8>,
        kind: Option<Vec<u8>>,
        id: Vec<u8>,
        span: Range<u64>,
    },
    Done(Range<u64>),
    TooLarge(u64),
    /// The event the stream ended inside.
    Unfinished(Box<Seen>),
}

fn own(event: Event<'_>) -> Seen {
    match event {
        Event::Data(d) => Seen::Data {
            data: d.data().to_vec(),
            kind: d.event_type().map(<[u8]>::to_vec),
            id: d.last_event_id().to_vec(),
            span: d.span(),
        },
        Event::Done(span) => Seen::Done(span),
    }
}

/// What `reader` reports for `chunks` and the stream's end, with its final boundary.
fn read_with(mut reader: Reader, chunks: &[&[u8]]) -> (Vec<Seen>, u64) {
    let mut seen = Vec::new();
    for chunk in chunks {
        let mut feed = reader.feed(chunk);
        while let Some(event) = feed.next_event() {
            seen.push(match event {
                Ok(e) => own(e),
                Err(Error::TooLarge { start, .. }) => Seen::TooLarge(start),
                Err(e) => panic!("{e}"),
            });
        }
    }
    if let Some(e) = reader.finish() {
        seen.push(Seen::Unfinished(Box::new(own(e))));
    }
    (seen, reader.boundary())
}

/// What a default reader reports for `chunks`.
fn read(chunks: &[&[u8]]) -> Vec<Seen> {
    read_with(Reader::new(), chunks).0
}

/// A data event's payload, for short assertions.
fn data(seen: &Seen) -> &[u8] {
    match seen {
        Seen::Data { data, .. } => data,
        Seen::Unfinished(inner) => data(inner),
        other => panic!("not data: {other:?}"),
    }
}

#[test]
fn lines_end_in_lf_crlf_or_cr() {
    for stream in [
        &b"data: a\n\ndata: b\n\n"[..],
        b"data: a\r\n\r\ndata: b\r\n\r\n",
        b"data: a\r\rdata: b\r\r",
        b"data: a\r\n\ndata: b\n\r",
    ] {
        let seen = read(&[stream]);
        assert_eq!(seen.len(), 2, "{stream:?}: {seen:?}");
        assert_eq!((data(&seen[0]), data(&seen[1])), (&b"a"[..], &b"b"[..]));
    }
}

#[test]
fn one_space_after_the_colon_is_dropped() {
    let seen = read(&[b"data:a\n\ndata:  b\n\ndata\n\ndata:\n\n"]);
    let payloads: Vec<&[u8]> = seen.iter().map(data).collect();
    assert_eq!(payloads, [&b"a"[..], b" b", b"", b""]);
}

#[test]
fn data_lines_join_with_newlines() {
    let seen = read(&[b"data: {\"a\":\ndata: 1}\ndata:\n\n"]);
    assert_eq!(data(&seen[0]), b"{\"a\":\n1}\n");
}

#[test]
fn comments_and_unknown_fields_are_ignored() {
    let seen = read(&[b": keep-alive\n\nfoo: bar\ndata: x\n: in between\nbaz\n\n"]);
    assert_eq!(seen.len(), 1);
    assert_eq!(data(&seen[0]), b"x");
}

#[test]
fn an_event_without_data_is_not_dispatched() {
    assert!(read(&[b"event: ping\n\nid: 3\n\nretry: 10\n\n\n\n"]).is_empty());
}

#[test]
fn event_id_and_retry_fields() {
    let mut reader = Reader::new();
    let (seen, _) = read_with(
        Reader::new(),
        &[b"event: delta\nid: 7\ndata: a\n\ndata: b\n\nid: 8\0\nretry: x1\ndata: c\n\n"],
    );
    let fields: Vec<_> = seen
        .iter()
        .map(|s| match s {
            Seen::Data { kind, id, .. } => (kind.clone(), id.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    // The type is per event; the id carries over, and one with a NUL is ignored.
    assert_eq!(
        fields,
        [
            (Some(b"delta".to_vec()), b"7".to_vec()),
            (None, b"7".to_vec()),
            (None, b"7".to_vec())
        ]
    );
    drop(reader.feed(b"retry: 1500\n\nretry: 15x\n\n"));
    assert_eq!(reader.retry(), Some(1500));
}

#[test]
fn done_is_its_own_event_and_only_as_the_whole_data() {
    let seen = read(&[b"data: {\"content\":\"[DONE]\"}\n\ndata: [DONE]\n\ndata:[DONE] \n\n"]);
    assert!(matches!(seen[0], Seen::Data { .. }));
    assert_eq!(seen[1], Seen::Done(28..42));
    assert_eq!(seen[2], Seen::Done(42..56));
}

#[test]
fn spans_tile_the_stream_between_blank_lines() {
    let stream = b": hi\n\ndata: a\r\n\r\nevent: x\ndata: b\n\n\ndata: c\n\n";
    let (seen, boundary) = read_with(Reader::new(), &[stream]);
    let spans: Vec<_> = seen
        .iter()
        .map(|s| match s {
            Seen::Data { span, .. } => span.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(spans, [6..17, 17..35, 36..45]);
    assert_eq!(&stream[17..35], b"event: x\ndata: b\n\n");
    assert_eq!(boundary, stream.len() as u64);
}

#[test]
fn a_crlf_split_across_chunks_is_one_line_end() {
    let whole = read(&[b"data: a\r\n\r\ndata: b\r\n\r\n"]);
    let split = read(&[b"data: a\r", b"\n\r", b"\ndata: b\r\n\r", b"\n"]);
    assert_eq!(whole, split);
    // A blank line ended by CR waits for the next byte, so its span is the same either way.
    let cr = read(&[b"data: a\r\r", b"data: b\r\r"]);
    assert_eq!(data(&cr[1]), b"b");
    assert_eq!(cr[0], read(&[b"data: a\r\rdata: b\r\r"])[0]);
}

#[test]
fn a_line_and_a_character_split_across_chunks() {
    let text = "data: {\"content\":\"héllo\"}\n\n".as_bytes();
    let at = text.iter().position(|&b| b == 0xc3).unwrap() + 1;
    let seen = read(&[&text[..3], &text[3..at], &text[at..]]);
    assert_eq!(seen, read(&[text]));
    assert_eq!(
        std::str::from_utf8(data(&seen[0])).unwrap(),
        "{\"content\":\"héllo\"}"
    );
}

#[test]
fn the_event_a_stream_ends_inside_is_reported_by_finish() {
    let seen = read(&[b"data: a\n\ndata: b"]);
    assert_eq!(data(&seen[1]), b"b");
    assert!(matches!(seen[1], Seen::Unfinished(_)));
    let seen = read(&[b"data: a\n\ndata: b\n"]);
    assert!(matches!(seen[1], Seen::Unfinished(_)));
    // A blank line ended by CR at the very end is a complete event.
    let seen = read(&[b"data: a\r\r"]);
    assert!(matches!(seen[0], Seen::Unfinished(_)));
    assert!(read(&[b"data: a\n\n: tail"]).len() == 1);
}

#[test]
fn an_event_over_the_limit_is_reported_once_and_skipped() {
    let big = format!("data: {}\n\n", "x".repeat(100));
    let stream = format!("data: a\n\n{big}data: b\n\n");
    for size in [1, 7, 50, stream.len()] {
        let chunks: Vec<&[u8]> = stream.as_bytes().chunks(size).collect();
        let (seen, _) = read_with(Reader::with_limit(64), &chunks);
        assert_eq!(seen.len(), 3, "chunks of {size}: {seen:?}");
        assert_eq!(seen[1], Seen::TooLarge(9));
        assert_eq!(data(&seen[2]), b"b");
    }
    // A line that never ends holds no more than the limit.
    let mut reader = Reader::with_limit(64);
    let mut errors = 0;
    for _ in 0..100 {
        let mut feed = reader.feed(&[b'y'; 1000]);
        while let Some(e) = feed.next_event() {
            errors += usize::from(e.is_err());
        }
    }
    assert_eq!(errors, 1);
    assert!(reader.skipping() && reader.finish().is_none());
}

#[test]
fn the_rest_of_a_skipped_line_is_not_a_blank_line() {
    // Found by the chunking property: a chunk starting with the LF of a line skipped over the
    // limit ended the skipped event there, and `[DONE]` after it was handed out.
    let line = format!("data: {}", "x".repeat(30));
    let rest = "\ndata: [DONE]\n\ndata: b\n\n";
    let whole = read_with(
        Reader::with_limit(16),
        &[format!("{line}{rest}").as_bytes()],
    );
    let split = read_with(Reader::with_limit(16), &[line.as_bytes(), rest.as_bytes()]);
    assert_eq!(split, whole);
    assert_eq!(whole.0.len(), 2, "{whole:?}");
    assert_eq!(whole.0[0], Seen::TooLarge(0));
}

#[test]
fn the_lf_of_a_split_crlf_counts_toward_the_limit() {
    // Found by the chunking property: the LF that completed a CRLF in the next chunk was not
    // counted, so an event one byte over the limit passed only when split there.
    let stream = b"data: a\r\n\r\ndata: b\n\n";
    let whole = read_with(Reader::with_limit(10), &[stream]);
    let split = read_with(Reader::with_limit(10), &[&stream[..10], &stream[10..]]);
    assert_eq!(split, whole);
    assert_eq!(whole.0[0], Seen::TooLarge(0));
}

#[test]
fn data_is_borrowed_from_a_chunk_that_holds_the_event() {
    let chunk = b"data: {\"a\":1}\n\n".to_vec();
    let mut reader = Reader::new();
    let mut feed = reader.feed(&chunk);
    let Some(Ok(Event::Data(d))) = feed.next_event() else {
        panic!("no event")
    };
    assert_eq!(d.data().as_ptr(), chunk[6..].as_ptr());
}

#[test]
fn chunk_views() {
    let usage = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":332,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":320}}}"#;
    let c = Chunk::parse(usage).unwrap();
    assert_eq!(
        c.usage,
        Some(Usage {
            prompt_tokens: Some(332),
            completion_tokens: Some(8),
            cached_tokens: Some(320)
        })
    );
    assert!(!c.has_content && c.error.is_none() && c.finish_reason.is_none());
    let c = Chunk::parse(
        br#"{"choices":[{"delta":{"content":"hi"},"finish_reason":"length"}],"usage":null}"#,
    )
    .unwrap();
    assert!(c.has_content && c.usage.is_none());
    assert_eq!(c.finish_reason.as_deref(), Some("length"));
    for body in [
        &br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#[..],
        br#"{"choices":[{"delta":{},"finish_reason":null}]}"#,
    ] {
        assert!(!Chunk::parse(body).unwrap().has_content);
    }
    for body in [
        &br#"{"choices":[{"text":" once"}]}"#[..],
        br#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
        br#"{"choices":[{"message":{"content":"whole"}}]}"#,
    ] {
        assert!(Chunk::parse(body).unwrap().has_content);
    }
    let e = Chunk::parse(br#"{"error":{"message":"lost","type":"server_error","code":503}}"#)
        .unwrap()
        .error
        .unwrap();
    assert_eq!(
        (e.message.as_deref(), e.kind.as_deref(), e.code.as_deref()),
        (Some("lost"), Some("server_error"), Some("503"))
    );
    assert!(Chunk::parse(b"{oops").is_err());
    let u = Chunk::parse(br#"{"usage":{"prompt_tokens":3}}"#)
        .unwrap()
        .usage
        .unwrap();
    assert_eq!((u.completion_tokens, u.cached_tokens), (None, None));
}

/// Streams built from the pieces that matter: every line end, comments, fields, `[DONE]`,
/// multi-byte characters, and long data for the limit.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"data: {\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9\"}}]}"[..]),
        Just(&b"data:x"[..]),
        Just(&b"data: [DONE]"[..]),
        Just(&b": comment"[..]),
        Just(&b"event: e"[..]),
        Just(&b"id: 1"[..]),
        Just(&b"retry: 5"[..]),
        Just(&b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"[..]),
        Just(&b"\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\r\n"[..]),
        Just(&b"\n\n"[..]),
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

proptest! {
    #[test]
    fn any_chunking_reads_as_the_whole(stream in stream(), cuts in proptest::collection::vec(any::<usize>(), 0..12), limit in prop_oneof![Just(usize::MAX), 16usize..200]) {
        let whole = read_with(Reader::with_limit(limit), &[&stream]);
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        at.push(0);
        at.push(stream.len());
        at.sort_unstable();
        let chunks: Vec<&[u8]> = at.windows(2).map(|w| &stream[w[0]..w[1]]).collect();
        prop_assert_eq!(read_with(Reader::with_limit(limit), &chunks), whole);
    }
}
