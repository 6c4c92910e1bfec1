//! Projector contracts: how read models follow the ledger on each backend.
//!
//! One projector type serves three roles: inline (run inside the append transaction, its error
//! rolls the events back), catch-up (run from a durable checkpoint) and rebuild (a replay of
//! the whole log in position order after `reset`). Every value a projector writes must be
//! derived from events alone, so a rebuild reproduces its tables exactly.

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::error::StoreError;
use crate::event::RecordedEvent;

/// A projector over a SQLite transaction.
pub trait SqliteProjector: Send + Sync {
    /// A stable name: the checkpoint key and the name in errors.
    fn name(&self) -> &'static str;
    /// The tables it owns (compared by `rebuild --verify`).
    fn tables(&self) -> &'static [&'static str];
    /// Empties its tables before a replay.
    fn reset(&self, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
        for table in self.tables() {
            tx.execute(&format!("DELETE FROM {table}"), [])?;
        }
        Ok(())
    }
    /// Applies one event (ignoring events it does not care about).
    fn apply(
        &self,
        tx: &rusqlite::Transaction<'_>,
        event: &RecordedEvent,
    ) -> Result<(), StoreError>;
}

/// A projector over a Postgres transaction.
#[async_trait]
pub trait PgProjector: Send + Sync {
    /// A stable name: the checkpoint key and the name in errors.
    fn name(&self) -> &'static str;
    /// The tables it owns (compared by `rebuild --verify`).
    fn tables(&self) -> &'static [&'static str];
    /// Empties its tables before a replay.
    async fn reset(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        for table in self.tables() {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
    /// Applies one event (ignoring events it does not care about).
    async fn apply(&self, conn: &mut PgConnection, event: &RecordedEvent)
        -> Result<(), StoreError>;
}
