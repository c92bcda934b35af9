//! kvgate's fleet simulator: an iteration-level engine model ([`model`]), shared with the
//! emulated engine.

pub mod model;
