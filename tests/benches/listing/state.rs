//! The listing bench's state rows (not events): what a running fleet holds besides its
//! ledger. Worker instances: two rows per fleet group, 1,000 per long group. Queue state: a
//! `consumer_group` row per group (a group gets it at its first declaration attempt, so every
//! declared group has one; the bulk load writes events only), a `topic` row per topic with
//! three messages, and per group three deliveries of them, one claimable, one in flight
//! (claimed) and one backing off, so a listing's queue figures count real rows: without them
//! the figures' statement found no group and did none of its work. `WHARF_BENCH_QUEUE_ROWS=0`
//! leaves the queue rows out, as the bench was before (to compare with its older figures).

use wharf::store::Store;

/// Inserts the fleet's instances and queue state.
pub async fn insert_state(store: &Store) {
    let queue_rows = std::env::var("WHARF_BENCH_QUEUE_ROWS").map_or(true, |v| v != "0");
    let count = if queue_rows { PG_STATE.len() } else { 1 };
    match store {
        Store::Postgres(s) => {
            for statement in &PG_STATE[..count] {
                sqlx::query(statement)
                    .execute(s.pool())
                    .await
                    .unwrap_or_else(|e| panic!("{statement}: {e}"));
            }
        }
        Store::Sqlite(s) => s
            .write(move |ctx| {
                for statement in &SQLITE_STATE[..count] {
                    ctx.tx.execute(statement, [ctx.now.timestamp_micros()])?;
                }
                Ok(())
            })
            .await
            .expect("the fleet's state rows"),
    }
}

const PG_STATE: [&str; 5] = [
    "INSERT INTO worker_instance (group_name, declarer, topic, version, patterns, \
     started_at, heartbeat_at) SELECT e.group_name, 'i-' || lpad(j::text, 4, '0'), \
     e.topic, '1.0.0', e.patterns, now(), now() FROM effective_declaration e \
     CROSS JOIN LATERAL generate_series(1, CASE WHEN e.group_name LIKE 'long-%' \
     THEN 1000 ELSE 2 END) j",
    "INSERT INTO topic (name, head) SELECT DISTINCT topic, 3 FROM effective_declaration",
    "INSERT INTO message (topic, position, subject, payload) \
     SELECT t.name, p, t.name || '/bench', '\\x00'::bytea FROM topic t, generate_series(1, 3) p",
    "INSERT INTO consumer_group (group_name, topic, routed_position, claim_floor, \
     routed_install) SELECT group_name, topic, 3, 1, position FROM effective_declaration",
    "INSERT INTO delivery (group_name, topic, position, routed_by, routed_at, attempts, \
     visible_at, claimed_by, claim_token) SELECT e.group_name, e.topic, p, e.position, now(), \
     CASE WHEN p = 1 THEN 0 ELSE 1 END, \
     CASE WHEN p = 1 THEN now() ELSE now() + interval '1 hour' END, \
     CASE WHEN p = 2 THEN 'i-0001' END, CASE WHEN p = 2 THEN 7 END \
     FROM effective_declaration e, generate_series(1, 3) p",
];

const SQLITE_STATE: [&str; 5] = [
    "WITH RECURSIVE n(j) AS (SELECT 1 UNION ALL SELECT j + 1 FROM n \
     WHERE j < 1000) INSERT INTO worker_instance (group_name, declarer, topic, \
     version, patterns, started_at, heartbeat_at) SELECT e.group_name, \
     printf('i-%04d', n.j), e.topic, '1.0.0', e.patterns, ?1, ?1 \
     FROM effective_declaration e JOIN n ON n.j <= CASE WHEN e.group_name \
     LIKE 'long-%' THEN 1000 ELSE 2 END",
    "INSERT INTO topic (name, head, created_at) \
     SELECT DISTINCT topic, 3, ?1 FROM effective_declaration",
    "WITH p(p) AS (VALUES (1), (2), (3)) INSERT INTO message (topic, position, subject, \
     payload, published_at) SELECT t.name, p.p, t.name || '/bench', x'00', ?1 FROM topic t, p",
    "INSERT INTO consumer_group (group_name, topic, created_at, routed_position, \
     routed_install) SELECT group_name, topic, ?1, 3, position FROM effective_declaration",
    "WITH p(p) AS (VALUES (1), (2), (3)) INSERT INTO delivery (group_name, topic, position, \
     routed_by, routed_at, attempts, visible_at, claimed_by, claim_token) \
     SELECT e.group_name, e.topic, p.p, e.position, ?1, CASE WHEN p.p = 1 THEN 0 ELSE 1 END, \
     CASE WHEN p.p = 1 THEN ?1 ELSE ?1 + 3600000000 END, \
     CASE WHEN p.p = 2 THEN 'i-0001' END, CASE WHEN p.p = 2 THEN 7 END \
     FROM effective_declaration e, p",
];
