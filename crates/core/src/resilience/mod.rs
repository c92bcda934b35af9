//! Resilience state machines the gateway drives on real time and the simulator on simulated
//! time: a sliding-window counter, a retry budget, a per-endpoint circuit breaker, exponential
//! backoff with full jitter, a hedging delay taken from observed TTFTs, and the per-request
//! attempt machine that combines them.
//!
//! Like the policies they are pure: time ([`crate::Nanos`]) and randomness are arguments, so a
//! test drives them through a scripted timeline and the same seed replays the same waits.

pub mod attempts;
pub mod backoff;
pub mod breaker;
pub mod hedge;
pub mod retry_budget;
pub mod window;

pub use attempts::{Attempts, Denied, Next, Outcome};
pub use backoff::Backoff;
pub use breaker::{Breaker, BreakerConfig, BreakerState, BreakerView, Ticket};
pub use hedge::{HedgeConfig, HedgeDelay};
pub use retry_budget::{RetryBudget, RetryBudgetConfig};
pub use window::WindowCounter;
