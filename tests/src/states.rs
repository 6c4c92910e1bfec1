//! A record of the states a consumer passes through, for tests that assert on its history.
//!
//! The recorder is a task of its own behind the consumer's watch channel, so at any instant it
//! may not yet have seen the newest state: a test that has just watched the consumer become
//! ready cannot read the history at once and expect to find ready in it (CI saw exactly that).
//! [`StateLog::until`] waits, with a deadline, for the history to show what the test already
//! knows happened; only then are the earlier entries asserted on.
//!
//! A watch channel keeps only its newest value, so a state that lasted shorter than the
//! recorder's wake-up can be missing: tests assert on states that last (waiting, stalled,
//! declaring through retries), never on a brief one being absent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf::{Consumer, ConsumerState};

/// How long [`StateLog::until`] waits for the recorder to catch up.
const CATCH_UP: Duration = Duration::from_secs(10);

/// The states one consumer has been seen in, oldest first.
#[derive(Clone)]
pub struct StateLog {
    seen: Arc<Mutex<Vec<ConsumerState>>>,
}

impl StateLog {
    /// Starts recording `consumer`'s states, beginning with its current one.
    pub fn record(consumer: &Consumer) -> Self {
        let seen = Arc::new(Mutex::new(vec![consumer.state()]));
        let mut watch = consumer.watch();
        let sink = seen.clone();
        tokio::spawn(async move {
            while watch.changed().await.is_ok() {
                let state = watch.borrow_and_update().clone();
                sink.lock().unwrap().push(state);
            }
        });
        Self { seen }
    }

    /// The states recorded so far.
    pub fn so_far(&self) -> Vec<ConsumerState> {
        self.seen.lock().unwrap().clone()
    }

    /// The states recorded once `done` holds for them; fails the test naming `what` if the
    /// recorder has not caught up within 10 s.
    pub async fn until(
        &self,
        what: &str,
        done: impl Fn(&[ConsumerState]) -> bool,
    ) -> Vec<ConsumerState> {
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        loop {
            let states = self.so_far();
            if done(&states) {
                return states;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the state recorder never saw {what} within {CATCH_UP:?}: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The states recorded once the consumer has been seen ready.
    pub async fn until_ready(&self) -> Vec<ConsumerState> {
        self.until("the consumer ready", |states| {
            states.iter().any(ConsumerState::is_ready)
        })
        .await
    }
}
