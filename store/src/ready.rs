//! Running logic written once over both backends on SQLite's synchronous connection.
//!
//! Logic shared by the backends is written as `async` code over a dialect trait (ADR 0078).
//! Postgres's dialect awaits its statements; SQLite's runs each statement on the connection a
//! `read`/`write` closure holds and so completes at once. [`run_ready`] drives such a future to
//! its end inside the closure: one poll, no executor.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use crate::StoreError;

/// Runs `work`, whose every await completes at once, to its end on this thread. A future that
/// would wait is a bug of its dialect: reported as [`StoreError::Task`], never a hang.
pub fn run_ready<T, E: From<StoreError>>(work: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    let mut work = pin!(work);
    match work.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(done) => done,
        Poll::Pending => Err(StoreError::Task(
            "logic run on a SQLite connection waited: its statements must complete at once".into(),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_future_that_completes_at_once_gives_its_output() {
        assert_eq!(run_ready(async { Ok::<_, StoreError>(3) }).unwrap(), 3);
    }

    #[test]
    fn a_future_that_waits_is_an_error_not_a_hang() {
        let waits = std::future::pending::<Result<(), StoreError>>();
        assert!(matches!(run_ready(waits), Err(StoreError::Task(_))));
    }
}
