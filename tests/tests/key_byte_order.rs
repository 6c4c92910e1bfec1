//! Keys list in byte order on both backends, whatever the Postgres database's collation
//! (ADR 0062, Postgres migration 0025).
//!
//! The Postgres half runs in a scratch database whose default collation is ICU's `en-US`, which
//! orders `a_b`, `a-b`, `ab`, `aB`, `Ab` nothing like their bytes. The listing's pages (plain,
//! by topic, of waiting groups) walked with a small `limit`, and one group's instances, come
//! back in byte order, as on SQLite and as Rust sorts strings; each group exactly once.

use std::collections::BTreeSet;

use sqlx::Connection;
use wharf::domain::{DeclarerId, GroupName};
use wharf::projections::{GroupCursor, GroupQuery, ReadModel};
use wharf::store::{PgSettings, PgStore, Store};
use wharf::{Registration, Wharf};
use wharf_tests::{fast_declarations, keep_live, pg_url, TestStore};

/// Names whose byte order differs from a linguistic one at every level: case, punctuation,
/// and where the punctuation sits.
const NAMES: [&str; 8] = ["ab", "a_b", "aB", "Ab", "a-b", "a.b", "b", "B"];

/// The groups that get an open waiter.
const WAITING: [&str; 3] = ["a_b", "Ab", "b"];

/// The declarers of one group's instances.
const DECLARERS: [&str; 5] = ["w-b", "w_b", "wB", "Wb", "wb"];

fn byte_order(names: &[&str]) -> Vec<String> {
    let sorted: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    sorted.into_iter().collect()
}

async fn declare(wharf: &Wharf, group: &str, topic: &str, patterns: &[&str]) {
    let registration = Registration::new(group, topic, "1", patterns).unwrap();
    wharf.register(&registration).await.unwrap();
}

/// Every group on `orders` (the `b`s on `parcels`), three of them with a waiter held by a live
/// incumbent, and `ab` with five instances.
async fn fill(store: &Store, wharf: &Wharf) {
    for name in NAMES {
        let topic = if name.eq_ignore_ascii_case("b") {
            "parcels"
        } else {
            "orders"
        };
        declare(wharf, name, topic, &[&format!("{topic}/#")]).await;
    }
    for group in WAITING {
        let topic = if group == "b" { "parcels" } else { "orders" };
        let incumbent = format!("{topic}/#");
        keep_live(store, group, "incumbent", &[&incumbent]).await;
        let waiter = wharf.as_declarer(DeclarerId::parse("d", "waiter").unwrap());
        declare(&waiter, group, topic, &[&format!("{topic}/eu/#")]).await;
    }
    for declarer in DECLARERS {
        keep_live(store, "ab", declarer, &["orders/#"]).await;
    }
}

/// The walk of the listing with `query`'s filters, two groups a page.
async fn walk(read: &ReadModel, query: GroupQuery) -> Vec<String> {
    let mut listed = Vec::new();
    let mut query = GroupQuery { limit: 2, ..query };
    loop {
        let page = read.groups_page(&query).await.unwrap();
        listed.extend(page.groups.iter().map(|g| g.group.clone()));
        let Some(next) = page.next_after else {
            return listed;
        };
        query.after = Some(GroupCursor::decode("after", &next).unwrap());
        assert!(
            listed.len() <= NAMES.len(),
            "the walk does not end: {listed:?}"
        );
    }
}

async fn assert_byte_order(store: &Store, wharf: &Wharf) {
    fill(store, wharf).await;
    let read = ReadModel::new(store.clone(), std::time::Duration::from_secs(60));

    assert_eq!(walk(&read, GroupQuery::default()).await, byte_order(&NAMES));
    let orders: Vec<&str> = NAMES
        .into_iter()
        .filter(|n| !n.eq_ignore_ascii_case("b"))
        .collect();
    let by_topic = GroupQuery {
        topic: Some(wharf_tests::fixtures::topic("orders")),
        ..GroupQuery::default()
    };
    assert_eq!(walk(&read, by_topic).await, byte_order(&orders));
    let waiting = GroupQuery {
        waiting: true,
        ..GroupQuery::default()
    };
    assert_eq!(walk(&read, waiting).await, byte_order(&WAITING));

    let group = read
        .group(&GroupName::parse("group", "ab").unwrap())
        .await
        .unwrap()
        .expect("ab was declared");
    let declarers: Vec<String> = group.instances.into_iter().map(|i| i.declarer).collect();
    assert_eq!(declarers, byte_order(&DECLARERS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite() {
    let test = TestStore::new(wharf_tests::Backend::Sqlite).await;
    assert_byte_order(&test.store, &test.wharf()).await;
}

/// A scratch database whose default collation is ICU `en-US`, dropped with this.
struct LinguisticDatabase {
    name: String,
}

impl LinguisticDatabase {
    async fn create() -> Self {
        let name = format!("wharf_t_icu_{:08x}", rand::random::<u32>());
        let mut admin = sqlx::PgConnection::connect(&pg_url())
            .await
            .unwrap_or_else(|e| panic!("Postgres at {} is required for this test: {e}", pg_url()));
        sqlx::query(&format!(
            "CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' \
             LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        ))
        .execute(&mut admin)
        .await
        .expect("a database with ICU en-US collation (Postgres 15 built with ICU)");
        Self { name }
    }

    /// The test URL with this database in place of its own.
    fn url(&self) -> String {
        let url = pg_url();
        let (base, query) = url.split_once('?').unwrap_or((&url, ""));
        let server = &base[..base.rfind('/').expect("a URL with a database")];
        match query {
            "" => format!("{server}/{}", self.name),
            query => format!("{server}/{}?{query}", self.name),
        }
    }
}

impl Drop for LinguisticDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot await: a thread with its own runtime drops the database.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                if let Ok(mut admin) = sqlx::PgConnection::connect(&pg_url()).await {
                    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(&drop).execute(&mut admin).await;
                }
            });
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_with_a_linguistic_default_collation() {
    let database = LinguisticDatabase::create().await;
    let settings = PgSettings {
        schema: Some("wharf".to_owned()),
        ..PgSettings::new(database.url())
    };
    PgStore::create_schema(&settings).await.unwrap();
    let pg = PgStore::connect(&settings, wharf::projections::pg_inline()).unwrap();
    let store = Store::Postgres(pg.clone());
    store.migrate().await.unwrap();

    // The database itself orders these names otherwise, so the test can tell the difference.
    let linguistic: Vec<String> =
        sqlx::query_scalar("SELECT n FROM unnest($1::text[]) AS n ORDER BY n")
            .bind(NAMES.map(str::to_owned).to_vec())
            .fetch_all(pg.pool())
            .await
            .unwrap();
    assert_ne!(linguistic, byte_order(&NAMES), "en-US orders like bytes?");

    let config = wharf_server::Config {
        declarations: fast_declarations(),
        ..wharf_server::Config::default()
    };
    assert_byte_order(
        &store,
        &Wharf::with_store(store.clone(), &config.settings()),
    )
    .await;
    pg.pool().close().await;
}
