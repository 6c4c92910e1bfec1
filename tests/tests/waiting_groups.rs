//! `waiting_group`, the groups with a waiting attempt that the page of waiting groups walks
//! (ADR 0060), on both backends:
//! - each way a group's last wait ends takes it off the page (its declarer's own install,
//!   another declarer's install of the set it waits for), a wait for another set keeps it on,
//!   and a group that never waited is never listed; the table holds exactly the groups with a
//!   waiting attempt after every step;
//! - the migration's backfill gives exactly the rows the appends left, and a replay agrees;
//! - a row left behind (as an older build's projector would leave one) lists nothing, and a
//!   missing row is reported by `rebuild --verify` and put back by a rebuild.

use std::sync::Arc;

use wharf::domain::{DeclarerId, RegisterOutcome};
use wharf::projections::{GroupCursor, GroupQuery};
use wharf::store::{RebuildMode, Store};
use wharf::{Registration, Wharf};
use wharf_tests::{execute_sql, keep_live, on_both_backends, rerun_migration, Backend, TestStore};

async fn register(wharf: &Wharf, group: &str, declarer: &str, set: &[&str]) -> RegisterOutcome {
    let registration = Registration::new(group, "orders", "1", set).unwrap();
    wharf
        .as_declarer(DeclarerId::parse("declarer", declarer).unwrap())
        .register(&registration)
        .await
        .unwrap()
}

fn waits(outcome: RegisterOutcome) {
    assert!(
        matches!(outcome, RegisterOutcome::Waiting { .. }),
        "expected a wait, got {outcome:?}"
    );
}

fn installs(outcome: RegisterOutcome) {
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "expected an install, got {outcome:?}"
    );
}

/// The page of waiting groups, walked one group per page (every cursor used).
async fn waiting_page(wharf: &Wharf) -> Vec<String> {
    let mut names = Vec::new();
    let mut query = GroupQuery {
        limit: 1,
        waiting: true,
        ..GroupQuery::default()
    };
    loop {
        let page = wharf.read_model().groups_page(&query).await.unwrap();
        for group in &page.groups {
            assert!(
                group.waiters.count > 0,
                "{} listed without a waiter",
                group.group
            );
        }
        names.extend(page.groups.into_iter().map(|g| g.group));
        let Some(after) = page.next_after else {
            return names;
        };
        query.after = Some(GroupCursor::decode("after", &after).unwrap());
    }
}

/// The group names `sql` reads (one text column).
async fn names(store: &Store, sql: &'static str) -> Vec<String> {
    match store {
        Store::Sqlite(s) => s
            .read(move |conn| {
                let mut stmt = conn.prepare(sql)?;
                let rows = stmt.query_map([], |row| row.get(0))?;
                Ok(rows.collect::<Result<Vec<String>, _>>()?)
            })
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_scalar(sql).fetch_all(s.pool()).await.unwrap(),
    }
}

/// `waiting_group`'s rows, by name.
async fn table(store: &Store) -> Vec<String> {
    names(
        store,
        "SELECT group_name FROM waiting_group ORDER BY group_name",
    )
    .await
}

/// The groups with a waiting attempt, from `declarer_attempt` itself.
async fn with_waiting_attempts(store: &Store) -> Vec<String> {
    let sql = "SELECT DISTINCT group_name FROM declarer_attempt WHERE status = 'waiting' \
               ORDER BY group_name";
    names(store, sql).await
}

/// The page of waiting groups is `expected`, and so is the table (read after the page, which
/// catches the attempts' projector up), which names exactly the groups with a waiting attempt.
async fn listed(wharf: &Wharf, store: &Store, expected: &[&str], when: &str) {
    assert_eq!(waiting_page(wharf).await, expected, "{when}: the page");
    let rows = table(store).await;
    assert_eq!(rows, expected, "{when}: waiting_group");
    assert_eq!(
        with_waiting_attempts(store).await,
        rows,
        "{when}: waiting_group against declarer_attempt"
    );
}

