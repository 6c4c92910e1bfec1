//! Benchmark: what a SQLite claim costs the one writer, by shape, with no runtime around it
//! (ADR 0069). One thread, one connection, WAL and `synchronous=FULL` as the store opens them,
//! Wharf's `delivery` and `message` tables; two claimers' calls alternate as the
//! `consumer_runtime` bench's two claim loops do, each call settling the previous batch's ten
//! acks and claiming ten, until 20k matching messages of 40k are done. Shapes:
//!
//! - **plain**: the one-statement claim-and-delete of `consumer_runtime`'s baseline;
//! - **routed ahead**: the claim statement over deliveries routing steps of 1,000 positions
//!   inserted (three writes per delivery: inserted, claimed, deleted; the shape before ADR
//!   0069, whose router kept a batch routed ahead);
//! - **routed by the claim**: the claim scans the log itself, inserts what it takes already
//!   claimed and reads those messages from the rows it scanned (two writes per delivery, one
//!   read of each message; ADR 0069).
//!
//! Each prints messages per second and its ratio to plain, measured in the same run, in
//! alternating rounds. Run: `cargo bench -p wharf-tests --bench sqlite_claim_shapes`
//! (`WHARF_BENCH_SCALE` scales the 20k).

use std::time::Instant;

use rusqlite::{params, Connection};

mod support;
use support::scaled;

const ROUNDS: usize = 3;
const BATCH: usize = 10;
const ROUTE_BATCH: i64 = 1_000;
const GROUP: &str = "bench-group";
const INSTANCES: [&str; 2] = ["bench-host:4242:7f3a9c21/1", "bench-host:4242:7f3a9c21/2"];
const VISIBILITY: i64 = 30_000_000;

const SCHEMA: &str = "
    CREATE TABLE message (topic TEXT NOT NULL, position INTEGER NOT NULL, subject TEXT NOT NULL,
      payload BLOB NOT NULL, headers TEXT NOT NULL DEFAULT '{}', published_at INTEGER NOT NULL,
      PRIMARY KEY (topic, position)) WITHOUT ROWID;
    CREATE TABLE delivery (group_name TEXT NOT NULL, topic TEXT NOT NULL,
      position INTEGER NOT NULL, routed_by INTEGER NOT NULL, routed_at INTEGER NOT NULL,
      attempts INTEGER NOT NULL DEFAULT 0, visible_at INTEGER NOT NULL, claimed_by TEXT,
      claim_token INTEGER, last_error TEXT, PRIMARY KEY (group_name, position)) WITHOUT ROWID;
    CREATE TABLE cursor (group_name TEXT PRIMARY KEY, routed_position INTEGER NOT NULL);
    CREATE TABLE plain_queue (id INTEGER PRIMARY KEY, subject TEXT, payload BLOB,
      visible_at INTEGER, attempts INTEGER);";

const CLAIM: &str = "UPDATE delivery SET attempts = attempts + 1, claimed_by = ?2, \
       claim_token = ?3, visible_at = ?4 + ?5 \
     WHERE group_name = ?1 AND position IN (SELECT position FROM delivery \
       WHERE group_name = ?1 AND visible_at <= ?4 ORDER BY position LIMIT ?6) \
     RETURNING topic, position";
const ACK: &str = "DELETE FROM delivery WHERE group_name = ?1 AND position = ?2 \
     AND claim_token = ?3";
const READ: &str = "SELECT subject, payload, headers, published_at FROM message \
     WHERE topic = ?1 AND position = ?2";
const STEP_SCAN: &str = "SELECT position, subject FROM message WHERE topic = 't' \
     AND position > ?1 AND position <= ?2 ORDER BY position";
const SCAN: &str = "SELECT position, subject, payload, headers, published_at FROM message \
     WHERE topic = 't' AND position > ?1 AND position <= ?2 ORDER BY position";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    Plain,
    RoutedAhead,
    RoutedByTheClaim,
}

/// Half the subjects match: `sensors/{even}/temp`.
fn matches(subject: &str) -> bool {
    let n: u32 = subject
        .split('/')
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    n & 1 == 0
}

