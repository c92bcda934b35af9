//! Inputs for the fuzz properties: real captured inputs changed the way a broken engine, a
//! truncated read or a hostile client would change them.
//!
//! Coverage-guided fuzzing needs a nightly toolchain; mutating captured inputs gets most of its
//! reach without one, because almost every mutant is still nearly well-formed and so travels deep
//! into the parser before it goes wrong, where purely random bytes stop at the first check.
//! Proptest shrinks a failure towards the seed with the fewest mutations.

use proptest::prelude::*;
use proptest::sample::Index;

/// Inserted whole: the characters and values that hand-written parsers trip over.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b":",
    b",",
    b"\\u0000",
    b"\\ud800",
    b"\0",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xf0\x9f\x98",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b"\t",
    b" ",
    b"null",
    b"true",
    b"data: ",
    b"data: [DONE]\n\n",
    b"\"usage\":",
    b"\"usage\":{",
    b"\"choices\":[]",
    b"\"prompt_tokens\":",
    b"\"cached_tokens\":",
    b"{\"prompt_tokens\":1}",
    b"\"stream\":true,",
    b"\"stream_options\":",
    b"\"include_usage\":",
    b"\"max_tokens\":",
    b"\"messages\":",
    b"\"content\":[",
    b"\"tool_calls\":",
    b"#",
    b"=",
    b"vllm:num_gpu_blocks ",
    b"vllm:cache_config_info{",
    b"num_gpu_blocks=\"",
    b"Bearer ",
    b"GMT",
    b": ",
    b"- ",
    b"&a ",
    b"*a",
    b"<<: ",
    b"!!binary ",
    b"!!str ",
    b"---\n",
    b"? ",
    b"|\n",
    b"'",
    b"~",
    b"%YAML 1.2\n",
];

/// Written over a number of the input, or inserted.
const NUMBERS: &[&[u8]] = &[
    b"0",
    b"-0",
    b"-1",
    b"0.0",
    b"2.5",
    b"1e-9",
    b"0.000000001",
    b"1e-320",
    b"4294967295",
    b"4294967296",
    b"9007199254740993",
    b"18446744073709551615",
    b"18446744073709551616",
    b"99999999999999999999999999999",
    b"1e20",
    b"1e300",
    b"1e999",
    b"-1e999",
    b"1.7976931348623157e308",
    b"NaN",
    b"inf",
    b".nan",
    b".inf",
    b"0x10",
];

/// Opened many times over to nest an input past every recursion limit.
const NESTS: &[&[u8]] = &[b"[", b"{", b"{\"a\":", b"[{\"text\":", b"{a: ", b"- "];

/// One edit of an input. Positions are [`Index`]es so that they fit any length and shrink.
#[derive(Clone, Debug)]
pub(super) enum Op {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Token(Index, Index),
    Number(Index, Index),
    Delete(Index, u8),
    Truncate(Index),
    Repeat(Index, u8, u16),
    Splice(Index, Index, Index),
    Nest(Index, Index, u16),
}

