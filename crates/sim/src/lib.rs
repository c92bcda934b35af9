//! kvgate's fleet simulator: a fast, deterministic discrete-event model of LLM replicas behind one
//! or more routers running kvgate-core's policies, and the reference experiments built on it
//! (routing lab, staleness lab, prefix player, batching demo:
//! docs/background.md#the-reference-experiments), plus agentic sessions and capacity sweeps.
//!
//! - [`model`]: the engine at iteration granularity, shared with the emulated engine;
//! - [`workload`]: arrivals and prompts;
//! - [`fleet`]: replicas, routers and the event loop;
//! - [`scenario`]: the named experiments and their reports.

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod dist;
pub mod fleet;
pub mod model;
pub mod scenario;
pub mod workload;
