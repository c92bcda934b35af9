//! LoRA adapters: what an engine says of the adapters in its batch, and how much a request for
//! one adapter should prefer one engine over another.
//!
//! An engine batches at most `max_loras` distinct adapters (vLLM `--max-loras`, default 1;
//! SGLang `--max-loras-per-batch`, default 8). vLLM's scheduler skips a waiting request whose
//! adapter would make one adapter too many in the running batch, so that request waits until
//! every running request of some other adapter has finished, while requests for the adapters
//! already running keep being admitted past it (vLLM `v1/core/sched/scheduler.py`, the
//! `max_loras` check). An adapter not yet in memory is loaded first. So the place a request for
//! an adapter should go is, in order (llm-d's `lora-affinity-scorer`: 1.0, 0.8, 0.6, 0):
//! where the adapter is running, where a slot is free, where the adapter is already queued, and
//! last where every slot is taken by other adapters.

use serde::{Deserialize, Serialize};

mod gate;
mod outlook;

pub use gate::{GateConfig, Hold, LoraGate, Pass, Report, Verdict};
pub use outlook::Outlook;

/// One engine's adapters, from vLLM's `vllm:lora_requests_info` gauge (labels `max_lora`,
/// `running_lora_adapters`, `waiting_lora_adapters`) or SGLang's `sglang:lora_pool_slots_used` /
/// `sglang:lora_pool_slots_total`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterState {
    /// Distinct adapters one batch may hold, when the engine reports it.
    pub max_loras: Option<u32>,
    /// Adapters of the requests in the running batch.
    pub running: Vec<String>,
    /// Adapters of the queued requests.
    pub waiting: Vec<String>,
    /// Adapter slots in use when the engine reports only a count (SGLang's pool), not names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_used: Option<u32>,
    /// Adapters that ran when the engine last had work: with nothing running or waiting now they
    /// are still loaded, so a request for one starts at once (llm-d keeps the last non-idle
    /// report for the same reason).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<String>,
}

/// Where a request for an adapter stands on one engine, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Affinity {
    /// The adapter runs in the batch there: the request joins it at once.
    Running,
    /// A batch slot is free for another adapter: the request waits only for the adapter to load.
    FreeSlot,
    /// The adapter is queued there: it will run when a slot frees, along with this request.
    Waiting,
    /// Every slot holds another adapter: the request waits for one of them to drain, then loads.
    Full,
    /// The engine reports nothing of its adapters.
    Unknown,
}

impl Affinity {
    /// llm-d's `lora-affinity-scorer` weight of this standing (higher better; `Unknown` scores
    /// as a free slot, the neutral guess).
    pub fn llm_d_score(self) -> f64 {
        match self {
            Affinity::Running => 1.0,
            Affinity::FreeSlot | Affinity::Unknown => 0.8,
            Affinity::Waiting => 0.6,
            Affinity::Full => 0.0,
        }
    }
}

impl AdapterState {
    /// Distinct adapters running or waiting (llm-d counts both against `max_lora`).
    fn active(&self) -> usize {
        let mut all: Vec<&str> = self
            .running
            .iter()
            .chain(&self.waiting)
            .map(String::as_str)
            .collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }

    /// Where a request for `adapter` stands here (llm-d's order; a free slot needs running
    /// plus waiting adapters below `max_loras`, as llm-d counts it).
    pub fn affinity(&self, adapter: &str) -> Affinity {
        let idle = self.running.is_empty() && self.waiting.is_empty();
        if self.running.iter().any(|a| a == adapter)
            || (idle && self.recent.iter().any(|a| a == adapter))
        {
            return Affinity::Running;
        }
        let Some(max) = self.max_loras else {
            return Affinity::Unknown;
        };
        let used = self
            .slots_used
            .map_or_else(|| self.active(), |u| u as usize);
        if used < max as usize {
            Affinity::FreeSlot
        } else if self.waiting.iter().any(|a| a == adapter) {
            Affinity::Waiting
        } else {
            Affinity::Full
        }
    }

    /// Whether one more adapter would take the last free slot here.
    pub fn last_slot(&self) -> bool {
        let Some(max) = self.max_loras else {
            return false;
        };
        let used = self
            .slots_used
            .map_or_else(|| self.active(), |u| u as usize);
        used + 1 >= max as usize
    }

    /// Whether other adapters wait here that the running batch keeps out: an adapter waits
    /// while not running and every slot is taken.
    pub fn stalled(&self) -> bool {
        let Some(max) = self.max_loras else {
            return false;
        };
        let mut running: Vec<&str> = self.running.iter().map(String::as_str).collect();
        running.sort_unstable();
        running.dedup();
        running.len() >= max as usize && self.waiting.iter().any(|w| !self.running.contains(w))
    }
}

/// What a request for an adapter is predicted to wait, beyond its queue, on an engine where it
/// stands at `affinity`: `load` to bring a missing adapter in, `stall` for the batch of another
/// adapter to drain. A request that joins a running adapter while other adapters are stalled
/// there delays them by its own run, so it carries half a stall as an externality: that is
/// what lets a stalled adapter's engine drain.
pub fn wait_seconds(affinity: Affinity, stalled: bool, load: f64, stall: f64) -> f64 {
    match affinity {
        Affinity::Running if stalled => stall / 2.0,
        Affinity::Running | Affinity::Unknown => 0.0,
        Affinity::FreeSlot => load,
        Affinity::Waiting => stall,
        Affinity::Full => stall + load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(max: u32, running: &[&str], waiting: &[&str]) -> AdapterState {
        AdapterState {
            max_loras: Some(max),
            running: running.iter().map(|s| (*s).to_owned()).collect(),
            waiting: waiting.iter().map(|s| (*s).to_owned()).collect(),
            slots_used: None,
            recent: Vec::new(),
        }
    }

    #[test]
    fn affinity_follows_llm_d_s_order() {
        let one = state(1, &["a"], &["b"]);
        assert_eq!(one.affinity("a"), Affinity::Running);
        assert_eq!(one.affinity("b"), Affinity::Waiting);
        assert_eq!(one.affinity("c"), Affinity::Full);
        assert!(one.stalled());
        let two = state(2, &["a"], &[]);
        assert_eq!(two.affinity("c"), Affinity::FreeSlot);
        assert!(!two.stalled());
        assert_eq!(AdapterState::default().affinity("a"), Affinity::Unknown);
        let idle = AdapterState {
            recent: vec!["a".into()],
            ..state(1, &[], &[])
        };
        assert_eq!(idle.affinity("a"), Affinity::Running, "still loaded");
        assert_eq!(idle.affinity("b"), Affinity::FreeSlot);
        let counted = AdapterState {
            slots_used: Some(8),
            ..state(8, &[], &[])
        };
        assert_eq!(counted.affinity("x"), Affinity::Full);
        let scores: Vec<f64> = [
            Affinity::Running,
            Affinity::FreeSlot,
            Affinity::Waiting,
            Affinity::Full,
        ]
        .map(Affinity::llm_d_score)
        .to_vec();
        assert_eq!(scores, [1.0, 0.8, 0.6, 0.0]);
    }

    #[test]
    fn waits_grow_with_the_standing() {
        let w = |a, s| wait_seconds(a, s, 0.2, 1.0);
        assert_eq!(w(Affinity::Running, false), 0.0);
        assert_eq!(w(Affinity::FreeSlot, false), 0.2);
        assert_eq!(w(Affinity::Waiting, false), 1.0);
        assert_eq!(w(Affinity::Full, false), 1.2);
        assert_eq!(w(Affinity::Running, true), 0.5);
    }
}
