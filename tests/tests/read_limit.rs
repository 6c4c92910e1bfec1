//! The API's bound on concurrent store reads (`http.max_concurrent_reads`, ADRs 0059 and 0067)
//! against real Postgres, where it is the API's own pool: a listing read is held inside the
//! database by a table lock another session keeps, so it holds its connection for as long as
//! the test wants. With one connection a second read waits for it (and is answered once the
//! first ends), while the liveness probe answers at once; a read whose request timed out ends
//! in the database too and gives its connection back while the lock is still held; with two
//! connections the second read is answered while the first is still held.
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
        Self::over(&test.wharf(), max_concurrent_reads).await
    }

    /// The API over `wharf`'s read model and queue.
    async fn over(wharf: &wharf::Wharf, max_concurrent_reads: usize) -> Self {
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

    /// GETs `path` in a task of its own: its status once answered, and when.
    fn get(&self, path: &str) -> JoinHandle<(u16, Instant)> {
        let request = self.client.get(format!("{}{path}", self.base));
        tokio::spawn(async move {
            let status = request.send().await.unwrap().status().as_u16();
            (status, Instant::now())
        })
    }

    /// GETs `path` and waits (within the deadline) for its status.
    async fn answer(&self, path: &str) -> u16 {
        answered(path, self.get(path)).await.0
    }
}

/// Waits (within the deadline) for a request sent with [`App::get`].
async fn answered(what: &str, request: JoinHandle<(u16, Instant)>) -> (u16, Instant) {
    tokio::time::timeout(DEADLINE, request)
        .await
        .unwrap_or_else(|_| panic!("{what} is answered"))
        .unwrap()
}

/// How many sessions wait on a lock while running the page of groups' call.
async fn reads_waiting_on_the_lock(test: &TestStore) -> i64 {
    let Store::Postgres(pg) = &test.store else {
        unreachable!("a Postgres test store")
    };
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%wharf_group_page%' AND datname = current_database()",
    )
    .fetch_one(pg.pool())
    .await
    .unwrap()
}

/// Locks `effective_declaration` in a transaction of another session (a page of groups reads
/// it, the topic listing does not), sends a page of groups, and waits until that read waits on
/// the lock inside Postgres: from then on it holds a read permit until the lock goes or its
/// request times out. Returns the held request, when it was sent, and the locking session.
async fn hold_a_read(
    test: &TestStore,
    app: &App,
) -> (JoinHandle<(u16, Instant)>, Instant, sqlx::PgConnection) {
    let mut locker = other_session(test).await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE effective_declaration IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let sent = Instant::now();
    let held = app.get("/api/v1/groups");
    wait_until("the page of groups waits on the lock", DEADLINE, || async {
        reads_waiting_on_the_lock(test).await > 0
    })
    .await;
    (held, sent, locker)
}

#[tokio::test]
async fn a_read_beyond_the_bound_waits_for_a_connection_and_probes_do_not() {
    let test = TestStore::new(Backend::Postgres).await;
    let app = App::start(&test, 1).await;
    let (held, _sent, mut locker) = hold_a_read(&test, &app).await;
    let waiting = app.get("/api/v1/topics");

    // The liveness probe reads nothing, and readiness and the deep health report read through
    // the store's own pool: answered while the read holds the API's only connection.
    assert_eq!(app.answer("/healthz").await, 200);
    assert_eq!(app.answer("/readyz").await, 200);
    assert_eq!(app.answer("/api/v1/monitor/deephealth").await, 200);
    assert!(!held.is_finished(), "the held read ended before the probe");
    assert!(
        !waiting.is_finished(),
        "the second read was answered while the first held the only connection"
    );

    // Once the lock goes the held read ends, and only then is the second one answered.
    let released = Instant::now();
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let (held, _) = answered("the held read", held).await;
    assert_eq!(held, 200);
    let (status, at) = answered("the second read", waiting).await;
    assert_eq!(status, 200);
    assert!(
        at > released,
        "the second read was answered before the first ended"
    );
}

#[tokio::test]
async fn a_read_whose_request_timed_out_ends_in_the_database_and_gives_its_connection_back() {
    let test = TestStore::new(Backend::Postgres).await;
    let app = App::start(&test, 1).await;
    let (held, sent, mut locker) = hold_a_read(&test, &app).await;

    let (status, _) = answered("the held read", held).await;
    assert_eq!(status, 503, "the held read ends with its request timeout");
    assert!(sent.elapsed() >= REQUEST_TIMEOUT);
    // Its statement is ended by the server too (`statement_timeout`), the lock still held...
    wait_until(
        "the timed-out read leaves the database",
        DEADLINE,
        || async { reads_waiting_on_the_lock(&test).await == 0 },
    )
    .await;
    // ...so the only connection is free for the next read, which does not need the lock.
    assert_eq!(app.answer("/api/v1/topics").await, 200);
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
    let (held, _) = answered("the held read", held).await;
    assert_eq!(held, 200);
}

/// The API reads through a pool of its own: with every connection of the application's store
/// pool taken (here its only one, as claim loops would hold them), the listing is answered.
#[tokio::test]
async fn the_api_reads_while_the_store_pool_is_taken() {
    let test = TestStore::new(Backend::Postgres).await;
    let mut config = test.config();
    config.store.max_connections = 1;
    let wharf = wharf::Wharf::open(&config.settings()).await.expect("open");
    let app = App::over(&wharf, 1).await;
    let Store::Postgres(pg) = wharf.store() else {
        unreachable!("a Postgres test store")
    };
    let _taken = pg.pool().acquire().await.unwrap();

    for path in ["/api/v1/groups", "/api/v1/topics", "/metrics"] {
        assert_eq!(app.answer(path).await, 200, "{path}");
    }
}
