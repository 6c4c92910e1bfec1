//! The server crate's one error type: the library's and the sessions' errors, and a
//! configuration that does not load.

use wharf::WharfError;
use wharf_sessions::SessionError;

/// Anything loading the configuration, supervising sessions or reloading can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable; names the key (and, for a layer, where it came from).
    #[error("configuration: {0}")]
    Config(String),
    /// The embedded library failed (the store, the queue, a declaration).
    #[error(transparent)]
    Wharf(WharfError),
    /// A managed MQTT session could not be started, seeded or planned.
    #[error(transparent)]
    Sessions(SessionError),
}

impl From<WharfError> for ServerError {
    /// A configuration error stays [`ServerError::Config`], whichever layer refused it.
    fn from(e: WharfError) -> Self {
        match e {
            WharfError::Config(why) => Self::Config(why),
            other => Self::Wharf(other),
        }
    }
}

impl From<SessionError> for ServerError {
    /// A configuration error stays [`ServerError::Config`], whichever layer refused it.
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Config(why) => Self::Config(why),
            other => Self::Sessions(other),
        }
    }
}
