//! Consumer instances end to end on real stores (issue 7, points 3 to 5; ADR 0015):
//! - every `consume` of one `Wharf` is its own instance: two consumers of one group in one
//!   process with different sets behave like two processes (the second waits, no flip-flop
//!   over many heartbeats, one's `shutdown` keeps the other's heartbeat row);
//! - liveness is bounded by the instance TTL: an instance cut off from its store stops being
//!   ready within the TTL, and after the store comes back it declares again before it claims;
//!   one whose heartbeat is confirmed again before the TTL passes resumes under its install;
//! - claims are fenced by the install an instance joined: once another declarer has installed a
//!   new set, the old instance's runtime claims nothing and the instance re-declares.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use wharf::config::{DeclarationConfig, QueueConfig};
use wharf::domain::{DeclarationEvent, DeclarerId, GroupName};
use wharf::handler::handler_fn;
use wharf::queue::{Claimed, Headers};
use wharf::store::{PgStore, SqliteStore, Store};
use wharf::{Consumer, ConsumerState, Registration, Wharf};
use wharf_server::config::Config;
use wharf_tests::proxy::TcpProxy;
use wharf_tests::states::StateLog;
use wharf_tests::{on_both_backends, pg_url, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

fn registration(patterns: &[&str]) -> Registration {
    Registration::new("billing", "orders", "1", patterns).unwrap()
}

fn group() -> GroupName {
    GroupName::parse("group", "billing").unwrap()
}

/// `store`'s configuration with the given declaration timings and quick polls.
fn config(store: &TestStore, declarations: DeclarationConfig) -> Config {
    let mut config = store.config();
    config.declarations = declarations;
    config.queue = QueueConfig {
        poll_interval: Duration::from_millis(20),
        visibility_timeout: Duration::from_secs(30),
        ..QueueConfig::default()
    };
    config
}

fn timings(heartbeat_ms: u64, ttl_ms: u64) -> DeclarationConfig {
    DeclarationConfig {
        retry_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(heartbeat_ms),
        instance_ttl: Duration::from_millis(ttl_ms),
        ..DeclarationConfig::default()
    }
}

async fn publish(wharf: &Wharf, subjects: &[&str]) {
    let messages = subjects
        .iter()
        .map(|s| ((*s).to_owned(), s.as_bytes().to_vec(), Headers::new()))
        .collect();
    wharf.publish("orders", messages).await.unwrap();
}

async fn installs(wharf: &Wharf) -> Vec<Vec<String>> {
    wharf
        .store()
        .load("consumer_group", "billing")
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match e.decode::<DeclarationEvent>().unwrap() {
            DeclarationEvent::Installed { attempt, .. } => Some(attempt.patterns.patterns()),
            DeclarationEvent::Waiting { .. } => None,
        })
        .collect()
}

async fn instance_rows(store: &Store) -> Vec<String> {
    let mut rows: Vec<String> = store
        .instances(Some("billing".to_owned()))
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.declarer)
        .collect();
    rows.sort();
    rows
}

async fn reach_by(
    consumer: &Consumer,
    by: Instant,
    what: &str,
    done: impl FnMut(&ConsumerState) -> bool,
) {
    let mut watch = consumer.watch();
    tokio::time::timeout_at(by, watch.wait_for(done))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}: {:?}", consumer.state()))
        .unwrap();
}

async fn reach(consumer: &Consumer, what: &str, done: impl FnMut(&ConsumerState) -> bool) {
    reach_by(consumer, Instant::now() + DEADLINE, what, done).await;
}

/// The recorded states once the recorder has seen a stall and, after it, the consumer ready.
async fn through_a_stall(states: &StateLog) -> Vec<ConsumerState> {
    states
        .until("a stall, then ready again", |s| {
            s.iter()
                .skip_while(|s| !matches!(s, ConsumerState::Stalled { .. }))
                .any(ConsumerState::is_ready)
        })
        .await
}

async fn ready(consumer: &Consumer, what: &str) {
    reach(consumer, what, ConsumerState::is_ready).await;
}

fn waiting_attempts(state: &ConsumerState) -> u64 {
    match state {
        ConsumerState::Waiting { attempts, .. } => *attempts,
        _ => 0,
    }
}

