//! Brings other processes' publishes to this process's idle consumers (Postgres).
//!
//! Started once per `Wharf`, by its first consumer, before that consumer's first fetch. It
//! listens on `wharf_publish` on a connection of its own (a one-connection pool the store opens
//! for it, not one of `store.max_connections`; each `Wharf` on the store has its own) and
//! bumps the queue's wake-up counter of each topic notified for this schema. When the connection drops, sqlx reconnects and
//! listens again; notifications sent meanwhile are lost, so it then wakes every topic. If it
//! cannot listen at all, consumers fall back to polling (`queue.poll_interval`), and it tries
//! again with the next consumer.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::{watch, Mutex};
use tracing::{debug, warn};
use wharf_queue::{Queue, Wakeups, PUBLISH_CHANNEL};
use wharf_store::Store;

/// How long a consumer waits for the listener to start before it polls without it.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether this `Wharf`'s listener runs; dropping it (with the last `Wharf` clone) stops the
/// listener.
pub(crate) struct PublishListener {
    started: Mutex<bool>,
    alive: watch::Sender<()>,
}

impl Default for PublishListener {
    fn default() -> Self {
        Self {
            started: Mutex::default(),
            alive: watch::channel(()).0,
        }
    }
}

impl PublishListener {
    /// Starts the listener unless it runs already (SQLite needs none: one process).
    pub(crate) async fn ensure(&self, queue: &Queue, store: &Store) {
        let Store::Postgres(pg) = store else {
            return;
        };
        let mut started = self.started.lock().await;
        if *started {
            return;
        }
        match tokio::time::timeout(START_TIMEOUT, listen(&pg.listen_pool())).await {
            Ok(Ok((listener, schema))) => {
                let alive = self.alive.subscribe();
                tokio::spawn(relay(listener, schema, queue.wakeups().clone(), alive));
                *started = true;
            }
            Ok(Err(e)) => warn!(error = %e, "cannot listen for publishes; consumers poll"),
            Err(_) => warn!("listening for publishes timed out; consumers poll"),
        }
    }
}

async fn listen(pool: &sqlx::PgPool) -> Result<(PgListener, String), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(PUBLISH_CHANNEL).await?;
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&mut listener)
        .await?;
    Ok((listener, schema))
}

/// Relays notifications for `schema` until the `PublishListener` is dropped.
async fn relay(
    mut listener: PgListener,
    schema: String,
    wakeups: Arc<Wakeups>,
    mut alive: watch::Receiver<()>,
) {
    loop {
        let received = tokio::select! {
            received = listener.try_recv() => received,
            _ = alive.changed() => return,
        };
        match received {
            Ok(Some(notification)) => {
                if let Some(topic) = topic_for(notification.payload(), &schema) {
                    wakeups.wake(topic);
                }
            }
            Ok(None) => {
                debug!("publish listener reconnected; waking every topic");
                wakeups.wake_all();
            }
            Err(e) => {
                warn!(error = %e, "publish listener failed; retrying in a second");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = alive.changed() => return,
                }
            }
        }
    }
}

/// The topic a notification payload (`<schema>:<topic>`) names, when it comes from `schema`.
/// Topic names never contain `:` (letters, digits, `.`, `_`, `-`); a schema name may.
fn topic_for<'a>(payload: &'a str, schema: &str) -> Option<&'a str> {
    let (from, topic) = payload.rsplit_once(':')?;
    (from == schema && !topic.is_empty()).then_some(topic)
}

#[cfg(test)]
mod tests {
    use super::topic_for;

    #[test]
    fn accepts_only_its_own_schema() {
        assert_eq!(topic_for("public:orders", "public"), Some("orders"));
        assert_eq!(topic_for("wharf_a:orders", "wharf_b"), None);
        assert_eq!(topic_for("odd:schema:orders", "odd:schema"), Some("orders"));
        assert_eq!(topic_for("public:", "public"), None);
        assert_eq!(topic_for("no separator", "public"), None);
        assert_eq!(topic_for("publicity:orders", "public"), None);
    }
}
