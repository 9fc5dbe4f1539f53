//! What a node carries from one step to the next, below the strategies and the run: its
//! parameters as one flat buffer ([`params`]), the state a strategy keeps between steps as
//! typed records ([`fields`], [`record!`](crate::record)) written into named values
//! ([`record`]), and its random streams ([`rng`], [`Dropout`]).
//!
//! Uses only [`crate::error`] and Burn.

mod dropout;
pub mod fields;
pub mod params;
pub mod record;
pub mod rng;

pub use dropout::Dropout;
pub use params::{ParamEntry, ParamLayout};
pub use record::StateDict;
