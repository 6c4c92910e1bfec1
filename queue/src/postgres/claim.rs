//! Claims, acks, nacks and dead letters on Postgres.
//!
//! A claim is a plain `FOR UPDATE SKIP LOCKED` over the group's own delivery rows: messages the
//! group does not match never get a delivery row, so they cannot slow it down. Each claim call
//! carries a fresh token; acks and nacks must present it, so an instance whose claim expired
//! and was re-claimed elsewhere cannot settle the other instance's claim.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use wharf_domain::GroupName;
use wharf_store::{Finishing, PgStore};

use super::headers_json;
use crate::backend::ClaimRequest;
use crate::error::QueueError;
use crate::fence::InstallFence;
use crate::held::HeldConnection;
use crate::message::{
    AckOutcome, ClaimStep, Claimed, DeadLetter, ExtendOutcome, NackOutcome, QueueSettings,
};
use crate::nack::{self, HeldClaim, NackDialect};

/// A claimed row: position, attempts, routed_by, topic, subject, payload, headers (JSON text),
/// published_at.
type ClaimRow = (
    i64,
    i32,
    i64,
    String,
    String,
    Vec<u8>,
    String,
    DateTime<Utc>,
);

/// A row of the claim statement that settles acks too: a claimed row (`acked` NULL) or an acked
/// `(position, token)` (every other column NULL).
type SettlingClaimRow = (
    i64,
    Option<i32>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    Option<DateTime<Utc>>,
    Option<i64>,
);

/// The claim call (`$1` group, `$2` max, `$3` instance, `$4` token, `$5` visibility seconds,
/// `$6` fence, `$7` and `$8` the acks' positions and tokens, empty when none): one autocommit
/// statement that first settles the acks of the same group and then claims, in one commit
/// (ADR 0035), so a consumer's acks ride on its next claim instead of a commit of their own.
///
/// The statement itself is the `wharf_claim` function (Postgres migrations 0013, 0019 and 0021,
/// ADRs 0042, 0050 and 0054): the acks are found each by its key and token, locked, and deleted
/// in one statement; then the picked rows are locked SKIP LOCKED, only deliveries stamped with
/// the install in effect are claimable (ADR 0014), and with a fence nothing is claimable once
/// the install has moved on from the one the caller joined; the picked rows are updated and
/// read with their messages in one statement. The call is an ordinary cached statement, one
/// round trip. Inside, every access is a look-up by primary key, by the row address of a row
/// the call has locked, or a walk of the `delivery` key from the claim floor, with the scans and
/// joins that could read more disabled, so its plans are made once per connection and no plan
/// made while the tables were small reads more once they grow (`tests/tests/queue_plans.rs`).
/// Its rows come in no particular order; they are sorted by position here.
const CLAIM: &str = "SELECT c_position, c_attempts, c_routed_by, c_topic, c_subject, c_payload, \
       c_headers, c_published_at, c_acked_token \
     FROM wharf_claim($1, $2, $3, $4, $5, $6, $7, $8)";

/// Settles acks: deletes the deliveries whose `(group, position, claim token)` are listed
/// pairwise in `$1`, `$2`, `$3`, returning the keys deleted. A call of `wharf_settle` (Postgres
/// migration 0016, ADR 0048): one round trip, its statement planned per call and by key only,
/// so no plan made while `delivery` was small can serve it once the queue has grown.
pub(crate) const SETTLE: &str = "SELECT s_group, s_position, s_token FROM wharf_settle($1, $2, $3)";

/// Acks one claim (`$1` group, `$2` position, `$3` token): how many deliveries it deleted, 0 or
/// 1. A call of `wharf_ack` (migration 0016, ADR 0048), keyed like [`SETTLE`].
pub(crate) const ACK: &str = "SELECT wharf_ack($1, $2, $3)";

/// Extends a held claim (`$1` group, `$2` position, `$3` token, `$4` seconds from now): the new
/// `visible_at`, or NULL when the token no longer holds it. A call of `wharf_extend` (migration
/// 0016, ADR 0048), keyed like [`SETTLE`].
pub(crate) const EXTEND: &str = "SELECT wharf_extend($1, $2, $3, $4)";

/// Run first in the queue's transactions that settle by key (a nack, a settle of set-aside
/// claims, a burial): for the rest of the transaction every statement is planned on its call
/// with its values, by key (no sequential or bitmap scans, no hash or merge joins), never from
/// a generic plan the connection cached while the tables were small (ADR 0048). One round trip.
/// (`set_config(..., true)` is `SET LOCAL`, here as one statement the connection prepares once.)
pub(crate) const KEYED_PLANS: &str = "SELECT \
     set_config('plan_cache_mode', 'force_custom_plan', true), \
     set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), \
     set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)";

