//! Routing on SQLite: the step written once (`routing.rs`) inside one write transaction on the
//! single writer, so the install it reads cannot change under it; and the routing a claim
//! does itself in the steady state (ADR 0069), which only SQLite has.

use std::sync::Arc;

use rusqlite::{params, OptionalExtension, Transaction};
use wharf_domain::GroupName;
use wharf_store::{run_ready, SqliteStore};

use super::claimed::{MessageRow, RoutedClaim};
use super::route_sql::SqliteRoute;
use crate::error::QueueError;
use crate::fence::InstallFence;
use crate::generations::StepRanges;
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, RouteReport};
use crate::routing::{self, Cursor, Look};

/// Routes up to `batch` log positions for `group`.
pub(crate) async fn route(
    store: &SqliteStore,
    matchers: Arc<Matchers>,
    group: &GroupName,
    batch: i64,
    fence: Option<InstallFence>,
) -> Result<RouteReport, QueueError> {
    if let Some(position) = caught_up(store, group, fence).await? {
        return Ok(RouteReport {
            position,
            ..RouteReport::default()
        });
    }
    let group = group.clone();
    store
        .write_or_rollback(move |ctx| {
            let routed = step(
                ctx.tx,
                ctx.now.timestamp_micros(),
                &matchers,
                &group,
                batch,
                fence,
            );
            let commit = routed.is_ok();
            Ok((routed, commit))
        })
        .await?
}

/// One routing step inside the write transaction: the step written once (`routing.rs`) on
/// this backend's statements, which complete at once.
fn step(
    tx: &Transaction<'_>,
    now: i64,
    matchers: &Matchers,
    group: &GroupName,
    batch: i64,
    fence: Option<InstallFence>,
) -> Result<RouteReport, QueueError> {
    let Some((cursor, _)) = read_cursor(tx, group)? else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    let mut db = SqliteRoute { tx, now };
    run_ready(routing::step(
        &mut db, matchers, group, cursor, batch, fence,
    ))
}

/// The group's routing state and the install in effect, if any.
fn read_cursor(
    tx: &Transaction<'_>,
    group: &GroupName,
) -> Result<Option<(Cursor, Option<i64>)>, QueueError> {
    Ok(tx
        .prepare_cached(
            "SELECT g.topic, g.routed_position, g.routed_install, g.start_position, \
               g.rescan_position, g.rescan_until, \
               COALESCE((SELECT t.head FROM topic t WHERE t.name = g.topic), 0), \
               (SELECT e.position FROM effective_declaration e WHERE e.group_name = g.group_name) \
             FROM consumer_group g WHERE g.group_name = ?1",
        )?
        .query_row([group.as_str()], |row| {
            let cursor = Cursor {
                head: row.get(6)?,
                topic: row.get(0)?,
                routed_position: row.get(1)?,
                routed_install: row.get(2)?,
                start_position: row.get(3)?,
                rescan_position: row.get(4)?,
                rescan_until: row.get(5)?,
            };
            Ok((cursor, row.get(7)?))
        })
        .optional()?)
}

pub(super) fn read_install(
    conn: &rusqlite::Connection,
    group: &GroupName,
) -> Result<Option<EffectiveInstall>, QueueError> {
    let row: Option<(i64, String)> = conn
        .prepare_cached(
            "SELECT position, patterns FROM effective_declaration WHERE group_name = ?1",
        )?
        .query_row([group.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    row.map(|(position, patterns)| {
        Ok(EffectiveInstall {
            position,
            patterns: serde_json::from_str(&patterns)?,
        })
    })
    .transpose()
}

/// A reader-side look: the cursor when the group is caught up, aligned with its install and
/// done rescanning, so an idle poll takes no write transaction; with a fence, `Fenced` when the
/// install is not the fenced one.
async fn caught_up(
    store: &SqliteStore,
    group: &GroupName,
    fence: Option<InstallFence>,
) -> Result<Option<i64>, QueueError> {
    let name = group.clone();
    let look: Option<Look> = store
        .read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT g.routed_position, COALESCE(t.head, 0), g.routed_install, \
                       g.rescan_position > g.rescan_until, e.position \
                     FROM consumer_group g LEFT JOIN topic t ON t.name = g.topic \
                     LEFT JOIN effective_declaration e ON e.group_name = g.group_name \
                     WHERE g.group_name = ?1",
                )?
                .query_row([name.as_str()], |row| {
                    Ok(Look {
                        routed_position: row.get(0)?,
                        head: row.get(1)?,
                        routed_install: row.get(2)?,
                        rescanned: row.get(3)?,
                        install: row.get(4)?,
                    })
                })
                .optional()?)
        })
        .await?;
    match look {
        Some(look) => look.settled(group, fence),
        None => Ok(None),
    }
}

