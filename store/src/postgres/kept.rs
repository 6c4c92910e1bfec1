//! One connection the attempts of a store handle keep between them for a few milliseconds.
//!
//! sqlx 0.8 pings every connection on its way back into the pool (ADR 0051): one round trip and
//! a wake-up of a server process per pooled call. A register is one call, not a loop that could
//! keep its own connection as the claim loop does, so the store handle keeps the connection of
//! its last successful attempt in one slot: the next attempt takes it instead of one from the
//! pool, and a timer hands it back to the pool once it has lain unused for [`KeptConnection::LINGER`].
//! Only a connection whose attempt succeeded is kept (no transaction open, nothing half read);
//! a dropped or failed attempt drops its connection, and the pool's check on release decides
//! whether it serves again. A connection is not kept when the pool has no other one to hand out
//! and cannot open one, so nothing else in the process ever waits behind the slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

use crate::error::StoreError;

type Slot = Arc<Mutex<Option<(PoolConnection<Postgres>, u64)>>>;

/// The slot and the count that tells a timer whether the connection it was set for is still
/// the one in the slot.
#[derive(Debug, Default)]
pub(super) struct KeptConnection {
    slot: Slot,
    kept: AtomicU64,
}

impl KeptConnection {
    /// How long an unused kept connection stays out of the pool.
    pub(super) const LINGER: Duration = Duration::from_millis(5);

    /// The kept connection, else one from `pool`.
    pub(super) async fn take(&self, pool: &PgPool) -> Result<PoolConnection<Postgres>, StoreError> {
        let kept = self.slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        match kept {
            Some((connection, _)) => Ok(connection),
            None => Ok(pool.acquire().await?),
        }
    }

    /// Keeps `connection` (whose attempt succeeded) for the next attempt, unless the pool could
    /// not serve anyone else without it; a connection already kept goes back to the pool.
    pub(super) fn keep(&self, pool: &PgPool, connection: PoolConnection<Postgres>) {
        let spare = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
        if !spare {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let number = self.kept.fetch_add(1, Ordering::Relaxed) + 1;
        let replaced = self
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace((connection, number));
        drop(replaced);
        let slot = Arc::clone(&self.slot);
        runtime.spawn(async move {
            tokio::time::sleep(Self::LINGER).await;
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(&*slot, Some((_, kept)) if *kept == number) {
                // Back to the pool (its drop only spawns the pool's return).
                slot.take();
            }
        });
    }
}
