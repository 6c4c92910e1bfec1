//! The renewal loop of a lease holder: the tokio edge around the sans-IO [`Renewer`].
//!
//! It sleeps until the renewer's next wakeup, sends the renew it asks for (at most one in
//! flight, bounded by the local deadline: a renew that has not answered by then is a failure),
//! feeds the outcome back, and returns when the renewer steps down. Time is tokio's, so the
//! loop runs under paused time in its tests, where every step lands at an exact instant.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use wharf_domain::lease::{LeaseTiming, RenewOutcome, Renewer, RenewerAction, StepDownReason};

/// Renews through `renew` from `epoch` (when the Acquire was sent) until the renewer steps
/// down; returns why.
pub(super) async fn renew_until_step_down<F, Fut>(
    timing: LeaseTiming,
    epoch: Instant,
    mut renew: F,
) -> StepDownReason
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RenewOutcome>,
{
    let mut renewer = Renewer::start(timing, Duration::ZERO);
    let mut next: Option<RenewerAction> = None;
    loop {
        let action = match next.take() {
            Some(action) => action,
            None => {
                let Some(wake) = renewer.next_wakeup() else {
                    return stepped_down(&renewer);
                };
                tokio::time::sleep_until(epoch + wake).await;
                match renewer.tick(epoch.elapsed()) {
                    Some(action) => action,
                    None => continue,
                }
            }
        };
        if let RenewerAction::StepDown { reason } = action {
            return reason;
        }
        let until = epoch + renewer.local_deadline();
        let outcome = tokio::time::timeout_at(until, renew())
            .await
            .unwrap_or_else(|_| RenewOutcome::Failed("the renew did not answer in time".into()));
        // The outcome may ask for the next renew at once (a failure late in the interval) or
        // step down.
        next = renewer.outcome(epoch.elapsed(), outcome);
    }
}

fn stepped_down(renewer: &Renewer) -> StepDownReason {
    renewer
        .stepped_down()
        .cloned()
        .unwrap_or(StepDownReason::DeadlineMissed {
            since_success: Duration::ZERO,
            last_error: None,
        })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use wharf_domain::lease::{FencingToken, LeaseHolder, Staleness};

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// Runs the loop with the default timing (45 s / 6 s / 30 s) and `outcome(n)` as the n-th
    /// renew's answer (`None`: it never answers); returns why and when it stepped down, and
    /// the instants (since the start) the renews were sent at.
    async fn run(
        outcome: impl Fn(usize) -> Option<RenewOutcome>,
    ) -> (StepDownReason, Duration, Vec<Duration>) {
        let epoch = Instant::now();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let count = AtomicUsize::new(0);
        let reason = renew_until_step_down(LeaseTiming::default(), epoch, || {
            let n = count.fetch_add(1, Ordering::SeqCst);
            sent.lock().unwrap().push(epoch.elapsed());
            let answer = outcome(n);
            async move {
                match answer {
                    Some(answer) => answer,
                    None => std::future::pending().await,
                }
            }
        })
        .await;
        let sent = sent.lock().unwrap().clone();
        (reason, epoch.elapsed(), sent)
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_interval_and_holds_while_they_succeed() {
        let loop_ = run(|_| Some(RenewOutcome::Renewed));
        let held = tokio::time::timeout(450 * SECOND, loop_).await;
        assert!(held.is_err(), "still holding after ten TTLs of successes");
    }

    #[tokio::test(start_paused = true)]
    async fn failing_renews_step_down_exactly_at_the_renew_deadline() {
        let (reason, at, sent) = run(|_| Some(RenewOutcome::Failed("store down".into()))).await;
        assert_eq!(
            at,
            30 * SECOND,
            "the deadline counts from the Acquire's send"
        );
        assert_eq!(sent, [6, 12, 18, 24].map(|s| s * SECOND));
        match reason {
            StepDownReason::DeadlineMissed { last_error, .. } => {
                assert_eq!(last_error.as_deref(), Some("store down"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_renew_that_never_answers_steps_down_at_the_deadline() {
        let (reason, at, sent) = run(|n| (n > 0).then_some(RenewOutcome::Renewed)).await;
        assert_eq!(sent, [6 * SECOND], "one renew in flight at most");
        assert_eq!(at, 30 * SECOND);
        assert!(
            matches!(reason, StepDownReason::DeadlineMissed { .. }),
            "{reason:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_definitive_loss_steps_down_at_once() {
        let lost = Staleness::HeldByOther {
            current: LeaseHolder::parse("holder", "other:1").unwrap(),
            token: FencingToken(2),
        };
        let answer = lost.clone();
        let (reason, at, sent) = run(move |n| {
            Some(if n < 2 {
                RenewOutcome::Renewed
            } else {
                RenewOutcome::Lost(answer.clone())
            })
        })
        .await;
        assert_eq!(sent, [6, 12, 18].map(|s| s * SECOND));
        assert_eq!(at, 18 * SECOND);
        assert_eq!(reason, StepDownReason::Lost(lost));
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_after_failures_moves_the_deadline_from_its_send() {
        // Fails at 6, 12, 18; succeeds at 24: the deadline becomes 24 + 30 = 54, and renews go
        // on every 6 s from the success's send.
        let (_, at, sent) = run(|n| {
            Some(match n {
                0..=2 => RenewOutcome::Failed("blip".into()),
                3 => RenewOutcome::Renewed,
                _ => RenewOutcome::Failed("down again".into()),
            })
        })
        .await;
        assert_eq!(sent, [6, 12, 18, 24, 30, 36, 42, 48].map(|s| s * SECOND));
        assert_eq!(at, 54 * SECOND);
    }
}