/// Moves claimed deliveries (`$1` group, `$2` positions, `$3` token) to the dead letters with a
/// full copy of each message; `$4` is subtracted from the recorded attempts.
pub(crate) const BURY: &str = "WITH dead AS ( \
       DELETE FROM delivery WHERE group_name = $1 AND position = ANY($2) AND claim_token = $3 \
       RETURNING group_name, topic, position, attempts, last_error) \
     INSERT INTO dead_letter (group_name, topic, position, subject, payload, headers, \
       published_at, attempts, last_error) \
     SELECT d.group_name, d.topic, d.position, m.subject, m.payload, m.headers, m.published_at, \
       d.attempts - $4, COALESCE(d.last_error, 'claims expired without an ack or a nack') \
     FROM dead d JOIN message m ON m.topic = d.topic AND m.position = d.position \
     ON CONFLICT (group_name, position) DO UPDATE SET attempts = excluded.attempts, \
       last_error = excluded.last_error, dead_at = clock_timestamp()";

/// A nack's first step: records the handler's error (`$4`) on the held claim (`$1` group, `$2`
/// position, `$3` token) and returns its attempts so far.
pub(crate) const NACK_MARK: &str = "UPDATE delivery SET last_error = $4 \
     WHERE group_name = $1 AND position = $2 AND claim_token = $3 RETURNING attempts";

/// A nack's retry: the delivery (`$1` group, `$2` position) is released and visible again after
/// `$3` seconds.
pub(crate) const NACK_RETRY: &str = "UPDATE delivery \
     SET visible_at = clock_timestamp() + make_interval(secs => $3), \
       claimed_by = NULL, claim_token = NULL \
     WHERE group_name = $1 AND position = $2 RETURNING visible_at";

/// Settles listed `(group, position, token)` claims in `table` (`delivery` or `set_aside`),
/// returning the keys settled.
pub(crate) fn settle_in(table: &str) -> String {
    format!(
        "DELETE FROM {table} s USING unnest($1::text[], $2::bigint[], $3::bigint[]) \
           AS settled(group_name, position, claim_token) \
         WHERE s.group_name = settled.group_name AND s.position = settled.position \
           AND s.claim_token = settled.claim_token \
         RETURNING s.group_name, s.position, s.claim_token"
    )
}

