//! The last prompt of each session, so that the next turn of a long conversation is encoded from
//! where it parts from the previous one (agentic clients re-send 64K-480K tokens every turn).
//!
//! Why this is exact: a tokenizer cuts the text at its added tokens and encodes each stretch
//! between them on its own (see [`crate::pieces`]), so the ids of a text are the ids of any
//! leading run of its stretches and added tokens followed by the ids of the rest, provided the
//! cut is the same in the new text as in the old. The added tokens are found leftmost-longest
//! (Hugging Face's `AddedVocabulary`): whether an added token is found at `s`, and which, is
//! decided by the bytes before `s + L` alone, `L` being the longest added token. So when the new
//! prompt's text equals the old one's up to `p`, every added token the old text had that starts
//! before `p - L` is found in the new one too, and the encoding resumes right after the last of
//! them: the old ids up to there are kept, and only the rest is encoded (a chat template puts
//! `<|im_start|>` and the like between messages, so that is the new turn and the generation
//! prompt). When no such token exists (the first message changed), the whole text is encoded.
//! The template is still rendered whole: a template may render a message differently once
//! another follows it (the test template closes a run of tool results only before a non-tool
//! message), so only the rendered text can say what is shared.
//!
//! The messages' values for the template are kept too: converting a message to what the
//! template sees costs two copies of it, and a message equal to the one at its place in the
//! previous request is not converted again (compared in full: equal values, not hashes).
//!
//! Memory: each session's rendered text, its ids (4 bytes each), a few cuts per message and its
//! messages twice (as given, for the comparison, and as the template sees them), bounded by a
//! budget of bytes; past it the least recently used sessions are forgotten, and
//! their next turn is encoded whole (long earlier messages still come from the stretch cache).

use crate::template::Converted;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Where an encoding may resume: after an added token ending at byte `text`, with `ids` ids
/// before that point; valid for a new text equal to the old one up to `safe` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) text: usize,
    pub(crate) ids: usize,
    pub(crate) safe: usize,
}

/// One session's last prompt.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Moved in, not copied: a long conversation's is megabytes.
    pub(crate) text: Arc<String>,
    pub(crate) ids: Arc<[u32]>,
    pub(crate) cuts: Arc<[Cut]>,
    /// The messages as the template saw them, for the next render.
    pub(crate) messages: Arc<[Arc<Converted>]>,
}

/// Bytes an entry is charged besides its text, ids and cuts: the maps' slots and the Arcs'
/// headers.
const ENTRY_OVERHEAD: usize = 128;

impl Entry {
    fn bytes(&self) -> usize {
        self.text.len()
            + std::mem::size_of_val::<[u32]>(&self.ids)
            + std::mem::size_of_val::<[Cut]>(&self.cuts)
            + self.messages.iter().map(|m| m.bytes).sum::<usize>()
            + ENTRY_OVERHEAD
    }

    /// The last cut that holds for `text`, if any.
    pub(crate) fn resume_point(&self, text: &str) -> Option<Cut> {
        let p = common_prefix(self.text.as_bytes(), text.as_bytes());
        let k = self.cuts.partition_point(|c| c.safe <= p);
        k.checked_sub(1).map(|k| self.cuts[k])
    }
}

/// Leading bytes `a` and `b` share, compared a cache line at a time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, (Entry, u64)>,
    /// Sessions by last use: tick to session.
    order: BTreeMap<u64, u64>,
    bytes: usize,
    tick: u64,
}

/// Sessions' last prompts, least recently used forgotten past a budget of bytes. See the module
/// documentation.
#[derive(Debug)]
pub struct PromptMemo {
    budget: usize,
    state: Mutex<State>,
}

/// What the memo keeps by default: 256 MiB, about 70 sessions of 480K tokens at 4 bytes per
/// token (text and ids: 3.8 MB each), or 250 of 128K.
pub const DEFAULT_MEMO_BYTES: usize = 256 << 20;

