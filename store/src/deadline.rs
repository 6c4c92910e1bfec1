//! Deadlines on store calls that stop the waiting, not the work (ADR 0068).
//!
//! A store call cut off by `tokio::time::timeout` is dropped where it stands: on Postgres its
//! connection goes back to the sqlx pool with a statement still running in the server. sqlx
//! 0.8.6 checks such a connection with a round trip before pooling it again, and when the
//! abandoned statement then ends in an error (a `statement_timeout`, a `lock_timeout`, a
//! deadlock, a cancel) the check never finishes: the connection stays counted in the pool's
//! size, idle in the server, and is never handed out again. Reproduced here; a pool loses one
//! connection per such call until every later acquire times out.
//!
//! [`Finishing`] wraps such a call so that it is never dropped half-way: it is polled in
//! place, on the caller's task, and if the caller lets go of it before it answered (a
//! deadline, a `select!` that took another branch, a cancelled caller) the rest of the call
//! is handed to a task of its own and runs to its end, success or error, its connection
//! returned the ordinary way. [`finish_within`] and [`finish_by`] are the deadlines built on
//! it. The common path (an answer in time) costs one allocation, no task. Work the caller
//! gave up on may still take effect afterwards, as a statement the server had already
//! received did before.
//!
//! Wrap one unit of work on one connection (a statement, a transaction), not a sequence of
//! them: past the deadline the unit in flight should end, not the sequence go on to start new
//! work nobody waits for (a claim whose messages nobody handles, ADR 0068).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The deadline passed before the call answered; the call goes on in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct Unanswered(pub Duration);

/// A store call that finishes even when its caller stops waiting for it (see the module).
#[must_use = "a future does nothing unless polled"]
pub struct Finishing<F>
where
    F: Future + Send + 'static,
{
    call: Option<Pin<Box<F>>>,
}

impl<F> Finishing<F>
where
    F: Future + Send + 'static,
{
    /// Wraps `call`.
    pub fn new(call: F) -> Self {
        Self {
            call: Some(Box::pin(call)),
        }
    }
}

impl<F> Future for Finishing<F>
where
    F: Future + Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let call = self
            .call
            .as_mut()
            .expect("a Finishing call is not polled after it answered");
        let answer = call.as_mut().poll(cx);
        if answer.is_ready() {
            self.call = None;
        }
        answer
    }
}

impl<F> Drop for Finishing<F>
where
    F: Future + Send + 'static,
{
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // Outside a runtime (its shutdown) there is nothing left to run the call on.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = call.await;
            });
        }
    }
}

/// Waits for `call` at most `deadline`; past it the call goes on to its end unobserved
/// ([`Finishing`]). A panic in the call is raised here while the caller waits.
pub async fn finish_within<T, F>(deadline: Duration, call: F) -> Result<T, Unanswered>
where
    F: Future<Output = T> + Send + 'static,
{
    tokio::time::timeout(deadline, Finishing::new(call))
        .await
        .map_err(|_| Unanswered(deadline))
}

/// [`finish_within`] with the deadline given as an instant.
pub async fn finish_by<T, F>(deadline: tokio::time::Instant, call: F) -> Result<T, Unanswered>
where
    F: Future<Output = T> + Send + 'static,
{
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    tokio::time::timeout_at(deadline, Finishing::new(call))
        .await
        .map_err(|_| Unanswered(left))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_time_is_returned() {
        let answer = finish_within(Duration::from_secs(1), async { 7 }).await;
        assert_eq!(answer, Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_call_is_unanswered_and_still_runs_to_its_end() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let (done, ended) = tokio::sync::oneshot::channel();
        let answer = finish_within(Duration::from_secs(1), async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
            let _ = done.send(());
        })
        .await;
        assert_eq!(answer, Err(Unanswered(Duration::from_secs(1))));
        assert!(!finished.load(Ordering::SeqCst));
        ended
            .await
            .expect("the call ran to its end after the deadline");
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_past_still_lets_the_call_finish() {
        let (done, ended) = tokio::sync::oneshot::channel();
        let past = tokio::time::Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let answer = finish_by(past, async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = done.send(());
        })
        .await;
        assert_eq!(answer, Err(Unanswered(Duration::ZERO)));
        ended.await.expect("the call ran to its end");
    }

    #[tokio::test]
    async fn an_answer_in_time_is_polled_on_the_caller_s_own_task() {
        let (caller, answered_on) = tokio::spawn(async {
            let caller = tokio::task::id();
            let answered_on = finish_within(Duration::from_secs(5), async { tokio::task::id() })
                .await
                .expect("answered");
            (caller, answered_on)
        })
        .await
        .expect("the caller's task");
        assert_eq!(answered_on, caller);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_a_select_let_go_of_still_runs_to_its_end() {
        let (done, ended) = tokio::sync::oneshot::channel();
        let call = Finishing::new(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _ = done.send(());
        });
        tokio::select! {
            () = call => panic!("the call answered before the other branch"),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        ended
            .await
            .expect("the call ran to its end after the select let go of it");
    }

    #[tokio::test]
    #[should_panic(expected = "the call's own panic")]
    async fn a_panic_in_the_call_reaches_the_caller() {
        let _ = finish_within(Duration::from_secs(5), async {
            panic!("the call's own panic");
        })
        .await;
    }
}