/// The install in effect for `group`.
pub(crate) async fn effective_install(
    store: &SqliteStore,
    group: &GroupName,
) -> Result<Option<EffectiveInstall>, QueueError> {
    let group = group.clone();
    let read = store
        .read(move |conn| Ok(read_install(conn, &group)))
        .await?;
    read
}

/// Who a claim hands its inline-routed deliveries to (ADR 0069).
pub(super) struct ClaimAs<'a> {
    pub instance: &'a str,
    pub token: i64,
    pub visible_at: i64,
    /// How many deliveries the claim still wants.
    pub wanted: usize,
    /// The install the claiming instance holds, when its fetch is fenced.
    pub fence: Option<InstallFence>,
}

/// Routes forward inside a claim's write transaction and hands the first `claim.wanted`
/// matches to the claiming instance as they are inserted, with their messages as the scan read
/// them (ADR 0069): each such delivery is written once before its ack instead of twice
/// (routed, then claimed), and its message is read once.
///
/// Only the steady state routes here: the group's routing aligned with its install, no rescan
/// pending, and the claimer's fence (if any) that install. A swap to apply or a rescan is left
/// to a routing step, which does the whole of it; so is everything when nothing is new. The
/// scan stops at the `claim.wanted`-th match or after `batch` positions, and the cursor moves
/// to where it stopped, so what was scanned is routed exactly once, as a step would route it.
pub(super) fn route_into_claim(
    tx: &Transaction<'_>,
    now: i64,
    matchers: &Matchers,
    group: &GroupName,
    batch: i64,
    claim: &ClaimAs<'_>,
) -> Result<Vec<(RoutedClaim, MessageRow)>, QueueError> {
    let Some((at, in_effect)) = read_cursor(tx, group)? else {
        return Ok(Vec::new());
    };
    let install = at.routed_install;
    // The steady state: routing aligned with the install in effect, no rescan pending.
    let steady = in_effect == Some(install) && at.rescanned();
    if !steady || claim.fence.is_some_and(|fence| !fence.admits(install)) || claim.wanted == 0 {
        return Ok(Vec::new());
    }
    let Some((from, to)) = StepRanges::new(at.routed_position, at.head, 1, 0, batch).forward else {
        return Ok(Vec::new());
    };
    // The set is read (and parsed) only when its matcher is not compiled yet.
    let matcher = match matchers.cached(group, install) {
        Some(matcher) => matcher,
        None => match read_install(tx, group)? {
            Some(read) if read.position == install => {
                matchers.get(group, install, read.patterns.into_iter())?
            }
            _ => return Ok(Vec::new()),
        },
    };
    let mut matched = Vec::with_capacity(claim.wanted);
    let mut routed_position = to;
    let mut scan = tx.prepare_cached(
        "SELECT position, subject, payload, headers, published_at FROM message \
         WHERE topic = ?1 AND position >= ?2 AND position <= ?3 ORDER BY position",
    )?;
    let mut rows = scan.query(params![at.topic, from, to])?;
    while let Some(row) = rows.next()? {
        let subject = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
        if matcher.matches_str(subject) {
            // The message is read from the row the scan is on: no second lookup by key.
            let position: i64 = row.get(0)?;
            matched.push((
                position,
                MessageRow {
                    subject: subject.to_owned(),
                    payload: row.get(2)?,
                    headers: row.get(3)?,
                    published_at: row.get(4)?,
                },
            ));
            if matched.len() == claim.wanted {
                routed_position = position;
                break;
            }
        }
    }
    drop(rows);
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, \
           attempts, visible_at, claimed_by, claim_token) \
         VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8)",
    )?;
    let mut claimed = Vec::with_capacity(matched.len());
    for (position, message) in matched {
        let inserted = insert.execute(params![
            group.as_str(),
            at.topic,
            position,
            install,
            now,
            claim.visible_at,
            claim.instance,
            claim.token
        ])?;
        // Nothing past the cursor is routed yet; a delivery there all the same is left to the
        // claim statement.
        if inserted == 1 {
            claimed.push(((at.topic.clone(), position, 1, install), message));
        }
    }
    tx.prepare_cached("UPDATE consumer_group SET routed_position = ?2 WHERE group_name = ?1")?
        .execute(params![group.as_str(), routed_position])?;
    Ok(claimed)
}