impl PromptMemo {
    /// An empty memo holding at most `budget` bytes (0 keeps nothing).
    pub fn new(budget: usize) -> Self {
        PromptMemo {
            budget,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Sessions held now.
    pub fn sessions(&self) -> usize {
        self.lock().entries.len()
    }

    /// Forgets every session.
    pub fn forget(&self) {
        let old = std::mem::take(&mut *self.lock());
        drop(old);
    }

    /// `session`'s last prompt, now its most recent use.
    pub(crate) fn get(&self, session: u64) -> Option<Entry> {
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        let (entry, used) = s.entries.get_mut(&session)?;
        let (entry, was) = (entry.clone(), std::mem::replace(used, tick));
        s.order.remove(&was);
        s.order.insert(tick, session);
        Some(entry)
    }

    /// Keeps `entry` as `session`'s last prompt, forgetting the least recently used sessions
    /// until the memo is within its budget (an entry larger than the whole budget is not kept).
    /// What is forgotten is freed after the lock is let go.
    pub(crate) fn put(&self, session: u64, entry: Entry) {
        let mut freed = Vec::new();
        let mut s = self.lock();
        if let Some((old, used)) = s.entries.remove(&session) {
            s.order.remove(&used);
            s.bytes -= old.bytes();
            freed.push(old);
        }
        if entry.bytes() <= self.budget {
            s.tick += 1;
            let tick = s.tick;
            s.bytes += entry.bytes();
            s.entries.insert(session, (entry, tick));
            s.order.insert(tick, session);
        }
        while s.bytes > self.budget {
            let Some((_, oldest)) = s.order.pop_first() else {
                break;
            };
            if let Some((old, _)) = s.entries.remove(&oldest) {
                s.bytes -= old.bytes();
                freed.push(old);
            }
        }
        drop(s);
        drop(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str, ids: usize) -> Entry {
        Entry {
            text: Arc::new(text.to_owned()),
            ids: vec![0; ids].into(),
            cuts: Arc::new([]),
            messages: Arc::new([]),
        }
    }

    #[test]
    fn least_recently_used_sessions_go_past_the_budget() {
        let one = entry(&"x".repeat(872), 0).bytes();
        assert_eq!(one, 1000);
        let memo = PromptMemo::new(3 * one);
        for s in 0..3 {
            memo.put(s, entry(&"x".repeat(872), 0));
        }
        assert_eq!((memo.sessions(), memo.bytes()), (3, 3000));
        assert!(memo.get(0).is_some());
        memo.put(3, entry(&"x".repeat(872), 0));
        assert!(
            memo.get(1).is_none(),
            "session 1 was the least recently used"
        );
        assert!(memo.get(0).is_some() && memo.get(2).is_some() && memo.get(3).is_some());
        // A bigger entry pushes out as many as it needs.
        memo.put(4, entry(&"x".repeat(1872), 0));
        assert_eq!(memo.sessions(), 2);
        assert!(memo.bytes() <= memo.budget());
        // Replacing a session's entry charges only the new one.
        memo.put(4, entry("", 218));
        assert_eq!(memo.bytes(), 2 * one);
        // Larger than the whole budget: not kept, and nothing else is lost for it.
        memo.put(5, entry(&"x".repeat(4000), 0));
        assert!(memo.get(5).is_none());
        assert_eq!(memo.sessions(), 2);
        memo.forget();
        assert_eq!((memo.sessions(), memo.bytes()), (0, 0));
    }

    #[test]
    fn common_prefix_counts_across_chunks() {
        let a = "a".repeat(200);
        for cut in [0, 1, 63, 64, 65, 127, 128, 199] {
            let mut b = a.clone().into_bytes();
            b[cut] = b'b';
            assert_eq!(common_prefix(a.as_bytes(), &b), cut);
        }
        assert_eq!(common_prefix(a.as_bytes(), &a.as_bytes()[..130]), 130);
        assert_eq!(common_prefix(b"", a.as_bytes()), 0);
    }
}
