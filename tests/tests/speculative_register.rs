//! The speculative register (ADR 0052) at its edges: a process that holds a group's state
//! decides its next register without reading, and its one statement must land only when what it
//! assumed still holds. Three ways the assumption moves without this process knowing: an
//! instance comes back to life (a heartbeat takes no lock and bumps no version), another
//! process installs a set (the version and the stream move), and another process installs
//! while this one would only join (a decision that writes nothing is checked too); the last two
//! also with the other `Wharf` in this process, on the same store handle. Each ends in
//! the outcome a fresh read gives, never in a union or a join on a set that is gone. SQLite
//! runs every register locked; the first edge runs there too, as the reference.

use chrono::{DateTime, Utc};
use wharf::domain::{DeclarationEvent, DeclarerId, RegisterOutcome};
use wharf::store::{PgStore, Store};
use wharf::{Registration, Wharf};
use wharf_server::config::Config;
use wharf_tests::{keep_live, on_both_backends, on_postgres, Backend, TestStore};

const GROUP: &str = "billing";

fn registration(patterns: &[&str]) -> Registration {
    Registration::new(GROUP, "orders", "1", patterns).unwrap()
}

async fn register_as(wharf: &Wharf, declarer: &str, patterns: &[&str]) -> RegisterOutcome {
    wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&registration(patterns))
        .await
        .unwrap()
}

fn set(patterns: &[&str]) -> Option<Vec<String>> {
    Some(patterns.iter().map(|p| (*p).to_owned()).collect())
}

fn previous_of(outcome: &RegisterOutcome) -> Option<Vec<String>> {
    match outcome {
        RegisterOutcome::Installed { previous, .. } => previous.as_ref().map(|p| p.patterns()),
        other => panic!("expected an install, got {other:?}"),
    }
}

async fn effective(wharf: &Wharf) -> Vec<String> {
    let group = wharf::domain::GroupName::parse("group", GROUP).unwrap();
    wharf.read_model().effective_bindings(&group).await.unwrap()
}

/// A live instance this process has not seen: its `worker_instance` row turns live without
/// any attempt (what a heartbeat does for an instance whose row this process last saw lapsed:
/// no lock, no version bump). The warm process's next register, a different set, waits.
async fn an_instance_this_process_has_not_seen_makes_the_swap_wait(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.steady_wharf();
    let installed = register_as(&wharf, "deploy-1", &["orders/+/paid"]).await;
    assert_eq!(previous_of(&installed), None);
    // The process now holds the group, having seen no live instance.
    keep_live(&store.store, GROUP, "worker-7", &["orders/+/paid"]).await;

    let outcome = register_as(&wharf, "deploy-2", &["orders/#"]).await;
    let RegisterOutcome::Waiting {
        incumbent,
        live_declarers,
        ..
    } = &outcome
    else {
        panic!("a live declarer of the stored set must make the swap wait: {outcome:?}");
    };
    assert_eq!(incumbent.patterns(), vec!["orders/+/paid"]);
    assert_eq!(
        live_declarers
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>(),
        vec!["worker-7"]
    );
    assert_eq!(effective(&wharf).await, vec!["orders/+/paid"], "no swap");
}

on_both_backends!(
    an_instance_this_process_has_not_seen_makes_the_swap_wait,
    an_instance_this_process_has_not_seen_makes_the_swap_wait
);

/// A second "process" on the same schema: its own store handle (its own pool and clock) and
/// its own `Wharf` (its own held group states).
fn second_process(store: &TestStore) -> Wharf {
    let schema = store.schema().expect("a Postgres store");
    let settings = TestStore::pg_settings(schema);
    let handle = PgStore::connect(&settings, wharf::projections::pg_inline()).unwrap();
    let config = Config {
        declarations: wharf_tests::fast_declarations(),
        ..store.config()
    };
    Wharf::with_store(Store::Postgres(handle), &config.settings())
}

