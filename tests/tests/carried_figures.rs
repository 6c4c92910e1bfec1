//! The listing reads that carry a group's queue figures in their own statement on Postgres,
//! against the queue's own read of them, on real stores (both backends):
//!
//! - one group's read (`wharf_group_read`, ADR 0071) and a page of groups (`wharf_group_page`,
//!   ADR 0072) carry the same figures as `Queue::group_stats_of` (the oldest unacked message's
//!   age aside: two clock readings) through declared, published, routed, claimed, acked,
//!   backing off and dead-lettered;
//! - a page carries the figures of the groups it lists only (not of the row fetched to see
//!   whether more follow), leaves out a group without a queue row as the queue does, and a
//!   filtered page carries its own groups';
//! - SQLite reports them not read (the API then asks the queue); a group never declared reads
//!   as none.

use std::time::Duration;

use wharf::domain::GroupName;
use wharf::projections::{CarriedFigures, GroupQuery, MemberQuery, ReadModel, SummaryPage};
use wharf_queue::{AckOutcome, GroupQueueStats, NackOutcome, Queue, QueueSettings};
use wharf_tests::fixtures::{bury_next, declare, group, msg, topic};
use wharf_tests::{on_both_backends, Backend, TestStore};

/// The figures a one-group read carries, as the queue reads them: `None` when the read did
/// not carry them (SQLite).
async fn group_carried(read_model: &ReadModel, g: &GroupName) -> Option<Option<GroupQueueStats>> {
    let (_, carried) = read_model
        .group_members_with_figures(g, &MemberQuery::default())
        .await
        .unwrap()
        .expect("a declared group");
    match carried {
        CarriedFigures::Read(found) => {
            assert!(found.len() <= 1, "one group's read carried {found:?}");
            Some(
                found
                    .into_iter()
                    .next()
                    .map(|(group, row)| GroupQueueStats::from_figures(group, row)),
            )
        }
        CarriedFigures::NotRead => None,
    }
}

/// A page and the figures it carried, as the queue reads them: `None` when the read did not
/// carry them (SQLite).
async fn page_carried(
    read_model: &ReadModel,
    query: &GroupQuery,
) -> (SummaryPage, Option<Vec<GroupQueueStats>>) {
    let (page, carried) = read_model.groups_page_with_figures(query).await.unwrap();
    let carried = match carried {
        CarriedFigures::Read(found) => Some(
            found
                .into_iter()
                .map(|(g, row)| GroupQueueStats::from_figures(g, row))
                .collect(),
        ),
        CarriedFigures::NotRead => None,
    };
    (page, carried)
}

/// Everything but the age, which two reads take at two moments; whether there is one.
fn settled(s: &GroupQueueStats) -> GroupQueueStats {
    GroupQueueStats {
        oldest_unacked_seconds: s.oldest_unacked_seconds.map(|_| 0.0),
        ..s.clone()
    }
}

fn all_settled(stats: &[GroupQueueStats]) -> Vec<GroupQueueStats> {
    stats.iter().map(settled).collect()
}

/// Checks every read that carries figures against the queue's own read, at one moment of
/// the queue's life (`what`).
async fn agree(backend: Backend, read_model: &ReadModel, queue: &Queue, g: &GroupName, what: &str) {
    let own = queue.group_stats_of(std::slice::from_ref(g)).await.unwrap();
    match group_carried(read_model, g).await {
        Some(carried) => assert_eq!(
            carried.as_ref().map(settled),
            own.first().map(settled),
            "one group, {what}"
        ),
        None => assert!(
            matches!(backend, Backend::Sqlite),
            "Postgres reads the figures with the group ({what})"
        ),
    }
    let (page, carried) = page_carried(read_model, &GroupQuery::default()).await;
    let names: Vec<GroupName> = page.groups.iter().map(|s| group(&s.group)).collect();
    let own = queue.group_stats_of(&names).await.unwrap();
    match carried {
        Some(carried) => assert_eq!(all_settled(&carried), all_settled(&own), "page, {what}"),
        None => assert!(
            matches!(backend, Backend::Sqlite),
            "Postgres reads the figures with the page ({what})"
        ),
    }
}

fn one_attempt_queue(store: &TestStore) -> Queue {
    Queue::new(
        store.store.clone(),
        QueueSettings {
            visibility_timeout: Duration::from_secs(60),
            backoff_base: Duration::from_secs(60),
            backoff_max: Duration::from_secs(60),
            max_attempts: 2,
            route_batch: 100,
        },
    )
}