/// Starts a transaction whose statements are planned by key ([`KEYED_PLANS`]).
async fn begin_keyed(
    store: &PgStore,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, QueueError> {
    let mut tx = store.pool().begin().await?;
    sqlx::query(KEYED_PLANS).execute(&mut *tx).await?;
    Ok(tx)
}

/// Claims up to `max` claimable messages of `group` for `instance`, first settling `acks`
/// (`(position, token)` of the same group) in the same statement; also reports how many
/// exhausted messages it moved to the dead letters instead. The statement runs on `held`'s
/// connection (or one from the pool), which goes back to `held` when nothing after the
/// statement needs the pool (ADR 0051).
pub(crate) async fn claim(
    store: &PgStore,
    held: &mut HeldConnection,
    settings: &QueueSettings,
    request: ClaimRequest,
) -> Result<ClaimStep, QueueError> {
    let ClaimRequest {
        group,
        instance,
        max,
        fence,
        acks,
    } = request;
    let (group, acks) = (&group, &acks[..]);
    let token: i64 = rand::random();
    let visibility = settings.visibility_timeout.as_secs_f64();
    let positions: Vec<i64> = acks.iter().map(|a| a.0).collect();
    let tokens: Vec<i64> = acks.iter().map(|a| a.1).collect();
    let mut connection = match held.take_postgres() {
        Some(connection) => connection,
        None => store.pool().acquire().await?,
    };
    // The statement runs to its end even if this fetch is dropped meanwhile (a deadline):
    // dropped mid-statement, its connection could be lost to the pool (ADR 0068).
    let (group_text, instance_text) = (group.as_str().to_owned(), instance);
    let fence = fence.map(InstallFence::install);
    let statement = Finishing::new(async move {
        let settling = sqlx::query_as::<_, SettlingClaimRow>(CLAIM)
            .bind(group_text)
            .bind(max)
            .bind(instance_text)
            .bind(token)
            .bind(visibility)
            .bind(fence)
            .bind(positions)
            .bind(tokens)
            .fetch_all(&mut *connection)
            .await;
        (connection, settling)
    });
    let (connection, settling) = statement.await;
    let settling = settling?;
    let mut rows: Vec<ClaimRow> = Vec::with_capacity(settling.len());
    let mut acked = HashSet::new();
    for row in settling {
        match row {
            (position, _, _, _, _, _, _, _, Some(acked_token)) => {
                acked.insert((position, acked_token));
            }
            (position, Some(a), Some(r), Some(t), Some(s), Some(p), Some(h), Some(at), None) => {
                rows.push((position, a, r, t, s, p, h, at));
            }
            other => {
                return Err(QueueError::Store(wharf_store::StoreError::Task(format!(
                    "the claim statement returned an incomplete row: {other:?}"
                ))))
            }
        }
    }
    rows.sort_by_key(|row| row.0);
    let limit = i32::try_from(settings.max_attempts).unwrap_or(i32::MAX);
    let (exhausted, live): (Vec<ClaimRow>, Vec<ClaimRow>) =
        rows.into_iter().partition(|row| row.1 > limit);
    // Kept only when nothing after this statement needs the pool, and while the pool has a
    // connection to spare for the rest of the process (its heartbeats, its handlers' calls):
    // holding the last one would make them wait for this loop.
    let pool = store.pool();
    let spare = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
    if spare && acked.len() == acks.len() && exhausted.is_empty() {
        held.keep_postgres(connection);
    } else {
        drop(connection);
    }
    if acked.len() < acks.len() {
        let missed: Vec<&(i64, i64)> = acks.iter().filter(|k| !acked.contains(*k)).collect();
        let positions: Vec<i64> = missed.iter().map(|k| k.0).collect();
        let tokens: Vec<i64> = missed.iter().map(|k| k.1).collect();
        let (store_handle, settling) = (store.clone(), group.clone());
        let settled = Finishing::new(async move {
            let groups = vec![settling.as_str(); positions.len()];
            settle_set_aside(&store_handle, &groups, &positions, &tokens).await
        })
        .await?;
        acked.extend(
            settled
                .into_iter()
                .map(|(_, position, token)| (position, token)),
        );
    }
    let buried = exhausted.len();
    if !exhausted.is_empty() {
        // These were claimed once more than allowed just now (their earlier claims expired);
        // the token still fences them, and the dead letter records the claims really handed
        // out.
        let positions: Vec<i64> = exhausted.iter().map(|row| row.0).collect();
        let (store_handle, burying) = (store.clone(), group.clone());
        Finishing::new(async move {
            let mut tx = begin_keyed(&store_handle).await?;
            bury(&mut tx, &burying, &positions, token, 1).await?;
            tx.commit().await?;
            Ok::<(), QueueError>(())
        })
        .await?;
    }
    let claimed = live
        .into_iter()
        .map(
            |(position, attempts, routed_by, topic, subject, payload, headers, published_at)| {
                Claimed {
                    group: group.to_string(),
                    topic,
                    position,
                    subject,
                    payload,
                    headers: super::headers_text(&headers),
                    published_at,
                    attempts,
                    routed_by,
                    claim_token: token,
                }
            },
        )
        .collect();
    Ok(ClaimStep {
        claimed,
        buried,
        acked,
    })
}

/// Moves claimed deliveries to the dead letters, with a full copy of each message; `uncount`
/// is subtracted from the recorded attempts (1 when the current claim was never handed out).
async fn bury(
    conn: &mut PgConnection,
    group: &GroupName,
    positions: &[i64],
    token: i64,
    uncount: i32,
) -> Result<u64, QueueError> {
    let moved = sqlx::query(BURY)
        .bind(group.as_str())
        .bind(positions)
        .bind(token)
        .bind(uncount)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(moved)
}

/// Acknowledges a claimed message: it is done for the group.
pub(crate) async fn ack(
    store: &PgStore,
    group: &GroupName,
    position: i64,
    token: i64,
) -> Result<AckOutcome, QueueError> {
    let deleted: i32 = sqlx::query_scalar(ACK)
        .bind(group.as_str())
        .bind(position)
        .bind(token)
        .fetch_one(store.pool())
        .await?;
    let acked = deleted == 1
        || settle_set_aside(store, &[group.as_str()], &[position], &[token])
            .await?
            .len()
            == 1;
    Ok(if acked {
        AckOutcome::Acked
    } else {
        AckOutcome::ClaimLost
    })
}

/// Acknowledges `(group, position, token)` claims in one statement; returns the keys it acked
/// (the token included: two claims of one message, an expired one and its successor, can be
/// in one batch, and only the successor's ack counts).
pub(crate) async fn ack_many(
    store: &PgStore,
    keys: &[(String, i64, i64)],
) -> Result<HashSet<(String, i64, i64)>, QueueError> {
    let groups: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let positions: Vec<i64> = keys.iter().map(|k| k.1).collect();
    let tokens: Vec<i64> = keys.iter().map(|k| k.2).collect();
    let done: Vec<(String, i64, i64)> = sqlx::query_as(SETTLE)
        .bind(&groups)
        .bind(&positions)
        .bind(&tokens)
        .fetch_all(store.pool())
        .await?;
    let mut done: HashSet<(String, i64, i64)> = done.into_iter().collect();
    if done.len() < keys.len() {
        let missed: Vec<&(String, i64, i64)> = keys.iter().filter(|k| !done.contains(*k)).collect();
        let groups: Vec<&str> = missed.iter().map(|k| k.0.as_str()).collect();
        let positions: Vec<i64> = missed.iter().map(|k| k.1).collect();
        let tokens: Vec<i64> = missed.iter().map(|k| k.2).collect();
        done.extend(settle_set_aside(store, &groups, &positions, &tokens).await?);
    }
    Ok(done)
}

/// Settles claims whose acks found no delivery row: a swap may have set them aside while they
/// were held (ADR 0014), and their handlers finished, so the messages are done for the group.
/// Only reached after a miss, so the hot path pays nothing for it.
///
/// A swap moves rows between `delivery` and `set_aside` under the group row lock; a plain
/// second statement could look in `set_aside` just after a later swap restored the row to
/// `delivery`. So this takes the groups' row locks first (waiting out any swap being applied)
/// and then looks in both tables.
async fn settle_set_aside(
    store: &PgStore,
    groups: &[&str],
    positions: &[i64],
    tokens: &[i64],
) -> Result<Vec<(String, i64, i64)>, QueueError> {
    let mut tx = begin_keyed(store).await?;
    sqlx::query(
        "SELECT 1 FROM consumer_group WHERE group_name = ANY($1) ORDER BY group_name FOR UPDATE",
    )
    .bind(groups)
    .execute(&mut *tx)
    .await?;
    let mut settled = Vec::new();
    for table in ["delivery", "set_aside"] {
        let sql = settle_in(table);
        let done: Vec<(String, i64, i64)> = sqlx::query_as(&sql)
            .bind(groups)
            .bind(positions)
            .bind(tokens)
            .fetch_all(&mut *tx)
            .await?;
        settled.extend(done);
    }
    tx.commit().await?;
    Ok(settled)
}

/// Pushes a held claim's `visible_at` to `by` from now; only the claim token's holder can.
pub(crate) async fn extend(
    store: &PgStore,
    group: &GroupName,
    position: i64,
    token: i64,
    by: Duration,
) -> Result<ExtendOutcome, QueueError> {
    let visible_at: Option<DateTime<Utc>> = sqlx::query_scalar(EXTEND)
        .bind(group.as_str())
        .bind(position)
        .bind(token)
        .bind(by.as_secs_f64())
        .fetch_one(store.pool())
        .await?;
    Ok(match visible_at {
        Some(visible_at) => ExtendOutcome::Extended { visible_at },
        None => ExtendOutcome::ClaimLost,
    })
}

/// Gives a claimed message back: claimable again after the backoff, or dead-lettered when it
/// has used its attempts (the rules: `nack.rs`), in one transaction planned by key.
pub(crate) async fn nack(
    store: &PgStore,
    settings: &QueueSettings,
    group: &GroupName,
    position: i64,
    token: i64,
    error: &str,
) -> Result<NackOutcome, QueueError> {
    let mut tx = begin_keyed(store).await?;
    let claim = HeldClaim {
        group,
        position,
        token,
    };
    let outcome = nack::nack(&mut PgNack(&mut tx), settings, claim, error).await?;
    tx.commit().await?;
    Ok(outcome)
}

/// A nack's statements on its transaction's connection.
struct PgNack<'c>(&'c mut PgConnection);

