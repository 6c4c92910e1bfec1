//! What a consumer runs for each message it claims.
//!
//! A [`Handler`] gets the claimed message and returns `Ok` to acknowledge it or a
//! [`HandlerError`] to give it back: the error text is stored with the message, which is retried
//! after a backoff and dead-lettered once it has used its attempts. A handler that panics is
//! treated as one that failed. Delivery is at least once, so handlers should be idempotent.
//!
//! Plain async closures become handlers through [`handler_fn`]:
//!
//! ```
//! use wharf::handler::{handler_fn, HandlerError};
//! use wharf::queue::Claimed;
//!
//! let handler = handler_fn(|message: Claimed| async move {
//!     let text = std::str::from_utf8(&message.payload).map_err(HandlerError::from_error)?;
//!     if text.is_empty() {
//!         return Err("empty payload".into());
//!     }
//!     Ok(())
//! });
//! # let _ = handler;
//! ```

use std::fmt;
use std::future::Future;

use std::sync::Arc;

use async_trait::async_trait;
use wharf_queue::Claimed;
pub use wharf_queue::{HandlerError, HandlerResultExt};

/// Processes one claimed message. `Ok` acknowledges it; `Err` gives it back for a retry.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `message`. Runs concurrently with other calls, up to the consumer's
    /// `queue.concurrency`.
    async fn handle(&self, message: &Claimed) -> Result<(), HandlerError>;
}

/// A shared handler is a handler too, so one `Arc<dyn Handler>` can serve several consumers.
#[async_trait]
impl<H: Handler + ?Sized> Handler for Arc<H> {
    async fn handle(&self, message: &Claimed) -> Result<(), HandlerError> {
        self.as_ref().handle(message).await
    }
}

/// A [`Handler`] made from an async function of the claimed message; see [`handler_fn`].
#[derive(Clone)]
pub struct HandlerFn<F> {
    function: F,
}

impl<F> fmt::Debug for HandlerFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HandlerFn")
    }
}

/// Wraps an async function or closure taking the claimed message (an owned copy) as a
/// [`Handler`].
pub fn handler_fn<F, Fut>(function: F) -> HandlerFn<F>
where
    F: Fn(Claimed) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    HandlerFn { function }
}

#[async_trait]
impl<F, Fut> Handler for HandlerFn<F>
where
    F: Fn(Claimed) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, message: &Claimed) -> Result<(), HandlerError> {
        (self.function)(message.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("could not store the order")
        }
    }

    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_keeps_its_source_chain() {
        let error = Outer(std::io::Error::other("disk full"));
        assert_eq!(
            HandlerError::from_error(error).message(),
            "could not store the order: disk full"
        );
        let parsed: Result<u8, _> = "x".parse::<u8>();
        assert!(parsed
            .handler_err()
            .unwrap_err()
            .message()
            .contains("invalid digit"));
        assert_eq!(HandlerError::from("nope").to_string(), "nope");
        assert_eq!(HandlerError::from(String::from("nope")).message(), "nope");
    }
}
