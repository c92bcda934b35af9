//! kvgate's one definition of each figure its reports compare: the percentile of a sample, an
//! SLO's attainment and goodput, and a target's capacity over a rate sweep. The simulator
//! (`kvgate sim`), the benchmark (`kvgate bench`), the load generators and the hedging delay all
//! use these, and the scripts read the numbers from their JSON, so a figure means the same
//! wherever it is printed.
//!
//! What cannot be computed (a percentile of nothing, the attainment of no requests, a capacity
//! no swept rate reached) is `None`, never 0: a 0 would read as a measurement.

mod capacity;
mod percentile;
mod slo;

pub use capacity::{capacity, Capacity};
pub use percentile::{percentile, summary, Summary};
pub use slo::{Attainment, Slo};
