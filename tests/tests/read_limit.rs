//! The API's bound on concurrent store reads (`http.max_concurrent_reads`, ADR 0059) against
//! real Postgres: a listing read is held inside the database by a table lock another session
//! keeps, so it holds its read permit for as long as the test wants. With one permit a second
//! read waits for it (and is answered once the first gives it back), while the liveness probe
//! answers at once; with two permits the second read is answered while the first is still held.
//!
//! Every wait is on a condition with a deadline; no test sleeps to dodge a race.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use wharf::store::Store;
use wharf_api::{ApiState, HttpLimits};
use wharf_tests::{other_session, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// How long a request may take; the held read gives its permit back when it ends.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

struct App {
    base: String,
    client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

impl App {
    async fn start(test: &TestStore, max_concurrent_reads: usize) -> Self {
        let wharf = test.wharf();
        let state = ApiState::new(wharf.read_model().clone()).with_queue(wharf.queue().clone());
        let limits = HttpLimits {
            request_timeout: REQUEST_TIMEOUT,
            max_concurrent_reads,
            ..HttpLimits::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(wharf_api::serve_with(listener, state, limits, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            client: reqwest::Client::new(),
            _stop: stop,
        }
    }

    /// GETs `path` in a task of its own: its status once answered.
    fn get(&self, path: &str) -> JoinHandle<u16> {
        let request = self.client.get(format!("{}{path}", self.base));
        tokio::spawn(async move { request.send().await.unwrap().status().as_u16() })
    }

    /// GETs `path` and waits (within the deadline) for its status.
    async fn answer(&self, path: &str) -> u16 {
        tokio::time::timeout(DEADLINE, self.get(path))
            .await
            .unwrap_or_else(|_| panic!("{path} is answered"))
            .unwrap()
    }
}

/// Locks `effective_declaration` in a transaction of another session (a page of groups reads
/// it, the topic listing does not), sends a page of groups, and waits until that read waits on
/// the lock inside Postgres: from then on it holds a read permit until the lock goes or its
/// request times out. Returns the held request, when it was sent, and the locking session.
async fn hold_a_read(
    test: &TestStore,
    app: &App,
) -> (JoinHandle<u16>, Instant, sqlx::PgConnection) {
    let mut locker = other_session(test).await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE effective_declaration IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let sent = Instant::now();
    let held = app.get("/api/v1/groups");
    let Store::Postgres(pg) = &test.store else {
        unreachable!("a Postgres test store")
    };
    let pool = pg.pool().clone();
    wait_until("the page of groups waits on the lock", DEADLINE, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%wharf_group_summaries%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        waiting > 0
    })
    .await;
    (held, sent, locker)
}

#[tokio::test]
async fn a_read_beyond_the_bound_waits_for_a_permit_and_probes_do_not() {
    let test = TestStore::new(Backend::Postgres).await;
    let app = App::start(&test, 1).await;
    let (held, sent, mut locker) = hold_a_read(&test, &app).await;

    // The liveness probe takes no read permit: answered while the read still holds the only one.
    assert_eq!(app.answer("/healthz").await, 200);
    assert!(!held.is_finished(), "the held read ended before the probe");

    // Another read waits for the permit: it is answered only after the held read's request
    // timed out and gave it back.
    assert_eq!(app.answer("/api/v1/topics").await, 200);
    assert!(
        sent.elapsed() >= REQUEST_TIMEOUT,
        "answered {:?} after the held read was sent, before its timeout",
        sent.elapsed()
    );
    let held = tokio::time::timeout(DEADLINE, held).await.unwrap().unwrap();
    assert_eq!(held, 503, "the held read ends with its request timeout");
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
}

#[tokio::test]
async fn reads_within_the_bound_do_not_wait_for_each_other() {
    let test = TestStore::new(Backend::Postgres).await;
    let app = App::start(&test, 2).await;
    let (held, _sent, mut locker) = hold_a_read(&test, &app).await;

    assert_eq!(app.answer("/api/v1/topics").await, 200);
    assert!(
        !held.is_finished(),
        "the held read ended before the second read"
    );

    // Once the lock goes, the held read is answered too.
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let held = tokio::time::timeout(DEADLINE, held).await.unwrap().unwrap();
    assert_eq!(held, 200);
}