fn op() -> impl Strategy<Value = Op> {
    let i = any::<Index>;
    prop_oneof![
        3 => (i(), 0u8..8).prop_map(|(at, bit)| Op::Flip(at, bit)),
        2 => (i(), any::<u8>()).prop_map(|(at, b)| Op::Set(at, b)),
        2 => (i(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(at, b)| Op::Insert(at, b)),
        4 => (i(), i()).prop_map(|(at, t)| Op::Token(at, t)),
        3 => (i(), i()).prop_map(|(at, n)| Op::Number(at, n)),
        2 => (i(), any::<u8>()).prop_map(|(at, n)| Op::Delete(at, n)),
        2 => i().prop_map(Op::Truncate),
        1 => (i(), 1u8..64, prop_oneof![9 => 1u16..16, 1 => 16u16..1024])
            .prop_map(|(at, len, times)| Op::Repeat(at, len, times)),
        2 => (i(), i(), i()).prop_map(|(at, other, from)| Op::Splice(at, other, from)),
        1 => (i(), i(), 1u16..400).prop_map(|(at, n, depth)| Op::Nest(at, n, depth)),
    ]
}

/// A position in `0..=len`.
fn at(i: &Index, len: usize) -> usize {
    i.index(len + 1)
}

/// Applies `ops` in order to a copy of `seeds[pick]`; `seeds` also feed [`Op::Splice`].
pub(super) fn apply(seeds: &[Vec<u8>], pick: &Index, ops: &[Op]) -> Vec<u8> {
    let mut out = seeds[pick.index(seeds.len())].clone();
    for op in ops {
        let len = out.len();
        match op {
            Op::Flip(i, bit) if len > 0 => out[i.index(len)] ^= 1 << bit,
            Op::Set(i, b) if len > 0 => out[i.index(len)] = *b,
            Op::Flip(..) | Op::Set(..) => {}
            Op::Insert(i, bytes) => {
                out.splice(at(i, len)..at(i, len), bytes.iter().copied());
            }
            Op::Token(i, t) => {
                let token = TOKENS[t.index(TOKENS.len())];
                out.splice(at(i, len)..at(i, len), token.iter().copied());
            }
            Op::Number(i, n) => {
                let number = NUMBERS[n.index(NUMBERS.len())];
                let start = at(i, len);
                let digits = out[start..].iter().position(u8::is_ascii_digit);
                let (from, to) = match digits {
                    Some(d) => {
                        let run = out[start + d..]
                            .iter()
                            .take_while(|b| b.is_ascii_digit() || **b == b'.')
                            .count();
                        (start + d, start + d + run)
                    }
                    None => (start, start),
                };
                out.splice(from..to, number.iter().copied());
            }
            Op::Delete(i, n) => {
                let from = at(i, len);
                out.drain(from..(from + usize::from(*n)).min(len));
            }
            Op::Truncate(i) => out.truncate(at(i, len)),
            Op::Repeat(i, n, times) => {
                let from = at(i, len);
                let piece = out[from..(from + usize::from(*n)).min(len)].to_vec();
                let copies = piece.repeat(usize::from(*times));
                out.splice(from..from, copies);
            }
            Op::Splice(i, other, from) => {
                let other = &seeds[other.index(seeds.len())];
                out.truncate(at(i, len));
                out.extend_from_slice(&other[at(from, other.len())..]);
            }
            Op::Nest(i, n, depth) => {
                let open = NESTS[n.index(NESTS.len())].repeat(usize::from(*depth));
                out.splice(at(i, len)..at(i, len), open);
            }
        }
    }
    out
}

/// Mostly mutants of `seeds`, some seeds unchanged and some random bytes.
pub(super) fn input(seeds: &'static [Vec<u8>]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => any::<Index>().prop_map(move |i| seeds[i.index(seeds.len())].clone()),
        8 => (any::<Index>(), prop::collection::vec(op(), 1..8))
            .prop_map(move |(pick, ops)| apply(seeds, &pick, &ops)),
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}

/// [`input`] as text, invalid UTF-8 replaced (callers that take `&str` get text from a lossy
/// decode or not at all).
pub(super) fn text(seeds: &'static [Vec<u8>]) -> impl Strategy<Value = String> {
    input(seeds).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Where to cut an input into frames: arbitrary, so frames end inside tokens, inside `\r\n`
/// and inside multi-byte characters.
pub(super) fn cuts() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..12)
}

/// `data` cut at `cuts`, in order; the pieces concatenate back to `data`.
pub(super) fn pieces<'a>(data: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| at(c, data.len())).collect();
    points.sort_unstable();
    let mut out = Vec::with_capacity(points.len() + 1);
    let mut from = 0;
    for p in points {
        out.push(&data[from..p]);
        from = p;
    }
    out.push(&data[from..]);
    out
}

/// Seeds from borrowed byte strings.
pub(super) fn seeds(items: &[&[u8]]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.to_vec()).collect()
}
