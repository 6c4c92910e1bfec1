//! The sessions' settings: the `mqtt` section (the sessions, their subscriptions and timings)
//! and the `lease` section (the HA lease of exclusive sessions), as the `wharf` server's
//! configuration file carries them. Each type checks itself and names the key it refuses.

mod lease;
mod mqtt;

pub use lease::LeaseConfig;
pub use mqtt::{
    ClientIdSuffix, MqttConfig, ReloadStrategy, ResolvedSession, SessionConfig, SubscriptionConfig,
    TlsFiles,
};
