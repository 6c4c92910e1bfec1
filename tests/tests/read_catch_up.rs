//! Reads that catch up before they answer do not write when there is nothing new, on real
//! stores:
//!
//! - Postgres: listing twice with no new event leaves the catch-up checkpoint row untouched
//!   (no `FOR UPDATE` lock, which would stamp a new `xmax` on it); a new event is still seen
//!   by the next read (read-your-writes holds);
//! - SQLite: a listing with nothing new completes while another task holds the single writer
//!   (neither the catch-up check nor the store clock takes it).

use std::time::Duration;

use wharf::store::Store;
use wharf::Registration;
use wharf_tests::{Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

async fn declare(test: &TestStore, group: &str) {
    let registration = Registration::new(group, "orders", "1", &["orders/#"]).unwrap();
    test.wharf().register(&registration).await.unwrap();
}

async fn checkpoint_xmax(test: &TestStore) -> String {
    let Store::Postgres(s) = &test.store else {
        unreachable!("Postgres only")
    };
    sqlx::query_scalar("SELECT xmax::text FROM projection_checkpoint")
        .fetch_one(s.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_with_nothing_new_take_no_lock() {
    let test = TestStore::new(Backend::Postgres).await;
    let wharf = test.wharf();
    declare(&test, "a").await;
    assert_eq!(wharf.read_model().groups().await.unwrap().len(), 1);
    let before = checkpoint_xmax(&test).await;
    for _ in 0..2 {
        assert_eq!(wharf.read_model().groups().await.unwrap().len(), 1);
    }
    assert_eq!(
        checkpoint_xmax(&test).await,
        before,
        "a read with nothing new locked the checkpoint row"
    );
    declare(&test, "b").await;
    assert_eq!(
        wharf.read_model().groups().await.unwrap().len(),
        2,
        "a new declaration is read at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_with_nothing_new_do_not_wait_for_the_writer() {
    let test = TestStore::new(Backend::Sqlite).await;
    let wharf = test.wharf();
    declare(&test, "a").await;
    assert_eq!(wharf.read_model().groups().await.unwrap().len(), 1);
    let Store::Sqlite(sqlite) = &test.store else {
        unreachable!("SQLite only")
    };

    // Hold the writer until told to let go.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, is_held) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let sqlite = sqlite.clone();
        tokio::spawn(async move {
            sqlite
                .write(move |_| {
                    held.send(()).unwrap();
                    released.recv().unwrap();
                    Ok(())
                })
                .await
                .unwrap();
        })
    };
    is_held.await.unwrap();
    let listed = tokio::time::timeout(DEADLINE, wharf.read_model().groups())
        .await
        .expect("a read with nothing new waited for the writer")
        .unwrap();
    assert_eq!(listed.len(), 1);
    release.send(()).unwrap();
    holder.await.unwrap();
}