fn store(dir: &std::path::Path, matched: i64) -> Connection {
    let mut conn = Connection::open(dir.join("shapes.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let payload = vec![7u8; 64];
        let mut log = tx
            .prepare("INSERT INTO message VALUES ('t', ?1, ?2, ?3, '{}', 1)")
            .unwrap();
        let mut plain = tx
            .prepare("INSERT INTO plain_queue (subject, payload, visible_at, attempts) VALUES (?1, ?2, 0, 0)")
            .unwrap();
        for i in 1..=2 * matched {
            let subject = format!("sensors/{}/temp", i % 200);
            log.execute(params![i, subject, payload]).unwrap();
            if matches(&subject) {
                plain.execute(params![subject, payload]).unwrap();
            }
        }
        tx.execute("INSERT INTO cursor VALUES (?1, 0)", [GROUP])
            .unwrap();
    }
    tx.commit().unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    conn
}

/// One plain call: claims and deletes up to ten; how many.
fn plain_call(conn: &Connection) -> usize {
    conn.prepare_cached(
        "DELETE FROM plain_queue WHERE id IN (SELECT id FROM plain_queue WHERE visible_at <= 5 \
           ORDER BY id LIMIT ?1) RETURNING id, subject, payload",
    )
    .unwrap()
    .query_map([BATCH as i64], |row| {
        let _: (i64, String, Vec<u8>) = (row.get(0)?, row.get(1)?, row.get(2)?);
        Ok(())
    })
    .unwrap()
    .count()
}

/// A routing step of its own: up to [`ROUTE_BATCH`] positions; how many it scanned.
fn route_step(conn: &Connection) -> usize {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let routed: i64 = conn
        .query_row("SELECT routed_position FROM cursor", [], |row| row.get(0))
        .unwrap();
    let slice: Vec<(i64, String)> = conn
        .prepare_cached(STEP_SCAN)
        .unwrap()
        .query_map(params![routed, routed + ROUTE_BATCH], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, \
               visible_at) VALUES (?1, 't', ?2, 1, 1, 0)",
        )
        .unwrap();
    for (position, subject) in &slice {
        if matches(subject) {
            insert.execute(params![GROUP, position]).unwrap();
        }
    }
    let to = slice.last().map_or(routed, |row| row.0);
    conn.execute("UPDATE cursor SET routed_position = ?1", [to])
        .unwrap();
    conn.execute_batch("COMMIT").unwrap();
    slice.len()
}

/// The claim's own scan: routes up to ten matches (or [`ROUTE_BATCH`] positions), inserted
/// claimed, and moves the cursor to where it stopped; their positions.
fn route_into_claim(
    conn: &Connection,
    head: i64,
    instance: &str,
    token: i64,
    now: i64,
) -> Vec<i64> {
    let routed: i64 = conn
        .prepare_cached("SELECT routed_position FROM cursor")
        .unwrap()
        .query_row([], |row| row.get(0))
        .unwrap();
    let (mut taken, mut last) = (Vec::with_capacity(BATCH), routed + ROUTE_BATCH);
    let mut scan = conn.prepare_cached(SCAN).unwrap();
    let mut rows = scan.query(params![routed, routed + ROUTE_BATCH]).unwrap();
    while let Some(row) = rows.next().unwrap() {
        let position: i64 = row.get(0).unwrap();
        if matches(row.get_ref(1).unwrap().as_str().unwrap()) {
            // The message is read from the row the scan is on.
            let _: (String, Vec<u8>, String, i64) = (
                row.get(1).unwrap(),
                row.get(2).unwrap(),
                row.get(3).unwrap(),
                row.get(4).unwrap(),
            );
            taken.push(position);
            if taken.len() == BATCH {
                last = position;
                break;
            }
        }
    }
    drop(rows);
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, attempts, \
               visible_at, claimed_by, claim_token) VALUES (?1, 't', ?2, 1, ?3, 1, ?4, ?5, ?6)",
        )
        .unwrap();
    for position in &taken {
        insert
            .execute(params![
                GROUP,
                position,
                now,
                now + VISIBILITY,
                instance,
                token
            ])
            .unwrap();
    }
    conn.prepare_cached("UPDATE cursor SET routed_position = ?1")
        .unwrap()
        .execute([last.min(head)])
        .unwrap();
    taken
}

