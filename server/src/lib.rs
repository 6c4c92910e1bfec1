//! The `wharf` service: the command line, the layered configuration file, the supervisor that
//! runs the MQTT sessions and applies reloads, and the HTTP server. `main.rs` only parses the
//! command line and runs it.
//!
//! Architecture invariant: everything that reads a file, the environment or the command line
//! lives here; the library (`wharf`) and the sessions (`wharf-sessions`) are handed typed
//! settings. This crate decides nothing about bindings, filters or leases: it wires the crates
//! that do.

// The command line's doc comments are its help text (clap derive); its subcommand wrappers'
// fields and enums carry none by design.
#[allow(missing_docs)]
pub mod cli;
pub mod config;
pub mod error;
pub mod supervisor;

pub use config::Config;
pub use error::ServerError;