impl NackDialect for PgNack<'_> {
    async fn mark(&mut self, claim: HeldClaim<'_>, error: &str) -> Result<Option<i32>, QueueError> {
        Ok(sqlx::query_scalar(NACK_MARK)
            .bind(claim.group.as_str())
            .bind(claim.position)
            .bind(claim.token)
            .bind(error)
            .fetch_optional(&mut *self.0)
            .await?)
    }

    async fn set_aside_attempts(
        &mut self,
        claim: HeldClaim<'_>,
    ) -> Result<Option<i32>, QueueError> {
        Ok(sqlx::query_scalar(
            "SELECT attempts FROM set_aside WHERE group_name = $1 AND position = $2 \
               AND claim_token = $3 FOR UPDATE",
        )
        .bind(claim.group.as_str())
        .bind(claim.position)
        .bind(claim.token)
        .fetch_optional(&mut *self.0)
        .await?)
    }

    async fn release_set_aside(
        &mut self,
        claim: HeldClaim<'_>,
        error: &str,
        backoff: Duration,
    ) -> Result<DateTime<Utc>, QueueError> {
        Ok(sqlx::query_scalar(
            "UPDATE set_aside SET last_error = $3, claimed_by = NULL, claim_token = NULL, \
               visible_at = clock_timestamp() + make_interval(secs => $4) \
             WHERE group_name = $1 AND position = $2 RETURNING visible_at",
        )
        .bind(claim.group.as_str())
        .bind(claim.position)
        .bind(error)
        .bind(backoff.as_secs_f64())
        .fetch_one(&mut *self.0)
        .await?)
    }

    async fn bury(&mut self, claim: HeldClaim<'_>) -> Result<(), QueueError> {
        bury(self.0, claim.group, &[claim.position], claim.token, 0).await?;
        Ok(())
    }

    async fn retry(
        &mut self,
        claim: HeldClaim<'_>,
        backoff: Duration,
    ) -> Result<DateTime<Utc>, QueueError> {
        Ok(sqlx::query_scalar(NACK_RETRY)
            .bind(claim.group.as_str())
            .bind(claim.position)
            .bind(backoff.as_secs_f64())
            .fetch_one(&mut *self.0)
            .await?)
    }
}

