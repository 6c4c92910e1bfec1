//! The store's clock as this process last heard it (ADR 0052).
//!
//! A speculative attempt decides without reading, so it has no store time of its own: it takes
//! the time the store reported in its newest answer (a read's snapshot or a speculative
//! write's reply) plus the time elapsed on this host's monotonic clock since that answer
//! arrived. The store sampled the time before answering, so the estimate trails the store's
//! clock by about one network trip while the two clocks run at the same rate; the write
//! refuses an estimate ahead of the store's clock (drift), and an answer older than
//! [`StoreClock::MAX_AGE`] is not used (a host clock that stopped, say while suspended). Two
//! answers can arrive out of order, so the estimate may step back by the difference of their
//! trips: the caller keeps its own aggregate's times in order ([`crate::Assumed::not_before`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

/// The newest store time heard, and when.
#[derive(Debug, Default)]
pub(super) struct StoreClock(Mutex<Option<(DateTime<Utc>, Instant)>>);

impl StoreClock {
    /// How old an answer may be for the estimate to be used.
    pub(super) const MAX_AGE: Duration = Duration::from_secs(1);

    /// Records that the store's clock read `store_time` in an answer that has just arrived.
    pub(super) fn heard(&self, store_time: DateTime<Utc>) {
        let arrived = Instant::now();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((store_time, arrived));
    }

    /// The store's time now, estimated from the newest answer; `None` without an answer in the
    /// last [`StoreClock::MAX_AGE`]. In whole microseconds, the store's precision.
    pub(super) fn estimate(&self) -> Option<DateTime<Utc>> {
        let now = Instant::now();
        let heard = *self.0.lock().unwrap_or_else(|p| p.into_inner());
        let anchor = heard?;
        if now.duration_since(anchor.1) > Self::MAX_AGE {
            return None;
        }
        Some(extrapolate(anchor, now))
    }
}

/// The store time `anchor` implies at `at`, truncated to microseconds.
fn extrapolate(anchor: (DateTime<Utc>, Instant), at: Instant) -> DateTime<Utc> {
    let elapsed = TimeDelta::from_std(at.saturating_duration_since(anchor.1)).unwrap_or_default();
    let time = anchor.0 + elapsed;
    time.duration_trunc(TimeDelta::microseconds(1))
        .unwrap_or(time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_follows_the_host_clock_from_the_newest_answer() {
        let clock = StoreClock::default();
        assert_eq!(clock.estimate(), None, "no answer yet");
        let heard = Utc::now();
        clock.heard(heard);
        let first = clock.estimate().expect("a fresh answer");
        assert!(first >= heard.duration_trunc(TimeDelta::microseconds(1)).unwrap());
        assert_eq!(
            first.timestamp_subsec_nanos() % 1_000,
            0,
            "whole microseconds"
        );
    }

    #[test]
    fn the_newest_answer_sets_the_estimate() {
        let clock = StoreClock::default();
        let heard = Utc::now();
        clock.heard(heard);
        clock.heard(heard - TimeDelta::seconds(5));
        let estimate = clock.estimate().expect("fresh");
        assert!(
            estimate < heard - TimeDelta::seconds(4),
            "{estimate} from the newest answer"
        );
    }

    #[test]
    fn a_stale_answer_gives_no_estimate() {
        let long_ago = Instant::now()
            .checked_sub(StoreClock::MAX_AGE + Duration::from_millis(1))
            .expect("a host up for more than a second");
        let stale = (Utc::now(), long_ago);
        let clock = StoreClock(Mutex::new(Some(stale)));
        assert_eq!(clock.estimate(), None);
    }
}
