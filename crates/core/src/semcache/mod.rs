//! The semantic cache's pure parts: the [`Store`] of answers and the [`guards`] a similarity
//! hit must pass.
//!
//! A request is cached under its scope (tenant or key: one tenant never receives another's
//! answer), the fingerprint of everything in it but its last user message (system prompt,
//! history, tools, sampling parameters, model, stream flag: these must match exactly) and
//! that last message. A lookup tries the exact message first, then messages whose embeddings
//! are close within the same scope and fingerprint (as vLLM Semantic Router does: only the
//! last user message is embedded, the rest must match). The gateway computes fingerprints
//! and embeddings; this module keeps, bounds and searches.

pub mod guards;
mod store;

pub use guards::{Guard, Guards};
pub use store::{Key, Limits, Search, Similar, Store};

/// The SHA-256 of a request's canonical form without its last user message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

#[cfg(test)]
mod tests;
