//! A nack, written once for both backends over [`NackDialect`] (ADR 0078).
//!
//! The handler's error is recorded on the held claim. A claim that has used its attempts goes
//! to the dead letters; any other is released, visible again after the backoff. A claim a
//! swap set aside while it was held (ADR 0014) is released where it lies, so it comes back
//! after the backoff should an install restore it. A claim whose token no longer holds it is
//! lost. All of it in the one transaction the backend runs it in.

use chrono::{DateTime, Utc};
use std::time::Duration;
use wharf_domain::GroupName;

use crate::error::QueueError;
use crate::message::{NackOutcome, QueueSettings};

/// A held claim: its group, log position and claim token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldClaim<'a> {
    pub group: &'a GroupName,
    pub position: i64,
    pub token: i64,
}

/// A backend's statements for one nack, all in its transaction.
pub(crate) trait NackDialect {
    /// Records `error` on the claim's delivery; its attempts so far, or `None` when no
    /// delivery is held by the claim's token.
    async fn mark(&mut self, claim: HeldClaim<'_>, error: &str) -> Result<Option<i32>, QueueError>;

    /// The attempts of the claim's set-aside row still held by its token (locked where the
    /// backend locks rows), or `None`.
    async fn set_aside_attempts(&mut self, claim: HeldClaim<'_>)
        -> Result<Option<i32>, QueueError>;

    /// Releases the claim's set-aside row with `error`, visible again after `backoff`; when.
    async fn release_set_aside(
        &mut self,
        claim: HeldClaim<'_>,
        error: &str,
        backoff: Duration,
    ) -> Result<DateTime<Utc>, QueueError>;

    /// Moves the claim's delivery to the dead letters, its attempts as recorded.
    async fn bury(&mut self, claim: HeldClaim<'_>) -> Result<(), QueueError>;

    /// Releases the claim's delivery, visible again after `backoff`; when.
    async fn retry(
        &mut self,
        claim: HeldClaim<'_>,
        backoff: Duration,
    ) -> Result<DateTime<Utc>, QueueError>;
}

/// Gives the held `claim` back with the handler's `error`.
pub(crate) async fn nack<D: NackDialect>(
    db: &mut D,
    settings: &QueueSettings,
    claim: HeldClaim<'_>,
    error: &str,
) -> Result<NackOutcome, QueueError> {
    let Some(attempts) = db.mark(claim, error).await? else {
        let Some(attempts) = db.set_aside_attempts(claim).await? else {
            return Ok(NackOutcome::ClaimLost);
        };
        let backoff = settings.backoff(attempts);
        let visible_at = db.release_set_aside(claim, error, backoff).await?;
        return Ok(NackOutcome::Retrying { visible_at });
    };
    if i64::from(attempts) >= i64::from(settings.max_attempts) {
        db.bury(claim).await?;
        return Ok(NackOutcome::DeadLettered);
    }
    let visible_at = db.retry(claim, settings.backoff(attempts)).await?;
    Ok(NackOutcome::Retrying { visible_at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_store::run_ready;

    /// A claim's rows as a nack sees them, and the writes it made.
    #[derive(Default)]
    struct Rows {
        delivery_attempts: Option<i32>,
        set_aside_attempts: Option<i32>,
        writes: Vec<&'static str>,
    }

    impl NackDialect for Rows {
        async fn mark(&mut self, _: HeldClaim<'_>, _: &str) -> Result<Option<i32>, QueueError> {
            self.writes.push("mark");
            Ok(self.delivery_attempts)
        }

        async fn set_aside_attempts(
            &mut self,
            _: HeldClaim<'_>,
        ) -> Result<Option<i32>, QueueError> {
            Ok(self.set_aside_attempts)
        }

        async fn release_set_aside(
            &mut self,
            _: HeldClaim<'_>,
            _: &str,
            _: Duration,
        ) -> Result<DateTime<Utc>, QueueError> {
            self.writes.push("release set-aside");
            Ok(DateTime::UNIX_EPOCH)
        }

        async fn bury(&mut self, _: HeldClaim<'_>) -> Result<(), QueueError> {
            self.writes.push("bury");
            Ok(())
        }

        async fn retry(
            &mut self,
            _: HeldClaim<'_>,
            _: Duration,
        ) -> Result<DateTime<Utc>, QueueError> {
            self.writes.push("retry");
            Ok(DateTime::UNIX_EPOCH)
        }
    }

    fn nacked(mut rows: Rows) -> (NackOutcome, Vec<&'static str>) {
        let group = GroupName::parse("group", "g").unwrap();
        let claim = HeldClaim {
            group: &group,
            position: 1,
            token: 2,
        };
        let settings = QueueSettings {
            max_attempts: 3,
            ..QueueSettings::default()
        };
        let outcome = run_ready(nack(&mut rows, &settings, claim, "boom")).unwrap();
        (outcome, rows.writes)
    }

    #[test]
    fn a_claim_with_attempts_left_is_retried() {
        let (outcome, writes) = nacked(Rows {
            delivery_attempts: Some(2),
            ..Rows::default()
        });
        assert!(matches!(outcome, NackOutcome::Retrying { .. }));
        assert_eq!(writes, ["mark", "retry"]);
    }

    #[test]
    fn a_claim_that_used_its_attempts_is_buried() {
        let (outcome, writes) = nacked(Rows {
            delivery_attempts: Some(3),
            ..Rows::default()
        });
        assert_eq!(outcome, NackOutcome::DeadLettered);
        assert_eq!(writes, ["mark", "bury"]);
    }

    #[test]
    fn a_claim_set_aside_while_held_is_released_where_it_lies() {
        let (outcome, writes) = nacked(Rows {
            set_aside_attempts: Some(5),
            ..Rows::default()
        });
        assert!(matches!(outcome, NackOutcome::Retrying { .. }));
        assert_eq!(writes, ["mark", "release set-aside"]);
    }

    #[test]
    fn a_claim_held_nowhere_is_lost() {
        let (outcome, writes) = nacked(Rows::default());
        assert_eq!(outcome, NackOutcome::ClaimLost);
        assert_eq!(writes, ["mark"]);
    }
}
