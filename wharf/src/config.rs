//! The library's settings: the three sections of the configuration that an embedded Wharf
//! reads (`store`, `declarations`, `queue`), with their defaults and their checks.
//!
//! The `wharf` server's configuration file carries these sections beside its own (HTTP, log,
//! MQTT, lease, prune); it layers a file, the environment and flags into them. The library
//! itself reads no file and no environment: an application builds a [`Settings`] (or
//! deserializes one with serde) and passes it to [`crate::Wharf::open`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::WharfError;

mod declarations;
mod queue;
mod store;

pub use declarations::DeclarationConfig;
pub use queue::QueueConfig;
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

/// The longest retention accepted (100 years of 365.25 days): a cutoff further back than this
/// is not a retention but a mistake, and could leave the store's time range.
pub const MAX_RETENTION: Duration = Duration::from_secs(100 * 31_557_600);

/// What a retention accepts, for error messages.
pub const RETENTION_FORMAT: &str =
    "a duration such as 90s, 15m, 24h or 7d (units s, m, h, d, w, months, years), at most 100 years";

/// Refuses a retention above [`MAX_RETENTION`], naming `key`.
pub fn check_retention(key: &str, value: Duration) -> Result<(), WharfError> {
    if value > MAX_RETENTION {
        return Err(WharfError::Config(format!(
            "{key} must be at most 100 years, got {}",
            humantime::format_duration(value)
        )));
    }
    Ok(())
}

/// Parses a retention flag (`--retention 7d`): humantime, at most [`MAX_RETENTION`]; the error
/// names the accepted formats and bounds.
pub fn parse_retention(text: &str) -> Result<Duration, String> {
    let value =
        humantime::parse_duration(text).map_err(|e| format!("{e}: expected {RETENTION_FORMAT}"))?;
    if value > MAX_RETENTION {
        return Err(format!("expected {RETENTION_FORMAT}"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
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
    fn retention_flags_name_the_format_and_the_bound() {
        assert!(parse_retention("99999999999years").is_err());
        assert!(parse_retention("forever").unwrap_err().contains("7d"));
        assert_eq!(parse_retention("7d"), Ok(Duration::from_secs(7 * 86_400)));
        let err = check_retention("queue.retention", MAX_RETENTION * 2).unwrap_err();
        assert!(err.to_string().contains("queue.retention"), "{err}");
    }

    #[test]
    fn settings_refuse_unknown_keys_by_name() {
        let err = serde_json::from_str::<Settings>(r#"{"http": {}}"#).unwrap_err();
        assert!(err.to_string().contains("http"), "{err}");
    }
}
