//! The listing bench's baseline: each read as one plain SQL statement over the projection
//! tables (the ledger for the history), run through the store's own driver and connections,
//! answering the same page as JSON built by the database (Postgres `json_agg`, SQLite
//! `json_group_array`): the strongest thing a user with the schema could write. A page of
//! groups is the same summary the API lists (ADR 0038: bounded counts, the oldest waiter);
//! one group carries its waiters and instances, a page of each.

use sqlx::Row;
use wharf::store::Store;

/// What a baseline statement reads: the listing's parameters in SQL-ready form.
#[derive(Debug, Clone, Default)]
pub struct Read {
    /// A page of groups after this name (`""`: from the first).
    pub after: String,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only groups with an open waiter.
    pub waiting: bool,
    /// One group instead of a page.
    pub group: Option<String>,
    /// Waiters after this (declared_at micros, declarer).
    pub waiters_after: Option<(i64, String)>,
    /// Instances after this declarer.
    pub instances_after: String,
    /// The group's history after this position, instead of its view.
    pub history_after: Option<i64>,
}

/// Page size of every read (groups, members, history entries).
const PAGE: i64 = 100;

/// How far a page's summary counts each group's waiters (the API's cap + 1).
const SUMMARY_FETCH: i64 = 101;

fn pg_sql(read: &Read) -> String {
    if read.history_after.is_some() {
        return "SELECT json_agg(x)::text FROM (SELECT position, sequence, recorded_at, payload \
                FROM events WHERE aggregate_type = 'consumer_group' AND aggregate_id = $1 \
                AND position > $2 ORDER BY position LIMIT 100) x"
            .to_owned();
    }
    let waiter_key = if read.waiters_after.is_some() {
        " AND (a.declared_at, a.declarer) > ($4::timestamptz, $5)"
    } else {
        ""
    };
    let filter = match (&read.group, &read.topic, read.waiting) {
        (Some(_), _, _) => "e.group_name = $1".to_owned(),
        (None, topic, waiting) => {
            let mut f = "e.group_name > $1".to_owned();
            if topic.is_some() {
                f.push_str(" AND e.topic = $3");
            }
            if waiting {
                f.push_str(
                    " AND EXISTS (SELECT 1 FROM declarer_attempt a WHERE a.group_name = \
                     e.group_name AND a.status = 'waiting' AND a.patterns <> e.patterns)",
                );
            }
            f
        }
    };
    if read.group.is_none() {
        return format!(
            "SELECT json_agg(p)::text FROM (SELECT e.group_name, e.topic, e.declarer, e.version, \
               e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs, \
               (SELECT COUNT(*) FROM (SELECT 1 FROM declarer_attempt a \
                  WHERE a.group_name = e.group_name AND a.status = 'waiting' \
                  AND a.patterns <> e.patterns LIMIT {SUMMARY_FETCH}) c) AS waiters, \
               (SELECT row_to_json(w) FROM (SELECT a.declarer, a.version, a.patterns, \
                  a.incumbent, a.declared_at, a.attempt_at FROM declarer_attempt a \
                  WHERE a.group_name = e.group_name AND a.status = 'waiting' \
                  AND a.patterns <> e.patterns ORDER BY a.declared_at, a.declarer LIMIT 1) w) \
                  AS oldest_waiter, \
               (SELECT COUNT(*) FROM worker_instance i WHERE i.group_name = e.group_name) \
                  AS instances, \
               (SELECT COUNT(*) FROM worker_instance i WHERE i.group_name = e.group_name \
                  AND i.heartbeat_at > now() - interval '60 seconds') AS live_instances \
             FROM effective_declaration e WHERE {filter} ORDER BY e.group_name LIMIT $2) p"
        );
    }
    format!(
        "SELECT json_agg(p)::text FROM (SELECT e.group_name, e.topic, e.declarer, e.version, \
           e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, e.installs, \
           (SELECT json_agg(w) FROM (SELECT a.declarer, a.version, a.patterns, a.incumbent, \
              a.declared_at, a.attempt_at FROM declarer_attempt a \
              WHERE a.group_name = e.group_name AND a.status = 'waiting' \
              AND a.patterns <> e.patterns{waiter_key} \
              ORDER BY a.declared_at, a.declarer LIMIT {PAGE}) w) AS waiters, \
           (SELECT json_agg(i) FROM (SELECT i.declarer, i.version, i.patterns, i.started_at, \
              i.heartbeat_at FROM worker_instance i WHERE i.group_name = e.group_name \
              AND i.declarer > $6 ORDER BY i.declarer LIMIT {PAGE}) i) AS instances \
         FROM effective_declaration e WHERE {filter} ORDER BY e.group_name LIMIT $2) p"
    )
}