/// Another process installs between two registers of this one: this one's next install names
/// the other's set as the one it replaced, and its next "join" of the set it last saw is an
/// install over the other's set, not a join of a set that is no longer effective.
async fn another_process_s_install_is_never_overwritten_or_joined(backend: Backend) {
    assert_eq!(backend, Backend::Postgres);
    let store = TestStore::new(backend).await;
    let other = second_process(&store);
    another_s_install_is_never_overwritten_or_joined(store.wharf(), other).await;
}

/// The same with the other `Wharf` in this process, on the same store handle: it shares the
/// handle's clock and kept connection, not its held group states.
async fn another_wharf_s_install_is_never_overwritten_or_joined(backend: Backend) {
    assert_eq!(backend, Backend::Postgres);
    let store = TestStore::new(backend).await;
    another_s_install_is_never_overwritten_or_joined(store.wharf(), store.wharf()).await;
}

async fn another_s_install_is_never_overwritten_or_joined(this: Wharf, other: Wharf) {
    register_as(&this, "this-1", &["orders/a"]).await;
    let theirs = register_as(&other, "other-1", &["orders/b"]).await;
    assert_eq!(previous_of(&theirs), set(&["orders/a"]));
    let ours = register_as(&this, "this-2", &["orders/c"]).await;
    assert_eq!(
        previous_of(&ours),
        set(&["orders/b"]),
        "the install replaced what the other process installed"
    );

    // A join after that miss (which read first) makes this process speculate again.
    let joined = register_as(&this, "this-2b", &["orders/c"]).await;
    assert!(
        matches!(joined, RegisterOutcome::Joined { .. }),
        "{joined:?}"
    );
    // This process last saw orders/c effective; the other installs orders/d; this one then
    // registers orders/c again, which on what it last knew would be a join (nothing written).
    register_as(&other, "other-2", &["orders/d"]).await;
    let again = register_as(&this, "this-3", &["orders/c"]).await;
    assert_eq!(
        previous_of(&again),
        set(&["orders/d"]),
        "orders/c is not effective any more: registering it installs it"
    );
    assert_eq!(effective(&this).await, vec!["orders/c"]);

    let installs: Vec<(Option<Vec<String>>, DateTime<Utc>)> = this
        .store()
        .load("consumer_group", GROUP)
        .await
        .unwrap()
        .iter()
        .map(|e| match e.decode::<DeclarationEvent>().unwrap() {
            DeclarationEvent::Installed { attempt, previous } => {
                (previous.map(|p| p.patterns()), attempt.attempt_at)
            }
            other => panic!("only installs here: {other:?}"),
        })
        .collect();
    let previous: Vec<_> = installs.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(
        previous,
        vec![
            None,
            set(&["orders/a"]),
            set(&["orders/b"]),
            set(&["orders/c"]),
            set(&["orders/d"]),
        ],
        "each install replaced the one before it in the ledger"
    );
    assert!(
        installs.windows(2).all(|w| w[0].1 <= w[1].1),
        "decision times in ledger order: {installs:?}"
    );
}

on_postgres!(
    another_process_s_install_is_never_overwritten_or_joined,
    another_process_s_install_is_never_overwritten_or_joined
);

on_postgres!(
    another_wharf_s_install_is_never_overwritten_or_joined,
    another_wharf_s_install_is_never_overwritten_or_joined
);

/// The connection a register keeps for the next one (no return ping between registers) goes
/// back to the pool once it lies unused: the pool ends with every connection idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_goes_back_to_the_pool_when_unused() {
    let store = TestStore::new(Backend::Postgres).await;
    let wharf = store.wharf();
    for (n, set) in [["orders/a"], ["orders/b"], ["orders/c"]]
        .iter()
        .enumerate()
    {
        register_as(&wharf, &format!("deploy-{n}"), set).await;
    }
    let Store::Postgres(pg) = &store.store else {
        unreachable!("a Postgres store")
    };
    let pool = pg.pool().clone();
    assert!(pool.size() >= 1, "the registers opened a connection");
    wharf_tests::wait_until(
        "every connection of the pool idle again",
        std::time::Duration::from_secs(5),
        || {
            let pool = pool.clone();
            async move { pool.num_idle() == pool.size() as usize }
        },
    )
    .await;
}
