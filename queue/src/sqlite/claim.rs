//! Acks, nacks, extensions and dead letters on SQLite (the nack's rules: `nack.rs`); the claim
//! itself is in `fetch.rs`.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension, Transaction};
use wharf_domain::GroupName;
use wharf_store::event::from_micros;
use wharf_store::{run_ready, SqliteStore};

use super::headers_from;
use crate::error::QueueError;
use crate::message::{AckOutcome, DeadLetter, ExtendOutcome, NackOutcome, QueueSettings};
use crate::nack::{self, HeldClaim, NackDialect};

pub(super) fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Moves one claimed delivery to the dead letters with a full copy of its message.
pub(super) fn bury(
    tx: &Transaction<'_>,
    group: &GroupName,
    position: i64,
    token: i64,
    now: i64,
    uncount: i32,
) -> Result<(), wharf_store::StoreError> {
    tx.execute(
        "INSERT INTO dead_letter (group_name, topic, position, subject, payload, headers, \
           published_at, attempts, last_error, dead_at) \
         SELECT d.group_name, d.topic, d.position, m.subject, m.payload, m.headers, \
           m.published_at, d.attempts - ?5, \
           COALESCE(d.last_error, 'claims expired without an ack or a nack'), ?4 \
         FROM delivery d JOIN message m ON m.topic = d.topic AND m.position = d.position \
         WHERE d.group_name = ?1 AND d.position = ?2 AND d.claim_token = ?3 \
         ON CONFLICT (group_name, position) DO UPDATE SET attempts = excluded.attempts, \
           last_error = excluded.last_error, dead_at = excluded.dead_at",
        params![group.as_str(), position, token, now, uncount],
    )?;
    tx.prepare_cached(
        "DELETE FROM delivery WHERE group_name = ?1 AND position = ?2 AND claim_token = ?3",
    )?
    .execute(params![group.as_str(), position, token])?;
    Ok(())
}

/// Acknowledges a claimed message.
pub(crate) async fn ack(
    store: &SqliteStore,
    group: &GroupName,
    position: i64,
    token: i64,
) -> Result<AckOutcome, QueueError> {
    let group = group.clone();
    Ok(store
        .write(move |ctx| {
            Ok(
                if AckSettler::new(ctx.tx)?.settle(group.as_str(), position, token)? {
                    AckOutcome::Acked
                } else {
                    AckOutcome::ClaimLost
                },
            )
        })
        .await?)
}

/// Settles acks inside one write transaction, its delete statement prepared once.
pub(super) struct AckSettler<'tx> {
    tx: &'tx Transaction<'tx>,
    delete: rusqlite::CachedStatement<'tx>,
}

impl<'tx> AckSettler<'tx> {
    pub(super) fn new(tx: &'tx Transaction<'tx>) -> Result<Self, rusqlite::Error> {
        let delete = tx.prepare_cached(
            "DELETE FROM delivery WHERE group_name = ?1 AND position = ?2 AND claim_token = ?3",
        )?;
        Ok(Self { tx, delete })
    }

    /// Settles one ack of `group`'s claim `(position, token)`: deletes its delivery, or
    /// settles it where a swap set it aside while it was held; false when the claim is no
    /// longer held.
    pub(super) fn settle(
        &mut self,
        group: &str,
        position: i64,
        token: i64,
    ) -> Result<bool, rusqlite::Error> {
        let deleted = self.delete.execute(params![group, position, token])?;
        Ok(deleted == 1 || settle_set_aside(self.tx, group, position, token)? == 1)
    }
}

/// Settles a claim whose delivery a swap set aside while it was held (ADR 0014): the handler
/// finished, so the message is done for the group.
fn settle_set_aside(
    tx: &Transaction<'_>,
    group: &str,
    position: i64,
    token: i64,
) -> Result<usize, rusqlite::Error> {
    tx.prepare_cached(
        "DELETE FROM set_aside WHERE group_name = ?1 AND position = ?2 AND claim_token = ?3",
    )?
    .execute(params![group, position, token])
}

/// Acknowledges `(group, position, token)` claims in one transaction; returns the keys it
/// acked, tokens included.
pub(crate) async fn ack_many(
    store: &SqliteStore,
    keys: Vec<(String, i64, i64)>,
) -> Result<HashSet<(String, i64, i64)>, QueueError> {
    Ok(store
        .write(move |ctx| {
            let (mut settler, mut acked) = (AckSettler::new(ctx.tx)?, HashSet::new());
            for (group, position, token) in keys {
                if settler.settle(&group, position, token)? {
                    acked.insert((group, position, token));
                }
            }
            Ok(acked)
        })
        .await?)
}

/// Pushes a held claim's `visible_at` to `by` from now; only the claim token's holder can.
pub(crate) async fn extend(
    store: &SqliteStore,
    group: &GroupName,
    position: i64,
    token: i64,
    by: std::time::Duration,
) -> Result<ExtendOutcome, QueueError> {
    let (group, by) = (group.clone(), micros(by));
    Ok(store
        .write(move |ctx| {
            let visible_at = ctx.now.timestamp_micros().saturating_add(by);
            let done = ctx
                .tx
                .prepare_cached(
                    "UPDATE delivery SET visible_at = ?4 \
                     WHERE group_name = ?1 AND position = ?2 AND claim_token = ?3",
                )?
                .execute(params![group.as_str(), position, token, visible_at])?;
            Ok(if done == 1 {
                ExtendOutcome::Extended {
                    visible_at: from_micros(visible_at),
                }
            } else {
                ExtendOutcome::ClaimLost
            })
        })
        .await?)
}

