//! Why a handler gave a message back: the text the log stores with the message as its last
//! error. Shared by the consumer runtime's handlers and the MQTT sessions' ingest handlers, so
//! both speak of a failed message the same way.

use std::error::Error as StdError;
use std::fmt;

/// Why a handler gave a message back: a message stored with the message as its last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    message: String,
}

impl HandlerError {
    /// An error with the given text.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// An error describing `error` and its chain of sources (`outer: inner: root`).
    pub fn from_error(error: impl StdError) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self { message }
    }

    /// The text recorded with the message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for HandlerError {}

impl From<String> for HandlerError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl From<Box<dyn StdError + Send + Sync>> for HandlerError {
    fn from(error: Box<dyn StdError + Send + Sync>) -> Self {
        Self::from_error(&*error)
    }
}

/// Turns any `Result` with a standard error into a handler result, so `?` works inside a
/// handler: `serde_json::from_slice(&message.payload).handler_err()?`.
pub trait HandlerResultExt<T> {
    /// Maps the error with [`HandlerError::from_error`].
    fn handler_err(self) -> Result<T, HandlerError>;
}

impl<T, E: StdError> HandlerResultExt<T> for Result<T, E> {
    fn handler_err(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::from_error)
    }
}
