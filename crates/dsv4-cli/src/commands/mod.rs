//! One module per command group; each exposes clap argument structs and a `run`-style function.

pub mod ab;
pub mod bench;
pub mod chat;
pub mod diff;
pub mod forward;
pub mod generate;
pub mod kernels;
pub mod ledger;
pub mod model;
pub mod plan;
pub mod profile;
pub mod serve;
pub mod stress;
