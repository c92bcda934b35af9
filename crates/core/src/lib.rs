//! kvgate's decision core: the request and the fleet as a routing policy sees them, every
//! endpoint-selection rule kvgate offers, and the prefix indexes the cache-aware rules consult.
//!
//! The crate is pure: no I/O, no async, no wall clock and no global random source. Time
//! ([`Nanos`]) and randomness (`&mut dyn RngCore`) are arguments, so the simulator (simulated
//! time, seeded) and the gateway (real time, real sockets) drive the very same code, and a test
//! replays a trace with the same seed to the same decisions.
//!
//! ```
//! use kvgate_core::{router::accept_all, EndpointId, EndpointView, Nanos, PolicyConfig};
//! use kvgate_core::{Decision, Request, Routing};
//!
//! let config = PolicyConfig::default_for("cache_aware").unwrap();
//! let mut routing = Routing::new(&config, 7);
//! for id in 0..2 {
//!     routing.router_mut().add(EndpointView::new(EndpointId(id)));
//! }
//! let first = routing.route(&Request::from_text(1, "You are terse. Hello"), Nanos(0), &accept_all);
//! let again = routing.route(&Request::from_text(2, "You are terse. Hello again"), Nanos(1), &accept_all);
//! assert_eq!(first.endpoint(), again.endpoint(), "the shared prefix stays where it went");
//! assert!(matches!(again, Decision::Route(_)));
//! ```

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cadence;
pub mod decision;
pub mod difficulty;
pub mod disagg;
pub mod dispatch;
pub mod fasthash;
pub mod fleet;
pub mod hashring;
pub mod index;
pub mod load;
pub mod lora;
pub mod policy;
pub mod request;
pub mod resilience;
pub mod router;
pub mod semcache;
pub mod stats;
pub mod tenancy;
mod time;

pub use cadence::Cadence;
pub use decision::{Decision, Event, Reason, Rejection, Route, Usage};
pub use fleet::{EndpointId, EndpointView, Fleet, Health, InflightLedger, Observation};
pub use load::{LoadConfig, LoadView};
pub use policy::{Policy, PolicyConfig, Query};
pub use request::{Priority, Prompt, ReasoningEffort, Request};
pub use router::{Router, Routing};
pub use time::Nanos;
