//! Routing on SQLite, and applying a swap at the first step after it (see the Postgres twin
//! and `generations.rs` for the rules, ADR 0014). Every step is one write transaction on the
//! single writer, so the install it reads cannot change under it.

use std::sync::Arc;

use rusqlite::{params, OptionalExtension, Transaction};
use wharf_domain::{BindingMatcher, GroupName};
use wharf_store::SqliteStore;

use super::claimed::{MessageRow, RoutedClaim};
use crate::error::QueueError;
use crate::generations::{
    forward_matches, rescan_matches, rescan_start, restorable, split_pending, Generation, History,
    StepRanges,
};
use crate::matchers::Matchers;
use crate::message::{EffectiveInstall, RouteReport, SwapReport};

/// A group's routing state.
struct Cursor {
    topic: String,
    head: i64,
    routed_position: i64,
    routed_install: i64,
    start_position: Option<i64>,
    rescan_position: i64,
    rescan_until: i64,
    /// The install in effect, if any.
    install: Option<i64>,
}

impl Cursor {
    /// True when routing is aligned with the install in effect and no rescan is pending: the
    /// steady state, where a claim may route (ADR 0069).
    fn steady(&self) -> bool {
        self.install == Some(self.routed_install) && self.rescan_position > self.rescan_until
    }
}

/// Routes up to `batch` log positions for `group`.
pub(crate) async fn route(
    store: &SqliteStore,
    matchers: Arc<Matchers>,
    group: &GroupName,
    batch: i64,
    fence: Option<i64>,
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

/// One routing step inside the write transaction.
fn step(
    tx: &Transaction<'_>,
    now: i64,
    matchers: &Matchers,
    group: &GroupName,
    batch: i64,
    fence: Option<i64>,
) -> Result<RouteReport, QueueError> {
    let Some(mut cursor) = read_cursor(tx, group)? else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    let Some(install) = read_install(tx, group)? else {
        return Err(QueueError::UnknownGroup(group.to_string()));
    };
    QueueError::check_fence(group.as_str(), fence, Some(install.position))?;
    let matcher = matchers.get(group, install.position, install.patterns.iter().cloned())?;
    let mut report = RouteReport::default();
    if cursor.routed_install != install.position {
        report.swap = Some(apply(tx, now, group, &mut cursor, &install, &matcher)?);
    }
    let ranges = StepRanges::new(
        cursor.routed_position,
        cursor.head,
        cursor.rescan_position,
        cursor.rescan_until,
        batch,
    );
    let mut matched = Vec::new();
    let mut routed_position = cursor.routed_position;
    if let Some((from, to)) = ranges.forward {
        let slice = read_range(tx, &cursor.topic, from, to)?;
        matched = forward_matches(&matcher, &slice);
        routed_position = to;
        report.scanned = (to - from + 1) as u64;
    }
    let mut rescan_position = cursor.rescan_position;
    if let Some((from, to)) = ranges.rescan {
        let slice = read_range(tx, &cursor.topic, from, to)?;
        if !slice.is_empty() {
            let history = history(tx, matchers, group, install.position, from, to)?;
            matched.extend(rescan_matches(&matcher, &history, &slice));
        }
        rescan_position = to + 1;
        report.rescanned = (to - from + 1) as u64;
        report.rescan_pending = to < cursor.rescan_until;
    }
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, visible_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
    )?;
    for position in &matched {
        insert.execute(params![
            group.as_str(),
            cursor.topic,
            position,
            install.position,
            now
        ])?;
    }
    tx.prepare_cached(
        "UPDATE consumer_group SET routed_position = ?2, rescan_position = ?3 WHERE group_name = ?1",
    )?
    .execute(params![group.as_str(), routed_position, rescan_position])?;
    report.routed = matched.len() as u64;
    report.position = routed_position;
    Ok(report)
}

