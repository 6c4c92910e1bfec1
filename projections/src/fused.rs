//! What the Postgres projectors that fuse their writes into the event's insert share: applying
//! an already-recorded event (a catch-up or a rebuild) through the very same CTEs.

use sqlx::PgConnection;
use wharf_store::{CteStatement, EventRef, RecordedEvent, StoreError};

/// Adds an event's row changes as CTEs for the position expression given; false when the
/// event is not the projector's.
pub(crate) type CteRows = fn(&EventRef<'_>, &str, &mut CteStatement) -> Result<bool, StoreError>;

/// Applies `event` as one statement of the CTEs `rows` writes, with its position bound.
pub(crate) async fn apply_as_ctes(
    conn: &mut PgConnection,
    event: &RecordedEvent,
    rows: CteRows,
) -> Result<(), StoreError> {
    let mut statement = CteStatement::default();
    let position = statement.bind(event.position)?;
    if rows(&event.as_ref(), &position, &mut statement)? {
        let (sql, args) = statement.finish("SELECT 1");
        sqlx::query_with(&sql, args).execute(conn).await?;
    }
    Ok(())
}
