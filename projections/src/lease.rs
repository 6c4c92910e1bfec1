//! The session-lease projector (inline) and its reads: each exclusive session's HA lease as of
//! its newest lease event (ADR 0028, ADR 0030).
//!
//! `session_lease` has one row per durable session identity whose lease stream has an event:
//! the owner (NULL when free), its token (or the last token issued), its TTL and its expiry by
//! the store's clock, and the stream's newest sequence. The row is exactly the fold of the
//! stream up to that sequence, so a process starts deciding from it instead of reading every
//! renew ever made; the fencing guard of the session's ledger writes reads it in the write's
//! own lock statement. On Postgres the row change rides in the event's insert statement; a
//! rebuild replays through `apply`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{params, Transaction};
use serde::Serialize;
use sqlx::PgConnection;
use wharf_domain::lease::{
    FencingToken, Lease, LeaseEvent, LeaseHolder, Ownership, LEASE_AGGREGATE,
};
use wharf_store::{
    CteStatement, EventRef, PgProjector, RecordedEvent, SqliteProjector, Store, StoreError,
};

/// Inline projector of `session_lease`.
pub struct SessionLeases;

impl SessionLeases {
    /// The projector's name.
    pub const NAME: &'static str = "session_leases";
    const TABLES: &'static [&'static str] = &["session_lease"];
}

/// Decodes a lease event, or `None` for events of other aggregates.
fn lease_event(event: &EventRef<'_>) -> Result<Option<LeaseEvent>, StoreError> {
    if event.aggregate_type != LEASE_AGGREGATE {
        return Ok(None);
    }
    LeaseEvent::decode(event.event_type, event.payload.get())
        .map(Some)
        .map_err(|e| StoreError::decode(event.position.unwrap_or(0), e))
}

fn token_column(token: FencingToken) -> Result<i64, StoreError> {
    i64::try_from(token.get())
        .map_err(|_| StoreError::Task(format!("fencing token {token} is beyond BIGINT")))
}

fn ttl_column(ttl_ms: u64) -> Result<i64, StoreError> {
    i64::try_from(ttl_ms)
        .map_err(|_| StoreError::Task(format!("lease ttl {ttl_ms}ms is beyond BIGINT")))
}

impl SqliteProjector for SessionLeases {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[LEASE_AGGREGATE])
    }

    fn apply(&self, tx: &Transaction<'_>, event: &RecordedEvent) -> Result<(), StoreError> {
        let Some(decoded) = lease_event(&event.as_ref())? else {
            return Ok(());
        };
        let (session, sequence, position) =
            (event.aggregate_id.as_str(), event.sequence, event.position);
        match &decoded {
            LeaseEvent::Acquired {
                holder,
                token,
                ttl_ms,
                expires_at,
            } => {
                tx.prepare_cached(
                    "INSERT INTO session_lease (session_id, holder, token, ttl_ms, expires_at, \
                     last_sequence, last_position) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                     ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, \
                     token = excluded.token, ttl_ms = excluded.ttl_ms, \
                     expires_at = excluded.expires_at, last_sequence = excluded.last_sequence, \
                     last_position = excluded.last_position",
                )?
                .execute(params![
                    session,
                    holder.as_str(),
                    token_column(*token)?,
                    ttl_column(*ttl_ms)?,
                    expires_at.timestamp_micros(),
                    sequence,
                    position
                ])?;
            }
            LeaseEvent::Renewed { expires_at, .. } => {
                tx.prepare_cached(
                    "UPDATE session_lease SET expires_at = ?2, last_sequence = ?3, \
                     last_position = ?4 WHERE session_id = ?1",
                )?
                .execute(params![
                    session,
                    expires_at.timestamp_micros(),
                    sequence,
                    position
                ])?;
            }
            LeaseEvent::Released { .. } | LeaseEvent::Expired { .. } => {
                tx.prepare_cached(
                    "UPDATE session_lease SET holder = NULL, ttl_ms = NULL, expires_at = NULL, \
                     last_sequence = ?2, last_position = ?3 WHERE session_id = ?1",
                )?
                .execute(params![session, sequence, position])?;
            }
            LeaseEvent::Lost { .. } => {
                tx.prepare_cached(
                    "INSERT INTO session_lease (session_id, token, last_sequence, last_position) \
                     VALUES (?1, 0, ?2, ?3) ON CONFLICT (session_id) DO UPDATE SET \
                     last_sequence = excluded.last_sequence, last_position = excluded.last_position",
                )?
                .execute(params![session, sequence, position])?;
            }
        }
        Ok(())
    }
}