type DeadRow = (
    String,
    String,
    i64,
    String,
    Vec<u8>,
    serde_json::Value,
    DateTime<Utc>,
    i32,
    Option<String>,
    DateTime<Utc>,
);

/// Lists a group's dead letters after `after`, oldest position first.
pub(crate) async fn dead_letters(
    store: &PgStore,
    group: &GroupName,
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, QueueError> {
    let rows: Vec<DeadRow> = sqlx::query_as(
        "SELECT group_name, topic, position, subject, payload, headers, published_at, attempts, \
           last_error, dead_at FROM dead_letter WHERE group_name = $1 AND position > $2 \
         ORDER BY position LIMIT $3",
    )
    .bind(group.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(store.pool())
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| DeadLetter {
            group: r.0,
            topic: r.1,
            position: r.2,
            subject: r.3,
            payload: r.4,
            headers: headers_json(r.5),
            published_at: r.6,
            attempts: r.7,
            last_error: r.8,
            dead_at: r.9,
        })
        .collect())
}

/// Puts a dead letter back in the group's queue with fresh attempts. Restores the log row if
/// retention removed it meanwhile (same topic, position and content). Returns false when there
/// is no such dead letter.
pub(crate) async fn replay_dead_letter(
    store: &PgStore,
    group: &GroupName,
    position: i64,
) -> Result<bool, QueueError> {
    let mut tx = store.pool().begin().await?;
    let topic: Option<String> =
        sqlx::query_scalar("SELECT topic FROM dead_letter WHERE group_name = $1 AND position = $2")
            .bind(group.as_str())
            .bind(position)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(topic) = topic else {
        return Ok(false);
    };
    super::retention::lock_retention(&mut tx, &topic).await?;
    // Lower the claim floor first, under the group row lock routing takes to raise it: a
    // router that computed its floor without this row either committed before (and is
    // corrected here) or waits for this commit and then sees the row.
    sqlx::query(
        "UPDATE consumer_group SET claim_floor = LEAST(claim_floor, $2) WHERE group_name = $1",
    )
    .bind(group.as_str())
    .bind(position)
    .execute(&mut *tx)
    .await?;
    let restored = sqlx::query(
        "WITH dead AS (DELETE FROM dead_letter WHERE group_name = $1 AND position = $2 RETURNING *), \
         log AS (INSERT INTO message (topic, position, subject, payload, headers, published_at) \
           SELECT topic, position, subject, payload, headers, published_at FROM dead \
           ON CONFLICT DO NOTHING) \
         INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
         SELECT d.group_name, d.topic, d.position, \
           COALESCE((SELECT position FROM effective_declaration e WHERE e.group_name = d.group_name), 0), \
           clock_timestamp(), clock_timestamp() FROM dead d \
         ON CONFLICT DO NOTHING",
    )
    .bind(group.as_str())
    .bind(position)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(restored == 1)
}
