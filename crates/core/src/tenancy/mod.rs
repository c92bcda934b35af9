//! Sharing a fleet between tenants: who waits ([`FairQueue`], a virtual token counter per tenant
//! with priority classes), how fast a key may spend tokens ([`RateLimiter`], token buckets), and
//! what a request is expected to cost before it runs ([`ChargeModel`]).
//!
//! Pure like the rest of the crate: time comes in as [`crate::Nanos`], so the simulator and the
//! gateway account tenants the same way and tests replay exact timelines.

mod bucket;
mod charge;
mod fair_queue;

pub use bucket::{Exceeded, LimitKind, LimitsConfig, RateLimiter, TokenBucket};
pub use charge::{Charge, ChargeModel, Price, TokenWeights};
pub use fair_queue::{FairQueue, Pushed, TenantDepth, Ticket};