impl SessionLeases {
    /// Adds the event's row change to `statement` as a CTE; false for other aggregates' events.
    fn pg_rows(
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        let Some(decoded) = lease_event(event)? else {
            return Ok(false);
        };
        let session = statement.bind(event.aggregate_id.to_owned())?;
        let sequence = statement.bind(event.sequence)?;
        let sql = match &decoded {
            LeaseEvent::Acquired {
                holder,
                token,
                ttl_ms,
                expires_at,
            } => {
                let holder = statement.bind(holder.as_str().to_owned())?;
                let token = statement.bind(token_column(*token)?)?;
                let ttl = statement.bind(ttl_column(*ttl_ms)?)?;
                let expires = statement.bind(*expires_at)?;
                format!(
                    "INSERT INTO session_lease (session_id, holder, token, ttl_ms, expires_at, \
                     last_sequence, last_position) \
                     VALUES ({session}, {holder}, {token}, {ttl}, {expires}, {sequence}, {position}) \
                     ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, \
                     token = excluded.token, ttl_ms = excluded.ttl_ms, \
                     expires_at = excluded.expires_at, last_sequence = excluded.last_sequence, \
                     last_position = excluded.last_position"
                )
            }
            LeaseEvent::Renewed { expires_at, .. } => {
                let expires = statement.bind(*expires_at)?;
                format!(
                    "UPDATE session_lease SET expires_at = {expires}, last_sequence = {sequence}, \
                     last_position = {position} WHERE session_id = {session}"
                )
            }
            LeaseEvent::Released { .. } | LeaseEvent::Expired { .. } => format!(
                "UPDATE session_lease SET holder = NULL, ttl_ms = NULL, expires_at = NULL, \
                 last_sequence = {sequence}, last_position = {position} \
                 WHERE session_id = {session}"
            ),
            LeaseEvent::Lost { .. } => format!(
                "INSERT INTO session_lease (session_id, token, last_sequence, last_position) \
                 VALUES ({session}, 0, {sequence}, {position}) ON CONFLICT (session_id) \
                 DO UPDATE SET last_sequence = excluded.last_sequence, \
                 last_position = excluded.last_position"
            ),
        };
        statement.cte("lease_row", &sql);
        Ok(true)
    }
}

#[async_trait]
impl PgProjector for SessionLeases {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[LEASE_AGGREGATE])
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        crate::fused::apply_as_ctes(conn, event, Self::pg_rows).await
    }

    fn fuse(
        &self,
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        // Everything this projector writes for the event is now in the statement (nothing,
        // for an event it ignores): there is nothing to apply afterwards.
        Self::pg_rows(event, position, statement)?;
        Ok(true)
    }
}

/// One session's lease row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseRow {
    /// The durable session identity.
    pub session_id: String,
    /// The owner; null when free (released, or its expiry observed: an expired owner stays
    /// until then).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub holder: Option<String>,
    /// The owner's token, or the last token issued when free.
    pub token: u64,
    /// The owner's TTL in milliseconds.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub ttl_ms: Option<u64>,
    /// The owner's expiry, by the store's clock.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub expires_at: Option<DateTime<Utc>>,
    /// The lease stream's newest sequence: the row is its fold up to here.
    pub last_sequence: i64,
    /// The ledger position of the newest lease event.
    pub last_position: i64,
}

impl LeaseRow {
    /// The lease state this row is the fold of. A row the projector could not have written
    /// (an owner without a TTL or an expiry, a holder that does not parse) is an error.
    pub fn state(&self) -> Result<Lease, StoreError> {
        let corrupt = |what: &str| {
            StoreError::Task(format!(
                "the session_lease row of {} is inconsistent: {what}",
                self.session_id
            ))
        };
        let owner = match (&self.holder, self.ttl_ms, self.expires_at) {
            (None, _, _) => None,
            (Some(holder), Some(ttl_ms), Some(expires_at)) => Some(Ownership {
                holder: LeaseHolder::parse("holder", holder)
                    .map_err(|e| corrupt(&e.to_string()))?,
                token: FencingToken(self.token),
                ttl_ms,
                expires_at,
            }),
            (Some(_), _, _) => return Err(corrupt("an owner without a ttl or an expiry")),
        };
        Ok(Lease {
            owner,
            last_token: FencingToken(self.token),
        })
    }
}

type RawRow = (
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<DateTime<Utc>>,
    i64,
    i64,
);

fn row_of(raw: RawRow) -> Result<LeaseRow, StoreError> {
    let (session_id, holder, token, ttl_ms, expires_at, last_sequence, last_position) = raw;
    let unsigned = |v: i64, what: &str| {
        u64::try_from(v).map_err(|_| StoreError::Task(format!("negative {what} in session_lease")))
    };
    Ok(LeaseRow {
        session_id,
        holder,
        token: unsigned(token, "token")?,
        ttl_ms: ttl_ms.map(|t| unsigned(t, "ttl_ms")).transpose()?,
        expires_at,
        last_sequence,
        last_position,
    })
}

const LEASE_COLUMNS: &str =
    "session_id, holder, token, ttl_ms, expires_at, last_sequence, last_position";

/// The lease rows of one session (by its durable identity) or of all, by session id.
pub async fn session_leases(
    store: &Store,
    session_id: Option<&str>,
) -> Result<Vec<LeaseRow>, StoreError> {
    let id = session_id.map(str::to_owned);
    let raw: Vec<RawRow> = match store {
        Store::Sqlite(s) => {
            s.read(move |conn| {
                let sql = format!(
                    "SELECT {LEASE_COLUMNS} FROM session_lease \
                     WHERE ?1 IS NULL OR session_id = ?1 ORDER BY session_id"
                );
                let mut statement = conn.prepare_cached(&sql)?;
                let rows = statement
                    .query_map([&id], |r| {
                        let micros: Option<i64> = r.get(4)?;
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            micros.and_then(DateTime::from_timestamp_micros),
                            r.get(5)?,
                            r.get(6)?,
                        ))
                    })?
                    .collect::<Result<Vec<RawRow>, _>>()?;
                Ok(rows)
            })
            .await?
        }
        Store::Postgres(s) => {
            sqlx::query_as(&format!(
                "SELECT {LEASE_COLUMNS} FROM session_lease \
                 WHERE $1::text IS NULL OR session_id = $1 ORDER BY session_id"
            ))
            .bind(&id)
            .fetch_all(s.pool())
            .await?
        }
    };
    raw.into_iter().map(row_of).collect()
}