fn sqlite_sql(read: &Read) -> String {
    if read.history_after.is_some() {
        return "SELECT json_group_array(json_object('position', position, 'sequence', sequence, \
                  'recorded_at', recorded_at, 'payload', json(payload))) FROM (SELECT position, \
                  sequence, recorded_at, payload FROM events WHERE aggregate_type = \
                  'consumer_group' AND aggregate_id = ?1 AND position > ?2 ORDER BY position \
                  LIMIT 100)"
            .to_owned();
    }
    let waiter_key = if read.waiters_after.is_some() {
        " AND (a.declared_at, a.declarer) > (?4, ?5)"
    } else {
        ""
    };
    let filter = match (&read.group, &read.topic, read.waiting) {
        (Some(_), _, _) => "e.group_name = ?1".to_owned(),
        (None, topic, waiting) => {
            let mut f = "e.group_name > ?1".to_owned();
            if topic.is_some() {
                f.push_str(" AND e.topic = ?3");
            }
            if waiting {
                f.push_str(
                    " AND EXISTS (SELECT 1 FROM declarer_attempt a WHERE a.group_name = \
                     e.group_name AND a.status = 'waiting' AND a.patterns <> e.patterns)",
                );
            }
            f
        }
    };
    if read.group.is_none() {
        return format!(
            "SELECT json_group_array(json_object('group', e.group_name, 'topic', e.topic, \
               'declarer', e.declarer, 'version', e.version, 'patterns', json(e.patterns), \
               'previous', json(e.previous), 'declared_at', e.declared_at, 'attempt_at', \
               e.attempt_at, 'position', e.position, 'installs', e.installs, \
               'waiters', (SELECT COUNT(*) FROM (SELECT 1 FROM declarer_attempt a \
                  WHERE a.group_name = e.group_name AND a.status = 'waiting' \
                  AND a.patterns <> e.patterns LIMIT {SUMMARY_FETCH})), \
               'oldest_waiter', (SELECT json_object('declarer', a.declarer, 'version', \
                  a.version, 'patterns', json(a.patterns), 'incumbent', json(a.incumbent), \
                  'declared_at', a.declared_at, 'attempt_at', a.attempt_at) \
                  FROM declarer_attempt a WHERE a.group_name = e.group_name \
                  AND a.status = 'waiting' AND a.patterns <> e.patterns \
                  ORDER BY a.declared_at, a.declarer LIMIT 1), \
               'instances', (SELECT COUNT(*) FROM worker_instance i \
                  WHERE i.group_name = e.group_name), \
               'live_instances', (SELECT COUNT(*) FROM worker_instance i \
                  WHERE i.group_name = e.group_name AND i.heartbeat_at > \
                  CAST(strftime('%s', 'now') AS INTEGER) * 1000000 - 60000000))) \
             FROM (SELECT * FROM effective_declaration e WHERE {filter} ORDER BY e.group_name \
               LIMIT ?2) e"
        );
    }
    format!(
        "SELECT json_group_array(json_object('group', e.group_name, 'topic', e.topic, \
           'declarer', e.declarer, 'version', e.version, 'patterns', json(e.patterns), \
           'previous', json(e.previous), 'declared_at', e.declared_at, 'attempt_at', \
           e.attempt_at, 'position', e.position, 'installs', e.installs, \
           'waiters', (SELECT json_group_array(json_object('declarer', a.declarer, 'version', \
              a.version, 'patterns', json(a.patterns), 'incumbent', json(a.incumbent), \
              'declared_at', a.declared_at, 'attempt_at', a.attempt_at)) FROM (SELECT a.* FROM \
              declarer_attempt a WHERE a.group_name = e.group_name AND a.status = 'waiting' \
              AND a.patterns <> e.patterns{waiter_key} ORDER BY a.declared_at, a.declarer \
              LIMIT {PAGE}) a), \
           'instances', (SELECT json_group_array(json_object('declarer', i.declarer, 'version', \
              i.version, 'patterns', json(i.patterns), 'started_at', i.started_at, \
              'heartbeat_at', i.heartbeat_at)) FROM (SELECT i.* FROM worker_instance i \
              WHERE i.group_name = e.group_name AND i.declarer > ?6 ORDER BY i.declarer \
              LIMIT {PAGE}) i))) \
         FROM (SELECT * FROM effective_declaration e WHERE {filter} ORDER BY e.group_name \
           LIMIT ?2) e"
    )
}

/// Runs the read once; returns the length of the JSON it answered.
pub async fn run(store: &Store, read: &Read) -> usize {
    match store {
        Store::Postgres(s) => {
            let sql = pg_sql(read);
            let query = if let Some(after) = read.history_after {
                sqlx::query(&sql)
                    .bind(read.group.clone().unwrap_or_default())
                    .bind(after)
            } else {
                let (at, declarer) = read.waiters_after.clone().unzip();
                sqlx::query(&sql)
                    .bind(read.group.clone().unwrap_or_else(|| read.after.clone()))
                    .bind(if read.group.is_some() { 1 } else { PAGE })
                    .bind(read.topic.clone())
                    .bind(at.and_then(chrono::DateTime::from_timestamp_micros))
                    .bind(declarer)
                    .bind(read.instances_after.clone())
            };
            let row = query.fetch_one(s.pool()).await.expect("baseline read");
            let json: Option<String> = row.get(0);
            json.map_or(0, |j| j.len())
        }
        Store::Sqlite(s) => {
            let sql = sqlite_sql(read);
            let read = read.clone();
            s.read(move |conn| {
                let mut stmt = conn.prepare_cached(&sql)?;
                let json: String = if let Some(after) = read.history_after {
                    stmt.query_row(
                        rusqlite::params![read.group.clone().unwrap_or_default(), after],
                        |r| r.get(0),
                    )?
                } else {
                    use rusqlite::types::Value;
                    let (at, declarer) = read.waiters_after.clone().unzip();
                    let all: [Value; 6] = [
                        Value::Text(read.group.clone().unwrap_or_else(|| read.after.clone())),
                        Value::Integer(if read.group.is_some() { 1 } else { PAGE }),
                        read.topic.clone().map_or(Value::Null, Value::Text),
                        at.map_or(Value::Null, Value::Integer),
                        declarer.map_or(Value::Null, Value::Text),
                        Value::Text(read.instances_after.clone()),
                    ];
                    // The summary page names fewer parameters than the one-group read.
                    let used = stmt.parameter_count();
                    stmt.query_row(rusqlite::params_from_iter(&all[..used]), |r| r.get(0))?
                };
                Ok(json.len())
            })
            .await
            .expect("baseline read")
        }
    }
}