/// (install, joins) of a consuming state.
fn joined(state: &ConsumerState) -> (i64, u64) {
    match state {
        ConsumerState::Consuming { install, joins, .. } => (*install, *joins),
        other => panic!("expected a consuming state, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// One instance per consumer
// ---------------------------------------------------------------------------------------------

async fn two_consumers_in_one_process_behave_like_two_processes(backend: Backend) {
    let store = TestStore::new(backend).await;
    // Heartbeats every 50 ms: the second set waits through dozens of them.
    let wharf = Wharf::with_store(
        store.store.clone(),
        &config(&store, timings(50, 5_000)).settings(),
    );
    let first = wharf.consume(registration(&["orders/eu/#"]));
    ready(&first, "the first consumer").await;
    let twin = wharf.consume(registration(&["orders/eu/#"]));
    ready(&twin, "a second consumer of the same set").await;
    let process = wharf.declarer().as_str();
    for instance in [first.declarer(), twin.declarer()] {
        assert!(
            instance.as_str().starts_with(process) && instance.as_str() != process,
            "an instance identity is derived from the process's: {instance} from {process}"
        );
    }
    assert_ne!(
        first.declarer(),
        twin.declarer(),
        "one identity per consumer"
    );
    let mut both = vec![first.declarer().to_string(), twin.declarer().to_string()];
    both.sort();
    assert_eq!(instance_rows(&store.store).await, both, "one row each");

    let first_states = StateLog::record(&first);
    let other = wharf.consume(registration(&["orders/us/#"]));
    let other_states = StateLog::record(&other);
    reach(
        &other,
        "the divergent set waiting through many heartbeats",
        |s| waiting_attempts(s) >= 20,
    )
    .await;
    let ConsumerState::Waiting {
        incumbent,
        mut live_declarers,
        ..
    } = other.state()
    else {
        panic!("the divergent consumer waits: {:?}", other.state());
    };
    assert_eq!(incumbent.patterns(), vec!["orders/eu/#"]);
    live_declarers.sort();
    let live: Vec<String> = live_declarers.iter().map(ToString::to_string).collect();
    assert_eq!(live, both, "it waits on both instances of its own process");
    assert_eq!(
        installs(&wharf).await,
        vec![vec!["orders/eu/#".to_owned()]],
        "exactly one install: no flip-flop"
    );
    assert!(
        first_states.so_far().iter().all(ConsumerState::is_ready),
        "the first consumer never left its set: {:?}",
        first_states.so_far()
    );
    assert!(twin.is_ready());

    // One instance leaving removes only its own row; the twin still holds the set.
    first.shutdown().await;
    assert_eq!(
        instance_rows(&store.store).await,
        vec![twin.declarer().to_string()],
        "the other instance's heartbeat row stays"
    );
    let seen = waiting_attempts(&other.state());
    reach(&other, "more waiting after one instance left", |s| {
        waiting_attempts(s) >= seen + 5
    })
    .await;
    assert_eq!(installs(&wharf).await.len(), 1, "still one install");

    // Once the last instance of the old set is gone, the second set installs.
    twin.shutdown().await;
    ready(&other, "the divergent set after both instances left").await;
    assert_eq!(
        installs(&wharf).await,
        vec![
            vec!["orders/eu/#".to_owned()],
            vec!["orders/us/#".to_owned()]
        ]
    );
    let recorded = other_states.until_ready().await;
    let first_ready = recorded.iter().position(ConsumerState::is_ready).unwrap();
    assert!(
        recorded[..first_ready]
            .iter()
            .all(|s| matches!(s, ConsumerState::Declaring | ConsumerState::Waiting { .. })),
        "it only declared and waited before it became ready: {recorded:?}"
    );
    assert_eq!(
        instance_rows(&store.store).await,
        vec![other.declarer().to_string()]
    );
    other.shutdown().await;
    assert!(instance_rows(&store.store).await.is_empty());
}
on_both_backends!(
    two_consumers_in_one_process,
    two_consumers_in_one_process_behave_like_two_processes
);

// ---------------------------------------------------------------------------------------------
// Liveness bounded by the TTL
// ---------------------------------------------------------------------------------------------

/// Cuts a consumer's store off and brings it back.
///
/// On Postgres, the consumer's store connects through a TCP proxy that is stopped (listener and
/// live connections closed: the pool's reconnects are refused and retried until its acquire
/// timeout, 10 s, far past the TTL) and restarted. On SQLite there is no network: the store is
/// cut off by holding its writer through the store's own API, so heartbeats, declaration
/// attempts and claims queue behind it (reads still answer). That is the rule that matters
/// here, stall then re-declare before claiming, on a store that hangs rather than fails.
enum Outage {
    Proxy(TcpProxy),
    Writer {
        store: SqliteStore,
        release: Option<(std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<()>)>,
    },
}

impl Outage {
    /// The outage control and the store the consumer uses.
    async fn new(store: &TestStore) -> (Self, Store) {
        match &store.store {
            Store::Sqlite(s) => (
                Self::Writer {
                    store: s.clone(),
                    release: None,
                },
                store.store.clone(),
            ),
            Store::Postgres(_) => {
                let proxy = TcpProxy::to_test_postgres().await;
                let mut settings = TestStore::pg_settings(store.schema().unwrap());
                settings.url = proxy.pg_url_through(&pg_url());
                settings.max_connections = 8;
                // Longer than the whole test: only the consumer's own deadlines bound a call.
                settings.acquire_timeout = Duration::from_secs(60);
                let through = PgStore::connect(&settings, wharf::projections::pg_inline()).unwrap();
                (Self::Proxy(proxy), Store::Postgres(through))
            }
        }
    }

    async fn cut(&mut self) {
        match self {
            Self::Proxy(proxy) => proxy.stop().await,
            Self::Writer { store, release } => {
                let (held_tx, held) = tokio::sync::oneshot::channel();
                let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
                let store = store.clone();
                let holder = tokio::spawn(async move {
                    store
                        .write(move |_ctx| {
                            let _ = held_tx.send(());
                            let _ = release_rx.recv();
                            Ok(())
                        })
                        .await
                        .unwrap();
                });
                held.await.expect("the writer is held");
                *release = Some((release_tx, holder));
            }
        }
    }

    async fn restore(&mut self) {
        match self {
            Self::Proxy(proxy) => proxy.restart().await,
            Self::Writer { release, .. } => {
                if let Some((release, holder)) = release.take() {
                    drop(release);
                    holder.await.unwrap();
                }
            }
        }
    }

    fn is_network(&self) -> bool {
        matches!(self, Self::Proxy(_))
    }
}

async fn an_instance_cut_off_past_its_ttl_redeclares_before_it_claims(backend: Backend) {
    let store = TestStore::new(backend).await;
    let ttl = Duration::from_secs(1);
    let config = config(&store, timings(50, 1_000));
    let direct = Wharf::with_store(store.store.clone(), &config.settings());
    let (mut outage, consumer_store) = Outage::new(&store).await;
    let wharf = Wharf::with_store(consumer_store, &config.settings());

    // Each handled message with the consumer's `joins` when its handler ran.
    let handled: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let states_cell: Arc<OnceLock<watch::Receiver<ConsumerState>>> = Arc::default();
    let handler = {
        let (handled, states_cell) = (handled.clone(), states_cell.clone());
        handler_fn(move |message: Claimed| {
            let (handled, states_cell) = (handled.clone(), states_cell.clone());
            async move {
                let joins = match &*states_cell.get().unwrap().borrow() {
                    ConsumerState::Consuming { joins, .. } => *joins,
                    _ => 0,
                };
                handled
                    .lock()
                    .unwrap()
                    .push((message.subject.clone(), joins));
                Ok(())
            }
        })
    };
    let consumer = wharf.consume_with(registration(&["orders/#"]), handler);
    states_cell.set(consumer.watch()).unwrap();
    ready(&consumer, "the consumer").await;
    let (install, joins) = joined(&consumer.state());
    assert_eq!(joins, 1);
    publish(&direct, &["orders/before"]).await;
    wait_until("the first message handled", DEADLINE, || {
        let n = handled.lock().unwrap().len();
        async move { n == 1 }
    })
    .await;

    let states = StateLog::record(&consumer);
    outage.cut().await;
    let cut_at = Instant::now();
    // The last confirmed heartbeat was sent before the cut, so the TTL from the cut is the
    // latest the consumer may still report ready.
    reach_by(&consumer, cut_at + ttl, "not ready within the TTL", |s| {
        !s.is_ready()
    })
    .await;
    // Still cut off past the TTL: the consumer has gone back to declaring, and that fails too.
    reach(&consumer, "a failed declaration attempt", |s| {
        matches!(s, ConsumerState::Stalled { reason } if reason.starts_with("declaration attempt"))
    })
    .await;
    if outage.is_network() {
        // Through the direct connection: claimable the moment the consumer is back.
        publish(&direct, &["orders/during"]).await;
    }
    assert_eq!(
        handled.lock().unwrap().len(),
        1,
        "nothing claimed while cut off"
    );
    assert!(!consumer.is_ready());

    outage.restore().await;
    if !outage.is_network() {
        publish(&direct, &["orders/during"]).await;
    }
    reach(&consumer, "consuming again", ConsumerState::is_ready).await;
    wait_until(
        "the message published during the outage handled",
        DEADLINE,
        || {
            let n = handled.lock().unwrap().len();
            async move { n == 2 }
        },
    )
    .await;
    let handled = handled.lock().unwrap().clone();
    assert_eq!(
        handled,
        vec![
            ("orders/before".to_owned(), 1),
            ("orders/during".to_owned(), 2)
        ],
        "the first claim after the outage came only after the instance declared again"
    );
    let (again, joins) = joined(&consumer.state());
    assert_eq!(
        (again, joins),
        (install, 2),
        "the same install, joined a second time"
    );
    let recorded = through_a_stall(&states).await;
    let stalled = recorded
        .iter()
        .position(|s| matches!(s, ConsumerState::Stalled { .. }))
        .unwrap_or_else(|| panic!("the consumer stalled: {recorded:?}"));
    let after: Vec<&ConsumerState> = recorded[stalled..].iter().collect();
    assert!(
        after
            .iter()
            .all(|s| !matches!(s, ConsumerState::Consuming { joins: 1, .. })),
        "never resumed without declaring again: {recorded:?}"
    );
    let back = after.iter().position(|s| s.is_ready()).unwrap();
    assert!(
        after[..back]
            .iter()
            .any(|s| matches!(s, ConsumerState::Declaring)),
        "stalled, then declaring, then consuming: {recorded:?}"
    );
    assert_eq!(
        instance_rows(&store.store).await,
        vec![consumer.declarer().to_string()]
    );
    consumer.shutdown().await;
    if let Outage::Proxy(proxy) = &outage {
        proxy.stop().await;
        assert!(
            tokio::net::TcpStream::connect(proxy.addr()).await.is_err(),
            "a stopped proxy's listener is closed"
        );
    }
}
on_both_backends!(
    cut_off_past_the_ttl,
    an_instance_cut_off_past_its_ttl_redeclares_before_it_claims
);

async fn a_heartbeat_confirmed_again_within_the_ttl_resumes_under_the_same_install(
    backend: Backend,
) {
    let store = TestStore::new(backend).await;
    // A 3 s TTL: a call's deadline is 1 s, and the outage below ends well before the lapse.
    let config = config(&store, timings(50, 3_000));
    let (mut outage, consumer_store) = Outage::new(&store).await;
    let wharf = Wharf::with_store(consumer_store, &config.settings());
    let consumer = wharf.consume(registration(&["orders/#"]));
    ready(&consumer, "the consumer").await;
    let before = joined(&consumer.state());
    let states = StateLog::record(&consumer);

    outage.cut().await;
    let cut_at = Instant::now();
    reach(
        &consumer,
        "stalled on an unconfirmed heartbeat",
        |s| matches!(s, ConsumerState::Stalled { reason } if reason.starts_with("heartbeat")),
    )
    .await;
    outage.restore().await;
    // Restored within the TTL (the lapse is no earlier than the cut plus the TTL): ready again.
    assert!(
        cut_at.elapsed() < Duration::from_secs(2),
        "the outage outlasted the margin this test needs: {:?}",
        cut_at.elapsed()
    );
    reach(&consumer, "consuming again", ConsumerState::is_ready).await;
    assert_eq!(
        joined(&consumer.state()),
        before,
        "the same install, without declaring again"
    );
    let recorded = through_a_stall(&states).await;
    assert!(
        !recorded
            .iter()
            .any(|s| matches!(s, ConsumerState::Declaring)),
        "no re-declaration within the TTL: {recorded:?}"
    );
    consumer.shutdown().await;
}
on_both_backends!(
    confirmed_within_the_ttl,
    a_heartbeat_confirmed_again_within_the_ttl_resumes_under_the_same_install
);

// ---------------------------------------------------------------------------------------------
// Claims fenced by the install an instance joined
// ---------------------------------------------------------------------------------------------

async fn a_fenced_runtime_claims_nothing_new_and_redeclares(backend: Backend) {
    let store = TestStore::new(backend).await;
    // The old instance heartbeats only every 10 s: within this test, only a fenced fetch can
    // make it re-declare.
    let slow = Wharf::with_store(
        store.store.clone(),
        &config(&store, timings(10_000, 30_000)).settings(),
    );
    let old = slow.as_declarer(DeclarerId::parse("declarer", "old").unwrap());
    // The new declarer judges liveness with a 200 ms TTL, so to it the old instance's row
    // lapses 200 ms after its join: the old instance's heartbeat lapsed, as far as the group's
    // next decision is concerned.
    let hasty = Wharf::with_store(
        store.store.clone(),
        &config(&store, timings(50, 200)).settings(),
    );
    let new = hasty.as_declarer(DeclarerId::parse("declarer", "new").unwrap());

    let handled: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorder = {
        let handled = handled.clone();
        handler_fn(move |message: Claimed| {
            let handled = handled.clone();
            async move {
                handled.lock().unwrap().push(message.subject.clone());
                Ok(())
            }
        })
    };
    let incumbent = old.consume_with(registration(&["orders/x/#"]), recorder);
    ready(&incumbent, "the old instance").await;
    let joined_at = Instant::now();
    let (old_install, _) = joined(&incumbent.state());
    publish(&slow, &["orders/x/1"]).await;
    wait_until("the old instance handled its message", DEADLINE, || {
        let n = handled.lock().unwrap().len();
        async move { n == 1 }
    })
    .await;

    // No handler on the new instance: whatever the new set routes stays for whoever claims it.
    let replacement = new.consume(registration(&["orders/y/#"]));
    ready(
        &replacement,
        "the new set, installed over the old instance's lapsed row",
    )
    .await;
    publish(&slow, &["orders/y/1", "orders/x/2"]).await;
    // Before the old instance's first heartbeat (10 s after its join), it re-declares and waits
    // on the new instance: only its claim loop's fenced fetch could have told it.
    reach_by(
        &incumbent,
        joined_at + Duration::from_secs(8),
        "the fenced old instance waiting",
        |s| matches!(s, ConsumerState::Waiting { incumbent, .. } if incumbent.patterns() == vec!["orders/y/#"]),
    )
    .await;
    let ConsumerState::Waiting { live_declarers, .. } = incumbent.state() else {
        unreachable!()
    };
    assert_eq!(live_declarers, vec![replacement.declarer().clone()]);
    assert_eq!(
        *handled.lock().unwrap(),
        vec!["orders/x/1"],
        "nothing new reached the old instance"
    );
    // The new set's message is still there for the new install: the old instance took nothing.
    let probe = slow.queue().fetch(&group(), "probe", 10).await.unwrap();
    let probed: Vec<&str> = probe.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(probed, vec!["orders/y/1"]);
    for message in &probe {
        slow.queue().ack(message).await.unwrap();
    }

    // Once the new instance is gone, the old set installs again, under a new install.
    replacement.shutdown().await;
    reach(
        &incumbent,
        "the old set back in effect",
        ConsumerState::is_ready,
    )
    .await;
    let (install, joins) = joined(&incumbent.state());
    assert!(
        install > old_install,
        "a new install: {install} after {old_install}"
    );
    assert_eq!(joins, 2);
    assert_eq!(
        installs(&slow).await,
        vec![
            vec!["orders/x/#".to_owned()],
            vec!["orders/y/#".to_owned()],
            vec!["orders/x/#".to_owned()]
        ]
    );
    publish(&slow, &["orders/x/3"]).await;
    wait_until("the old set handling again", DEADLINE, || {
        let seen = handled.lock().unwrap().clone();
        async move { seen.iter().any(|s| s == "orders/x/3") }
    })
    .await;
    incumbent.shutdown().await;
}
on_both_backends!(
    fenced_runtime,
    a_fenced_runtime_claims_nothing_new_and_redeclares
);