/// Three groups with an incumbent kept live; `quiet` never has a waiter.
async fn groups_with_waits(test: &TestStore, wharf: &Wharf) {
    for group in ["alpha", "beta", "quiet"] {
        installs(register(wharf, group, "incumbent", &["orders/a/#"]).await);
        keep_live(&test.store, group, "incumbent", &["orders/a/#"]).await;
    }
    listed(wharf, &test.store, &[], "installs only").await;
    waits(register(wharf, "alpha", "w1", &["orders/b/#"]).await);
    listed(wharf, &test.store, &["alpha"], "one wait").await;
    waits(register(wharf, "alpha", "w2", &["orders/b/#"]).await);
    waits(register(wharf, "alpha", "w3", &["orders/c/#"]).await);
    waits(register(wharf, "beta", "w1", &["orders/b/#"]).await);
    waits(register(wharf, "beta", "w1", &["orders/d"]).await);
    listed(
        wharf,
        &test.store,
        &["alpha", "beta"],
        "waits in two groups",
    )
    .await;
}

async fn each_way_a_wait_ends(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.steady_wharf();
    groups_with_waits(&test, &wharf).await;
    // alpha: w1 installs its own set, which resolves w2's wait for it; w3 waits on.
    test.store.leave("alpha", "incumbent").await.unwrap();
    installs(register(&wharf, "alpha", "w1", &["orders/b/#"]).await);
    listed(&wharf, &test.store, &["alpha", "beta"], "w3 still waits").await;
    // alpha: a newcomer installs w3's set (once no live instance declares w1's): no wait
    // is left.
    for declarer in ["w1", "w2"] {
        test.store.leave("alpha", declarer).await.unwrap();
    }
    installs(register(&wharf, "alpha", "newcomer", &["orders/c/#"]).await);
    listed(&wharf, &test.store, &["beta"], "alpha's waits resolved").await;
    // beta: its only waiter installs the set it moved to.
    test.store.leave("beta", "incumbent").await.unwrap();
    installs(register(&wharf, "beta", "w1", &["orders/d"]).await);
    listed(&wharf, &test.store, &[], "beta's waiter installed").await;
    // A wait again puts a group back.
    keep_live(&test.store, "beta", "w1", &["orders/d"]).await;
    waits(register(&wharf, "beta", "w9", &["orders/e"]).await);
    listed(&wharf, &test.store, &["beta"], "a new wait").await;
    let replay = wharf
        .read_model()
        .rebuild(RebuildMode::Verify, Arc::new(|_, _| {}))
        .await
        .unwrap();
    assert!(replay.is_clean(), "{replay:?}");
}
on_both_backends!(
    each_way_a_wait_ends_moves_its_group_off_the_page,
    each_way_a_wait_ends
);

async fn backfill_and_drift(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.steady_wharf();
    groups_with_waits(&test, &wharf).await;
    // The migration's backfill, into an empty table, gives the rows the appends left.
    execute_sql(&test.store, "DELETE FROM waiting_group").await;
    assert_eq!(waiting_page(&wharf).await, Vec::<String>::new());
    rerun_migration(&test.store, "waiting_group").await;
    listed(&wharf, &test.store, &["alpha", "beta"], "backfilled").await;

    // A row no waiting attempt backs (an older build's install does not remove it) lists
    // nothing; a missing row (an older build's wait does not add it) is a difference that
    // verify names and a rebuild repairs.
    execute_sql(
        &test.store,
        "DELETE FROM waiting_group WHERE group_name = 'beta'; \
         INSERT INTO waiting_group (group_name) VALUES ('quiet')",
    )
    .await;
    assert_eq!(waiting_page(&wharf).await, ["alpha"]);
    let verify = wharf
        .read_model()
        .rebuild(RebuildMode::Verify, Arc::new(|_, _| {}))
        .await
        .unwrap();
    let differences: Vec<(&str, u64, u64)> = verify
        .differences
        .iter()
        .map(|d| (d.table.as_str(), d.only_live, d.only_rebuilt))
        .collect();
    assert_eq!(differences, [("waiting_group", 1, 1)]);
    wharf
        .read_model()
        .rebuild(RebuildMode::Apply, Arc::new(|_, _| {}))
        .await
        .unwrap();
    listed(&wharf, &test.store, &["alpha", "beta"], "rebuilt").await;
}
on_both_backends!(
    the_backfill_and_a_rebuild_give_the_rows_the_appends_left,
    backfill_and_drift
);