/// Gives a claimed message back: retried after the backoff, or dead-lettered (the rules:
/// `nack.rs`), in one write transaction.
pub(crate) async fn nack(
    store: &SqliteStore,
    settings: &QueueSettings,
    group: &GroupName,
    position: i64,
    token: i64,
    error: &str,
) -> Result<NackOutcome, QueueError> {
    let (group, settings, error) = (group.clone(), *settings, error.to_owned());
    store
        .write_or_rollback(move |ctx| {
            let now = ctx.now.timestamp_micros();
            let claim = HeldClaim {
                group: &group,
                position,
                token,
            };
            let mut db = SqliteNack { tx: ctx.tx, now };
            let outcome = run_ready(nack::nack(&mut db, &settings, claim, &error));
            let commit = outcome.is_ok();
            Ok((outcome, commit))
        })
        .await?
}

/// A nack's statements on its write transaction, at the store's time `now`.
struct SqliteNack<'a, 't> {
    tx: &'a Transaction<'t>,
    now: i64,
}

impl NackDialect for SqliteNack<'_, '_> {
    async fn mark(&mut self, claim: HeldClaim<'_>, error: &str) -> Result<Option<i32>, QueueError> {
        let g = claim.group.as_str();
        Ok(self
            .tx
            .prepare_cached(
                "UPDATE delivery SET last_error = ?4 \
                 WHERE group_name = ?1 AND position = ?2 AND claim_token = ?3 RETURNING attempts",
            )?
            .query_row(params![g, claim.position, claim.token, error], |row| {
                row.get(0)
            })
            .optional()?)
    }

    async fn set_aside_attempts(
        &mut self,
        claim: HeldClaim<'_>,
    ) -> Result<Option<i32>, QueueError> {
        let g = claim.group.as_str();
        Ok(self
            .tx
            .prepare_cached(
                "SELECT attempts FROM set_aside WHERE group_name = ?1 AND position = ?2 \
                   AND claim_token = ?3",
            )?
            .query_row(params![g, claim.position, claim.token], |row| row.get(0))
            .optional()?)
    }

    async fn release_set_aside(
        &mut self,
        claim: HeldClaim<'_>,
        error: &str,
        backoff: Duration,
    ) -> Result<DateTime<Utc>, QueueError> {
        let visible_at = self.now + micros(backoff);
        self.tx
            .prepare_cached(
                "UPDATE set_aside SET last_error = ?3, visible_at = ?4, claimed_by = NULL, \
                   claim_token = NULL WHERE group_name = ?1 AND position = ?2",
            )?
            .execute(params![
                claim.group.as_str(),
                claim.position,
                error,
                visible_at
            ])?;
        Ok(from_micros(visible_at))
    }

    async fn bury(&mut self, claim: HeldClaim<'_>) -> Result<(), QueueError> {
        Ok(bury(
            self.tx,
            claim.group,
            claim.position,
            claim.token,
            self.now,
            0,
        )?)
    }

    async fn retry(
        &mut self,
        claim: HeldClaim<'_>,
        backoff: Duration,
    ) -> Result<DateTime<Utc>, QueueError> {
        let visible_at = self.now + micros(backoff);
        self.tx
            .prepare_cached(
                "UPDATE delivery SET visible_at = ?3, claimed_by = NULL, claim_token = NULL \
                 WHERE group_name = ?1 AND position = ?2",
            )?
            .execute(params![claim.group.as_str(), claim.position, visible_at])?;
        Ok(from_micros(visible_at))
    }
}

/// Lists a group's dead letters after `after`, oldest position first.
pub(crate) async fn dead_letters(
    store: &SqliteStore,
    group: &GroupName,
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, QueueError> {
    let group = group.clone();
    Ok(store
        .read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT group_name, topic, position, subject, payload, headers, published_at, \
                   attempts, last_error, dead_at FROM dead_letter \
                 WHERE group_name = ?1 AND position > ?2 ORDER BY position LIMIT ?3",
            )?;
            let rows = stmt
                .query_map(params![group.as_str(), after, limit], |row| {
                    Ok(DeadLetter {
                        group: row.get(0)?,
                        topic: row.get(1)?,
                        position: row.get(2)?,
                        subject: row.get(3)?,
                        payload: row.get(4)?,
                        headers: headers_from(&row.get::<_, String>(5)?),
                        published_at: from_micros(row.get(6)?),
                        attempts: row.get(7)?,
                        last_error: row.get(8)?,
                        dead_at: from_micros(row.get(9)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?)
}

/// Puts a dead letter back in the group's queue with fresh attempts, restoring its log row if
/// retention removed it. False when there is no such dead letter.
pub(crate) async fn replay_dead_letter(
    store: &SqliteStore,
    group: &GroupName,
    position: i64,
) -> Result<bool, QueueError> {
    let group = group.clone();
    Ok(store
        .write(move |ctx| {
            let now = ctx.now.timestamp_micros();
            ctx.tx.execute(
                "INSERT OR IGNORE INTO message (topic, position, subject, payload, headers, published_at) \
                 SELECT topic, position, subject, payload, headers, published_at FROM dead_letter \
                 WHERE group_name = ?1 AND position = ?2",
                params![group.as_str(), position],
            )?;
            let restored = ctx.tx.execute(
                "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
                 SELECT x.group_name, x.topic, x.position, \
                   COALESCE((SELECT position FROM effective_declaration e WHERE e.group_name = x.group_name), 0), ?3, ?3 \
                 FROM dead_letter x WHERE x.group_name = ?1 AND x.position = ?2",
                params![group.as_str(), position, now],
            )?;
            ctx.tx
                .prepare_cached(
                    "DELETE FROM dead_letter WHERE group_name = ?1 AND position = ?2",
                )?
                .execute(params![group.as_str(), position])?;
            Ok(restored == 1)
        })
        .await?)
}