/// The log rows of `topic` in `from..=until` (at most a batch of positions), in position order
/// (bounded by position, as on Postgres).
fn read_range(
    tx: &Transaction<'_>,
    topic: &str,
    from: i64,
    until: i64,
) -> Result<Vec<(i64, String)>, QueueError> {
    Ok(tx
        .prepare_cached(
            "SELECT position, subject FROM message WHERE topic = ?1 AND position >= ?2 \
               AND position <= ?3 ORDER BY position",
        )?
        .query_map(params![topic, from, until], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?)
}

fn read_cursor(tx: &Transaction<'_>, group: &GroupName) -> Result<Option<Cursor>, QueueError> {
    Ok(tx
        .prepare_cached(
            "SELECT g.topic, g.routed_position, g.routed_install, g.start_position, \
               g.rescan_position, g.rescan_until, \
               COALESCE((SELECT t.head FROM topic t WHERE t.name = g.topic), 0), \
               (SELECT e.position FROM effective_declaration e WHERE e.group_name = g.group_name) \
             FROM consumer_group g WHERE g.group_name = ?1",
        )?
        .query_row([group.as_str()], |row| {
            Ok(Cursor {
                head: row.get(6)?,
                topic: row.get(0)?,
                routed_position: row.get(1)?,
                routed_install: row.get(2)?,
                start_position: row.get(3)?,
                rescan_position: row.get(4)?,
                rescan_until: row.get(5)?,
                install: row.get(7)?,
            })
        })
        .optional()?)
}

fn read_install(
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

/// Aligns the group's routing with `install` (see the Postgres twin).
fn apply(
    tx: &Transaction<'_>,
    now: i64,
    group: &GroupName,
    cursor: &mut Cursor,
    install: &EffectiveInstall,
    matcher: &BindingMatcher,
) -> Result<SwapReport, QueueError> {
    let g = group.as_str();
    let start = cursor.start_position.unwrap_or(cursor.routed_position + 1);
    tx.execute(
        "UPDATE route_generation SET through_position = ?3, rescan_through = ?4 \
         WHERE group_name = ?1 AND install = ?2 AND through_position IS NULL",
        params![
            g,
            cursor.routed_install,
            cursor.routed_position,
            (cursor.rescan_position - 1).min(cursor.rescan_until)
        ],
    )?;
    let pending = tx
        .prepare(
            "SELECT d.position, m.subject FROM delivery d \
             LEFT JOIN message m ON m.topic = d.topic AND m.position = d.position \
             WHERE d.group_name = ?1 AND d.routed_by <> ?2",
        )?
        .query_map(params![g, install.position], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let (kept, aside) = split_pending(matcher, &pending);
    let mut restamp =
        tx.prepare("UPDATE delivery SET routed_by = ?3 WHERE group_name = ?1 AND position = ?2")?;
    for position in &kept {
        restamp.execute(params![g, position, install.position])?;
    }
    let mut park = tx.prepare(
        "INSERT OR IGNORE INTO set_aside (group_name, topic, position, routed_by, routed_at, \
           attempts, visible_at, claimed_by, claim_token, last_error, set_aside_by, set_aside_at) \
         SELECT group_name, topic, position, routed_by, routed_at, attempts, visible_at, \
           claimed_by, claim_token, last_error, ?3, ?4 \
         FROM delivery WHERE group_name = ?1 AND position = ?2",
    )?;
    let mut unroute = tx.prepare("DELETE FROM delivery WHERE group_name = ?1 AND position = ?2")?;
    for position in &aside {
        park.execute(params![g, position, install.position, now])?;
        unroute.execute(params![g, position])?;
    }
    let parked = tx
        .prepare(
            "SELECT s.position, m.subject FROM set_aside s \
             JOIN message m ON m.topic = s.topic AND m.position = s.position \
             WHERE s.group_name = ?1",
        )?
        .query_map([g], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let restore = restorable(matcher, &parked);
    let mut back = tx.prepare(
        "INSERT OR IGNORE INTO delivery (group_name, topic, position, routed_by, routed_at, \
           attempts, visible_at, claimed_by, claim_token, last_error) \
         SELECT group_name, topic, position, ?3, routed_at, attempts, visible_at, claimed_by, \
           claim_token, last_error FROM set_aside WHERE group_name = ?1 AND position = ?2",
    )?;
    let mut unpark = tx.prepare("DELETE FROM set_aside WHERE group_name = ?1 AND position = ?2")?;
    for position in &restore {
        back.execute(params![g, position, install.position])?;
        unpark.execute(params![g, position])?;
    }
    let oldest: Option<i64> = tx.query_row(
        "SELECT MIN(position) FROM message WHERE topic = ?1",
        [&cursor.topic],
        |row| row.get(0),
    )?;
    let report = SwapReport {
        install: install.position,
        kept: kept.len() as u64,
        set_aside: aside.len() as u64,
        restored: restore.len() as u64,
        rescan_from: rescan_start(start, oldest, cursor.routed_position),
        rescan_until: cursor.routed_position,
    };
    tx.execute(
        "INSERT OR IGNORE INTO route_generation (group_name, install, patterns, from_position, \
           rescan_from, set_aside, restored, kept, applied_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            g,
            install.position,
            serde_json::to_string(&install.patterns)?,
            cursor.routed_position + 1,
            report.rescan_from,
            report.set_aside as i64,
            report.restored as i64,
            report.kept as i64,
            now
        ],
    )?;
    tx.execute(
        "UPDATE consumer_group SET start_position = ?2, routed_install = ?3, \
           rescan_position = ?4, rescan_until = ?5 WHERE group_name = ?1",
        params![
            g,
            start,
            install.position,
            report.rescan_from,
            report.rescan_until
        ],
    )?;
    report.log(g);
    cursor.start_position = Some(start);
    cursor.routed_install = install.position;
    cursor.rescan_position = report.rescan_from;
    cursor.rescan_until = report.rescan_until;
    Ok(report)
}

/// The earlier installs whose ranges overlap `first..=last`, with their compiled sets.
fn history(
    tx: &Transaction<'_>,
    matchers: &Matchers,
    group: &GroupName,
    current: i64,
    first: i64,
    last: i64,
) -> Result<History, QueueError> {
    let rows = tx
        .prepare_cached(
            "SELECT install, patterns, from_position, through_position, rescan_from, \
               rescan_through FROM route_generation \
             WHERE group_name = ?1 AND install <> ?2 AND through_position IS NOT NULL \
               AND ((from_position <= ?4 AND through_position >= ?3) \
                 OR (rescan_from <= ?4 AND rescan_through >= ?3))",
        )?
        .query_map(params![group.as_str(), current, first, last], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                (row.get::<_, i64>(2)?, row.get::<_, i64>(3)?),
                (row.get::<_, i64>(4)?, row.get::<_, i64>(5)?),
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut generations = Vec::with_capacity(rows.len());
    for (install, patterns, forward, rescan) in rows {
        let patterns: Vec<String> = serde_json::from_str(&patterns)?;
        generations.push(Generation {
            forward,
            rescan,
            matcher: matchers.get(group, install, patterns.into_iter())?,
        });
    }
    Ok(History(generations))
}

/// A reader-side look: the cursor when the group is caught up, aligned with its install and
/// done rescanning, so an idle poll takes no write transaction; with a fence, `Fenced` when the
/// install is not the fenced one.
async fn caught_up(
    store: &SqliteStore,
    group: &GroupName,
    fence: Option<i64>,
) -> Result<Option<i64>, QueueError> {
    let name = group.clone();
    let row: Option<(i64, i64, bool, Option<i64>)> = store
        .read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT g.routed_position, COALESCE(t.head, 0), \
                       g.routed_install = COALESCE(e.position, g.routed_install) \
                       AND g.rescan_position > g.rescan_until, e.position \
                     FROM consumer_group g LEFT JOIN topic t ON t.name = g.topic \
                     LEFT JOIN effective_declaration e ON e.group_name = g.group_name \
                     WHERE g.group_name = ?1",
                )?
                .query_row([name.as_str()], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                })
                .optional()?)
        })
        .await?;
    let Some((routed, head, aligned, install)) = row else {
        return Ok(None);
    };
    QueueError::check_fence(group.as_str(), fence, install)?;
    Ok((aligned && routed >= head).then_some(routed))
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
    pub fence: Option<i64>,
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
    let Some(at) = read_cursor(tx, group)? else {
        return Ok(Vec::new());
    };
    let install = at.routed_install;
    if !at.steady() || claim.fence.is_some_and(|fence| fence != install) || claim.wanted == 0 {
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
