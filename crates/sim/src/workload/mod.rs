//! Workloads: what arrives, when, and what it asks for.
//!
//! A workload hands the fleet open-loop arrivals one at a time ([`Workload::next_open`]) and may
//! answer completions with follow-up requests ([`Workload::on_complete`]: the next turn of an
//! agent session after think time, or a fan-out of parallel calls). Nothing is generated ahead
//! of time, so a million-request run holds only the requests in flight.
//!
//! Prompts are token ids. Shared parts (a prefix group's document, a tenant's system prompt and
//! tool definitions) are the same ids in every request that carries them, so the engines'
//! prefix caches and the routers' prefix indexes see real sharing; everything else is unique.

mod agentic;
mod bursts;
mod open;
mod warmed;

pub use agentic::{Agentic, AgenticConfig};
pub use bursts::{Bursts, BurstsConfig};
pub use open::{OpenLoop, OpenLoopConfig, PrefixGroups};
pub use warmed::{Warmed, WARM_TAG};

use kvgate_core::Nanos;
use rand::RngCore;

/// One request a workload wants sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// When it arrives at a router.
    pub arrival: Nanos,
    /// The prompt.
    pub tokens: Vec<u32>,
    /// Output tokens it will generate.
    pub output: u32,
    /// The tenant, if the workload has tenants.
    pub tenant: Option<u32>,
    /// The session, if any.
    pub session: Option<u64>,
    /// The workload's own handle, passed back to [`Workload::on_complete`].
    pub tag: u64,
}

/// A source of requests. See the module documentation.
pub trait Workload {
    /// The next open-loop arrival (non-decreasing times), or `None` when there are no more.
    fn next_open(&mut self, rng: &mut dyn RngCore) -> Option<Spec>;

    /// A request with `tag` finished at `now`; push any follow-ups (arriving at or after `now`).
    fn on_complete(
        &mut self,
        _tag: u64,
        _now: Nanos,
        _rng: &mut dyn RngCore,
        _out: &mut Vec<Spec>,
    ) {
    }
}

/// Hands out token ids that no other request uses (below `2^30`; shared ids live above).
#[derive(Clone, Debug, Default)]
pub struct UniqueTokens {
    next: u32,
}

impl UniqueTokens {
    /// Ids from `next` on: a second source whose ids the workload's never reach in a run.
    pub fn starting_at(next: u32) -> Self {
        UniqueTokens { next }
    }

    /// Appends `n` fresh ids to `out`.
    pub fn extend(&mut self, out: &mut Vec<u32>, n: u32) {
        out.reserve(n as usize);
        for _ in 0..n {
            out.push(self.next & 0x3fff_ffff);
            self.next = self.next.wrapping_add(1);
        }
    }
}

/// The `i`-th token of shared document `doc` (ids at or above `2^30`).
pub fn shared_token(doc: u32, i: u32) -> u32 {
    0x4000_0000 | ((doc & 0x3fff) << 16) | (i & 0xffff)
}
