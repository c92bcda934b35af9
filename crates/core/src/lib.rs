//! kvgate's decision core: the request and the fleet as a routing policy sees them, every
//! endpoint-selection rule kvgate offers, and the prefix indexes the cache-aware rules consult.
//!
//! The crate is pure: no I/O, no async, no wall clock and no global random source. Time
//! ([`Nanos`]) and randomness (`&mut dyn RngCore`) are arguments, so the simulator (simulated
//! time, seeded) and the gateway (real time, real sockets) drive the very same code, and a test
//! replays a trace with the same seed to the same decisions.
//!
//! ```
//! use kvgate_core::{policy, EndpointView, EndpointId, Nanos, Request, Decision};
//! use rand::SeedableRng;
//!
//! let mut policy = policy::PolicyConfig::default_for("least_outstanding").unwrap().build();
//! let fleet = vec![EndpointView::new(EndpointId(0)), EndpointView::new(EndpointId(1))];
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
//! let decision = policy.select(&Request::from_text(1, "hello"), &fleet, Nanos::ZERO, &mut rng);
//! assert!(matches!(decision, Decision::Route(_)));
//! ```

pub mod decision;
pub mod fleet;
pub mod hashring;
pub mod index;
pub mod load;
pub mod policy;
pub mod request;
pub mod resilience;
mod time;

pub use decision::{Decision, Event, Reason, Rejection, Route};
pub use fleet::{EndpointId, EndpointView, Health, InflightLedger, Observation};
pub use load::{LoadConfig, LoadView};
pub use policy::{Policy, PolicyConfig};
pub use request::{Priority, Prompt, ReasoningEffort, Request};
pub use time::Nanos;
