//! How many statements a register sends on Postgres, counted from sqlx's own statement log
//! (`sqlx::query` events) on a current-thread runtime, so that only this test's statements are
//! counted: a warm register (ADR 0052) is one statement, whether it writes (a swap) or not (a
//! join); a register on a group another `Wharf` wrote to since misses, then reads and writes;
//! the attempt after a miss, and the one after a read that found another writer's event, read
//! first; then it is one statement again. Its own binary: the subscriber is the thread's
//! default.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;
use wharf::domain::{DeclarerId, RegisterOutcome};
use wharf::{Registration, Wharf};
use wharf_tests::{Backend, TestStore};

/// Counts the statements sqlx logs.
struct Statements(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn register(wharf: &Wharf, declarer: &str, patterns: &[&str]) -> RegisterOutcome {
    wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&Registration::new("billing", "orders", "1", patterns).unwrap())
        .await
        .unwrap()
}

/// The statements `register` sends, and its outcome.
async fn counted(
    sent: &AtomicUsize,
    wharf: &Wharf,
    declarer: &str,
    patterns: &[&str],
) -> (usize, RegisterOutcome) {
    let before = sent.load(Ordering::SeqCst);
    let outcome = register(wharf, declarer, patterns).await;
    (sent.load(Ordering::SeqCst) - before, outcome)
}

#[tokio::test]
async fn a_warm_register_is_one_statement_and_another_writer_makes_it_read_first() {
    let sent = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Statements(sent.clone()));
    let _default = tracing::subscriber::set_default(subscriber);

    let store = TestStore::new(Backend::Postgres).await;
    let this = store.wharf();
    let (cold, _) = counted(&sent, &this, "deploy-1", &["orders/a"]).await;
    assert!(cold >= 2, "a cold register reads first: {cold} statements");

    let (swap, outcome) = counted(&sent, &this, "deploy-2", &["orders/b"]).await;
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{outcome:?}"
    );
    assert_eq!(swap, 1, "a warm swap is one statement");
    let (join, outcome) = counted(&sent, &this, "deploy-3", &["orders/b"]).await;
    assert!(
        matches!(outcome, RegisterOutcome::Joined { .. }),
        "{outcome:?}"
    );
    assert_eq!(join, 1, "a warm join is one statement");

    let other = store.wharf();
    register(&other, "other-1", &["orders/c"]).await;
    let (after_other, outcome) = counted(&sent, &this, "deploy-4", &["orders/d"]).await;
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{outcome:?}"
    );
    assert!(
        after_other >= 3,
        "a speculation that misses, then a read and a write: {after_other} statements"
    );
    // The attempt after a miss reads first; this one's read finds another writer's event, so
    // the one after it reads first too; then, nobody else writing, one statement again.
    register(&other, "other-2", &["orders/e"]).await;
    let (after_miss, _) = counted(&sent, &this, "deploy-5", &["orders/f"]).await;
    assert_eq!(after_miss, 2, "after a miss: a read, then the write");
    let (saw_another, _) = counted(&sent, &this, "deploy-6", &["orders/g"]).await;
    assert_eq!(
        saw_another, 2,
        "after a read that found another writer's event: read first"
    );
    let (quiet, _) = counted(&sent, &this, "deploy-7", &["orders/h"]).await;
    assert_eq!(quiet, 1, "that read found nothing new: one statement again");
}
