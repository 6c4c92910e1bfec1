//! The library's settings: the three sections of the configuration that an embedded Wharf
//! reads (`store`, `declarations`, `queue`), with their defaults and their checks.
//!
//! The `wharf` server's configuration file carries these sections beside its own (HTTP, log,
//! MQTT, lease, prune); it layers a file, the environment and flags into them. The library
//! itself reads no file and no environment: an application builds a [`Settings`] (or
//! deserializes one with serde) and passes it to [`crate::Wharf::open`].

use serde::{Deserialize, Serialize};

use crate::error::WharfError;

mod declarations;
mod queue;
mod retention;
mod store;

pub use declarations::DeclarationConfig;
pub use queue::QueueConfig;
pub use retention::{check_retention, parse_retention, MAX_RETENTION, RETENTION_FORMAT};
pub use store::StoreConfig;

/// What [`crate::Wharf::open`] reads: where the ledger lives, how declarations retry and how
/// liveness is judged, and how the message log is claimed and retained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Where the ledger lives.
    pub store: StoreConfig,
    /// How declarations retry and how liveness is judged.
    pub declarations: DeclarationConfig,
    /// The message log: claims, retries, the consumer runtime and log retention.
    pub queue: QueueConfig,
}

impl Settings {
    /// Checks every key; the error names the key and the value.
    pub fn validate(&self) -> Result<(), WharfError> {
        self.declarations.validate()?;
        self.store.validate()?;
        self.queue.validate()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_defaults_pass_their_own_checks() {
        Settings::default().validate().unwrap();
    }

    #[test]
    fn store_calls_of_a_consumer_get_a_third_of_the_ttl() {
        let defaults = DeclarationConfig::default();
        assert_eq!(defaults.call_deadline(), Duration::from_secs(10));
        let broken = DeclarationConfig {
            instance_ttl: Duration::ZERO,
            ..defaults
        };
        assert_eq!(broken.call_deadline(), Duration::from_millis(1));
    }

    #[test]
    fn settings_refuse_unknown_keys_by_name() {
        let err = serde_json::from_str::<Settings>(r#"{"http": {}}"#).unwrap_err();
        assert!(err.to_string().contains("http"), "{err}");
    }
}
