//! The session-lease projector (inline) and its reads: each exclusive session's HA lease as of
//! its newest lease event (ADR 0028, ADR 0030).
//!
//! `session_lease` has one row per durable session identity whose lease stream has an event:
//! the owner (NULL when free), its token (or the last token issued), its TTL and its expiry by
//! the store's clock, and the stream's newest sequence. The row is exactly the fold of the
//! stream up to that sequence, so a process starts deciding from it instead of reading every
//! renew ever made; the fencing guard of the session's ledger writes reads it in the write's
//! own lock statement. On Postgres the row change rides in the event's insert statement; a
//! rebuild folds the same change into its image of the table (ADR 0077).

use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_domain::lease::{
    FencingToken, Lease, LeaseEvent, LeaseHolder, Ownership, LEASE_AGGREGATE,
};
use wharf_store::projector::{Column, EventView, OnConflict, RowChange, RowProjector, Value};
use wharf_store::rebuild::Decoded;
use wharf_store::{Store, StoreError};

/// Inline projector of `session_lease`.
pub struct SessionLeases;

impl SessionLeases {
    /// The projector's name.
    pub const NAME: &'static str = "session_leases";
    const TABLES: &'static [&'static str] = &["session_lease"];
}

const LEASE_KEY: &[Column] = &["session_id"];

fn token_column(token: FencingToken) -> Result<i64, StoreError> {
    i64::try_from(token.get())
        .map_err(|_| StoreError::Task(format!("fencing token {token} is beyond BIGINT")))
}

fn ttl_column(ttl_ms: u64) -> Result<i64, StoreError> {
    i64::try_from(ttl_ms)
        .map_err(|_| StoreError::Task(format!("lease ttl {ttl_ms}ms is beyond BIGINT")))
}

impl RowProjector for SessionLeases {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[LEASE_AGGREGATE])
    }

    fn changes(
        &self,
        event: &EventView<'_>,
        decoded: &mut Decoded,
        changes: &mut Vec<RowChange>,
    ) -> Result<(), StoreError> {
        if event.aggregate_type != LEASE_AGGREGATE {
            return Ok(());
        }
        let decoded = event.decode_with(decoded, LeaseEvent::decode)?;
        let session = Value::text(event.aggregate_id);
        let sequence = Value::Int(event.sequence);
        let change = match decoded {
            LeaseEvent::Acquired {
                holder,
                token,
                ttl_ms,
                expires_at,
            } => RowChange::Upsert {
                table: "session_lease",
                key: LEASE_KEY,
                columns: &[
                    "holder",
                    "token",
                    "ttl_ms",
                    "expires_at",
                    "last_sequence",
                    "last_position",
                ],
                values: vec![
                    session,
                    Value::text(holder.as_str()),
                    Value::Int(token_column(*token)?),
                    Value::Int(ttl_column(*ttl_ms)?),
                    Value::Time(*expires_at),
                    sequence,
                    Value::Position,
                ],
                on_conflict: OnConflict::SET,
            },
            LeaseEvent::Renewed { expires_at, .. } => RowChange::Update {
                table: "session_lease",
                key: LEASE_KEY,
                columns: &["expires_at", "last_sequence", "last_position"],
                values: vec![session, Value::Time(*expires_at), sequence, Value::Position],
            },
            LeaseEvent::Released { .. } | LeaseEvent::Expired { .. } => RowChange::Update {
                table: "session_lease",
                key: LEASE_KEY,
                columns: &[
                    "holder",
                    "ttl_ms",
                    "expires_at",
                    "last_sequence",
                    "last_position",
                ],
                values: vec![
                    session,
                    Value::Null,
                    Value::Null,
                    Value::Null,
                    sequence,
                    Value::Position,
                ],
            },
            // A lost lease on a session with no row yet starts it with token 0.
            LeaseEvent::Lost { .. } => RowChange::Upsert {
                table: "session_lease",
                key: LEASE_KEY,
                columns: &["token", "last_sequence", "last_position"],
                values: vec![session, Value::Int(0), sequence, Value::Position],
                on_conflict: OnConflict::Update {
                    keep: &["token"],
                    counter: None,
                    if_greater: None,
                },
            },
        };
        changes.push(change);
        Ok(())
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

/// A `session_lease` row as read, before its unsigned columns are checked.
pub(crate) type RawLease = (
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<DateTime<Utc>>,
    i64,
    i64,
);

fn row_of(raw: RawLease) -> Result<LeaseRow, StoreError> {
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

/// The columns of `session_lease` a read takes, in [`RawLease`]'s order.
pub(crate) const LEASE_COLUMNS: &str =
    "session_id, holder, token, ttl_ms, expires_at, last_sequence, last_position";

/// The lease rows of one session (by its durable identity) or of all, by session id.
pub async fn session_leases(
    store: &Store,
    session_id: Option<&str>,
) -> Result<Vec<LeaseRow>, StoreError> {
    let id = session_id.map(str::to_owned);
    let raw = crate::backend::for_store(store).leases(id).await?;
    raw.into_iter().map(row_of).collect()
}
