//! How long a claim loop waits after a fetch that failed or got no answer in time.
//!
//! The poll interval bounds an idle consumer's wait for messages no publish woke it for; it is
//! no measure of how long a store hiccup lasts. A consumer configured to poll rarely (it relies
//! on publish wake-ups) would otherwise stall a whole interval after one slow fetch. The first
//! retry comes after [`FIRST_RETRY`], each further consecutive failure doubles the wait, and
//! the poll interval caps it, so an outage is not hammered and a blip costs milliseconds.

use std::time::Duration;

/// The wait after the first failed fetch of a run of failures.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(50);

/// Consecutive failed fetches of one claim loop.
#[derive(Debug, Default)]
pub(crate) struct FetchRetry {
    failures: u32,
}

impl FetchRetry {
    /// Records a failed fetch; returns how long to wait before the next one.
    pub(crate) fn failed(&mut self, poll_interval: Duration) -> Duration {
        let pause = wharf_queue::doubled(FIRST_RETRY, self.failures, poll_interval);
        self.failures = self.failures.saturating_add(1);
        pause
    }

    /// A fetch got its answer: the next failure starts a new run.
    pub(crate) fn answered(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_retry_up_to_the_poll_interval() {
        let mut retry = FetchRetry::default();
        let hour = Duration::from_secs(3600);
        let pauses: Vec<u128> = (0..4).map(|_| retry.failed(hour).as_millis()).collect();
        assert_eq!(pauses, [50, 100, 200, 400]);
        for _ in 0..60 {
            retry.failed(hour);
        }
        assert_eq!(retry.failed(hour), hour, "capped, never overflowing");
    }

    #[test]
    fn never_waits_longer_than_the_poll_interval() {
        let mut retry = FetchRetry::default();
        let poll = Duration::from_millis(20);
        assert_eq!(retry.failed(poll), poll);
        assert_eq!(retry.failed(poll), poll);
    }

    #[test]
    fn an_answer_starts_a_new_run() {
        let mut retry = FetchRetry::default();
        let hour = Duration::from_secs(3600);
        retry.failed(hour);
        retry.failed(hour);
        retry.answered();
        assert_eq!(retry.failed(hour), FIRST_RETRY);
    }
}