async fn reads_carry_the_queue_figures(backend: Backend) {
    let store = TestStore::new(backend).await;
    declare(&store, "g", "t", &["s/#"]).await;
    // A second group on another topic, never published to: its figures beside g's.
    declare(&store, "h", "u", &[]).await;
    let (g, t) = (group("g"), topic("t"));
    let read_model = ReadModel::new(store.store.clone(), Duration::from_secs(60));
    let queue = one_attempt_queue(&store);
    agree(
        backend,
        &read_model,
        &queue,
        &g,
        "declared, nothing published",
    )
    .await;
    // Eight messages the group wants and one it does not.
    let batch: Vec<_> = [
        "s/1", "x/2", "s/3", "s/4", "s/5", "s/6", "s/7", "s/8", "s/9",
    ]
    .iter()
    .map(|s| msg(s))
    .collect();
    queue.publish(&t, &batch).await.unwrap();
    agree(backend, &read_model, &queue, &g, "published, not routed").await;
    queue.route(&g).await.unwrap();
    agree(backend, &read_model, &queue, &g, "routed").await;
    // Four claimable, two in flight, one backing off: no two counts alike.
    let held = queue.claim(&g, "i", 4).await.unwrap();
    assert_eq!(held.len(), 4);
    assert_eq!(queue.ack(&held[0]).await.unwrap(), AckOutcome::Acked);
    let NackOutcome::Retrying { .. } = queue.nack(&held[1], "later").await.unwrap() else {
        panic!("expected a retry");
    };
    agree(
        backend,
        &read_model,
        &queue,
        &g,
        "acked, backing off, in flight",
    )
    .await;
    bury_next(&store, &g).await;
    agree(backend, &read_model, &queue, &g, "a dead letter").await;
    let figures = queue
        .group_stats_of(std::slice::from_ref(&g))
        .await
        .unwrap();
    let s = &figures[0];
    assert_eq!(
        (s.claimable, s.in_flight, s.backing_off, s.dead_letters),
        (3, 2, 1, 1),
        "{s:?}"
    );
    // A group never declared: no view, so nothing to carry.
    let never = group("never");
    assert!(read_model
        .group_members_with_figures(&never, &MemberQuery::default())
        .await
        .unwrap()
        .is_none());
}
on_both_backends!(reads_carry_figures, reads_carry_the_queue_figures);

async fn a_page_carries_its_own_groups_figures(backend: Backend) {
    let store = TestStore::new(backend).await;
    let queue = one_attempt_queue(&store);
    for (name, topic_name) in [("a", "t"), ("b", "t"), ("c", "u")] {
        declare(&store, name, topic_name, &[]).await;
        queue
            .publish(&topic(topic_name), &[msg("s/1")])
            .await
            .unwrap();
        queue.route(&group(name)).await.unwrap();
    }
    let read_model = ReadModel::new(store.store.clone(), Duration::from_secs(60));
    let cases = [
        (GroupQuery::default(), vec!["a", "b", "c"]),
        (
            GroupQuery {
                limit: 1,
                ..GroupQuery::default()
            },
            vec!["a"],
        ),
        (
            GroupQuery {
                topic: Some(topic("u")),
                ..GroupQuery::default()
            },
            vec!["c"],
        ),
    ];
    for (query, listed) in cases {
        let (page, carried) = page_carried(&read_model, &query).await;
        let names: Vec<&str> = page.groups.iter().map(|s| s.group.as_str()).collect();
        assert_eq!(names, listed, "{query:?}");
        let Some(carried) = carried else {
            assert!(matches!(backend, Backend::Sqlite), "{query:?}");
            continue;
        };
        let carried_names: Vec<&str> = carried.iter().map(|s| s.group.as_str()).collect();
        assert_eq!(carried_names, listed, "{query:?}");
        let own = queue
            .group_stats_of(&listed.iter().map(|n| group(n)).collect::<Vec<_>>())
            .await
            .unwrap();
        assert_eq!(all_settled(&carried), all_settled(&own), "{query:?}");
        assert!(carried.iter().all(|s| s.claimable == 1), "{carried:?}");
    }
}
on_both_backends!(
    page_carries_own_groups,
    a_page_carries_its_own_groups_figures
);