/// What one claimer's call works with.
struct Call<'a> {
    shape: Shape,
    /// The last log position.
    head: i64,
    /// Which claimer.
    turn: usize,
    /// `(position, token)` of its previous batch.
    acks: &'a [(i64, i64)],
    now: i64,
}

/// One claimer's call in one transaction: settles its acks, claims up to ten (routing them
/// itself in [`Shape::RoutedByTheClaim`] when the routed deliveries run short) and reads their
/// messages; the claimed positions.
fn claim_call(conn: &Connection, call: &Call<'_>) -> Vec<i64> {
    let Call {
        shape,
        head,
        turn,
        acks,
        now,
    } = *call;
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut ack = conn.prepare_cached(ACK).unwrap();
    for (position, token) in acks {
        assert_eq!(ack.execute(params![GROUP, position, token]).unwrap(), 1);
    }
    let token = now * 2 + turn as i64;
    let mut claimed: Vec<i64> = conn
        .prepare_cached(CLAIM)
        .unwrap()
        .query_map(
            params![GROUP, INSTANCES[turn], token, now, VISIBILITY, BATCH as i64],
            |row| row.get(1),
        )
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    claimed.sort_unstable();
    let mut read = conn.prepare_cached(READ).unwrap();
    for position in &claimed {
        let _: (String, Vec<u8>, String, i64) = read
            .query_row(params!["t", position], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .unwrap();
    }
    if shape == Shape::RoutedByTheClaim && claimed.len() < BATCH {
        claimed.extend(route_into_claim(conn, head, INSTANCES[turn], token, now));
    }
    conn.execute_batch("COMMIT").unwrap();
    claimed
}

/// Drains the group in `shape`; messages per second.
fn drain(conn: &Connection, shape: Shape, matched: i64) -> f64 {
    let start = Instant::now();
    let mut done = 0i64;
    if shape == Shape::Plain {
        loop {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            let n = plain_call(conn);
            conn.execute_batch("COMMIT").unwrap();
            if n == 0 {
                break;
            }
            done += n as i64;
        }
    } else {
        let mut held: [Vec<(i64, i64)>; 2] = [Vec::new(), Vec::new()];
        let (mut turn, mut now, head) = (0usize, 1_000i64, 2 * matched);
        loop {
            now += 1;
            let acks = std::mem::take(&mut held[turn]);
            done += acks.len() as i64;
            let last = done >= matched && held.iter().all(Vec::is_empty);
            let call = Call {
                shape,
                head,
                turn,
                acks: &acks,
                now,
            };
            let claimed = claim_call(conn, &call);
            if last {
                // The last acks: nothing was left to claim.
                assert!(claimed.is_empty());
                break;
            }
            if shape == Shape::RoutedAhead && claimed.len() < BATCH {
                route_step(conn);
            }
            held[turn] = claimed
                .iter()
                .map(|p| (*p, now * 2 + turn as i64))
                .collect();
            turn ^= 1;
        }
    }
    assert_eq!(
        done, matched,
        "{shape:?} drained every matching message once"
    );
    matched as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let matched = i64::try_from(scaled(20_000)).unwrap();
    let shapes = [Shape::Plain, Shape::RoutedAhead, Shape::RoutedByTheClaim];
    let mut rates = vec![Vec::new(); shapes.len()];
    for round in 0..ROUNDS {
        for (i, shape) in shapes.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let conn = store(dir.path(), matched);
            let rate = drain(&conn, *shape, matched);
            println!(
                "round {} {:<20} {rate:>8.0} msg/s",
                round + 1,
                format!("{shape:?}")
            );
            rates[i].push(rate);
        }
    }
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let plain = mean(&rates[0]);
    for (shape, rates) in shapes.iter().zip(&rates) {
        println!(
            "{:<20} mean {:>8.0} msg/s = {:.2} of plain",
            format!("{shape:?}"),
            mean(rates),
            mean(rates) / plain
        );
    }
}
