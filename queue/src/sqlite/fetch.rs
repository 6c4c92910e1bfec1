//! The claim of a fetch on SQLite: settles the acks it carries, claims routed deliveries, and
//! when those cannot fill it routes what is new and claims from that as it inserts it, all in
//! one write transaction (ADRs 0035, 0069; see the Postgres twin for the rules).

use std::collections::HashSet;
use std::sync::Arc;

use rusqlite::{params, OptionalExtension, Transaction};
use wharf_domain::GroupName;
use wharf_store::SqliteStore;

use super::claim::{bury, micros, AckSettler};
use super::claimed::{MessageRow, RoutedClaim};
use super::route::{route_into_claim, ClaimAs};
use crate::backend::ClaimRequest;
use crate::error::QueueError;
use crate::fence::InstallFence;
use crate::matchers::Matchers;
use crate::message::{ClaimStep, Claimed, QueueSettings};

/// Claims up to `request.max` claimable messages for `request.instance`, first settling its
/// acks in the same write transaction (ADR 0035); also reports how many exhausted messages it
/// moved to the dead letters instead. When the routed deliveries cannot fill the claim, it
/// routes what is new in the same transaction and claims from that (ADR 0069). An error rolls
/// the whole transaction back: no ack settled, nothing claimed or routed.
pub(crate) async fn claim(
    store: &SqliteStore,
    matchers: &Arc<Matchers>,
    settings: &QueueSettings,
    request: ClaimRequest,
) -> Result<ClaimStep, QueueError> {
    // With acks to settle the writer is taken anyway; without, an idle poll costs a read.
    if request.acks.is_empty() && !anything_claimable(store, &request.group).await? {
        return Ok(ClaimStep::default());
    }
    let (matchers, settings) = (matchers.clone(), *settings);
    store
        .write_or_rollback(move |ctx| {
            let now = ctx.now.timestamp_micros();
            let step = claim_in_tx(ctx.tx, now, &matchers, &settings, request);
            let commit = step.is_ok();
            Ok((step, commit))
        })
        .await?
}

fn claim_in_tx(
    tx: &Transaction<'_>,
    now: i64,
    matchers: &Matchers,
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
    let acked = settle_acks(tx, &group, acks)?;
    let token: i64 = rand::random();
    let visible_at = now.saturating_add(micros(settings.visibility_timeout));
    let picked = claim_routed(tx, &group, &instance, token, now, visible_at, max, fence)?;
    let wanted = usize::try_from(max)
        .unwrap_or(0)
        .saturating_sub(picked.len());
    // Routed deliveries first, their messages read below; then what the claim routes, with
    // the messages its scan read.
    let mut deliveries: Vec<(RoutedClaim, Option<MessageRow>)> =
        picked.into_iter().map(|row| (row, None)).collect();
    if wanted > 0 {
        let claim = ClaimAs {
            instance: &instance,
            token,
            visible_at,
            wanted,
            fence,
        };
        let batch = settings.route_batch;
        let routed = route_into_claim(tx, now, matchers, &group, batch, &claim)?;
        deliveries.extend(
            routed
                .into_iter()
                .map(|(row, message)| (row, Some(message))),
        );
    }
    let limit = i32::try_from(settings.max_attempts).unwrap_or(i32::MAX);
    let (claimed, buried) = hand_out(tx, &group, token, now, limit, deliveries)?;
    Ok(ClaimStep {
        claimed,
        buried,
        acked,
    })
}

/// Hands out the claimed `deliveries` with their messages (read by key where the claim did
/// not read them already), burying those claimed once more than `limit` allows; returns the
/// claims and how many it buried.
fn hand_out(
    tx: &Transaction<'_>,
    group: &GroupName,
    token: i64,
    now: i64,
    limit: i32,
    deliveries: Vec<(RoutedClaim, Option<MessageRow>)>,
) -> Result<(Vec<Claimed>, usize), QueueError> {
    let mut read = tx.prepare_cached(
        "SELECT subject, payload, headers, published_at FROM message \
         WHERE topic = ?1 AND position = ?2",
    )?;
    let (mut claimed, mut buried) = (Vec::with_capacity(deliveries.len()), 0usize);
    for (delivery, message) in deliveries {
        if delivery.2 > limit {
            // Claimed once more than allowed just now: record the claims really handed out.
            bury(tx, group, delivery.1, token, now, 1)?;
            buried += 1;
            continue;
        }
        let message = match message {
            Some(message) => Some(message),
            None => read
                .query_row(params![delivery.0, delivery.1], MessageRow::from_row)
                .optional()?,
        };
        // A message whose log row is gone is left out.
        if let Some(message) = message {
            claimed.push(message.claimed(group, token, delivery));
        }
    }
    Ok((claimed, buried))
}

/// Settles the acks it carries; returns the `(position, token)` keys it settled.
fn settle_acks(
    tx: &Transaction<'_>,
    group: &GroupName,
    acks: Vec<(i64, i64)>,
) -> Result<HashSet<(i64, i64)>, QueueError> {
    let mut acked = HashSet::new();
    if acks.is_empty() {
        return Ok(acked);
    }
    let mut settler = AckSettler::new(tx)?;
    for (position, token) in acks {
        if settler.settle(group.as_str(), position, token)? {
            acked.insert((position, token));
        }
    }
    Ok(acked)
}

/// Claims up to `max` visible deliveries already routed under the install in effect (the
/// fenced one, when `fence` is given), in position order.
#[allow(clippy::too_many_arguments)]
fn claim_routed(
    tx: &Transaction<'_>,
    group: &GroupName,
    instance: &str,
    token: i64,
    now: i64,
    visible_at: i64,
    max: i64,
    fence: Option<InstallFence>,
) -> Result<Vec<RoutedClaim>, QueueError> {
    let fence = fence.map(InstallFence::install);
    let mut claim = tx.prepare_cached(
        "UPDATE delivery SET attempts = attempts + 1, claimed_by = ?2, claim_token = ?3, \
           visible_at = ?5 \
         WHERE group_name = ?1 AND position IN (SELECT position FROM delivery \
           WHERE group_name = ?1 AND visible_at <= ?4 \
             AND routed_by = (SELECT position FROM effective_declaration \
               WHERE group_name = ?1 AND (?7 IS NULL OR position = ?7)) \
           ORDER BY position LIMIT ?6) \
         RETURNING topic, position, attempts, routed_by",
    )?;
    let mut picked = claim
        .query_map(
            params![group.as_str(), instance, token, now, visible_at, max, fence],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )?
        .collect::<Result<Vec<RoutedClaim>, _>>()?;
    picked.sort_by_key(|row| row.1);
    Ok(picked)
}

/// A reader-side look before taking the single writer: an idle consumer's poll then costs no
/// write transaction. Claimable is a visible delivery, or a log the group has not routed to
/// its head (the claim routes it, ADR 0069). (A message that turns visible a moment later is
/// claimed next poll.)
async fn anything_claimable(store: &SqliteStore, group: &GroupName) -> Result<bool, QueueError> {
    let group = group.clone();
    let now = chrono::Utc::now().timestamp_micros();
    Ok(store
        .read(move |conn| {
            Ok(conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM delivery WHERE group_name = ?1 AND visible_at <= ?2 \
                   AND routed_by = (SELECT position FROM effective_declaration \
                     WHERE group_name = ?1)) \
                 OR EXISTS (SELECT 1 FROM consumer_group g JOIN topic t ON t.name = g.topic \
                   WHERE g.group_name = ?1 AND g.routed_position < t.head)",
                params![group.as_str(), now],
                |row| row.get(0),
            )?)
        })
        .await?)
}
