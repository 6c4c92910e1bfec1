//! No union window: readers loading a group's effective binding rows while swaps happen each
//! see exactly one declared set, never a mixture of two.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use wharf::domain::{DeclarerId, GroupName};
use wharf::Registration;
use wharf_tests::{on_both_backends, Backend, TestStore};

const SWAPS: usize = 120;
const READERS: usize = 3;

fn sets() -> Vec<Vec<&'static str>> {
    vec![
        vec!["a/1", "a/2"],
        vec!["b/1", "b/2", "b/3"],
        vec![],
        vec!["a/1", "c/#"],
    ]
}

async fn readers_see_exactly_one_declared_set(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let group = GroupName::parse("group", "g").unwrap();
    let declared: HashSet<Vec<String>> = sets()
        .iter()
        .map(|s| {
            let mut v: Vec<String> = s.iter().map(|p| (*p).to_owned()).collect();
            v.sort();
            v
        })
        .collect();
    wharf
        .register(&Registration::new("g", "t", "1", &sets()[0]).unwrap())
        .await
        .unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let read = wharf.read_model().clone();
        let (done, declared, group) = (done.clone(), declared.clone(), group.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0u64;
            let mut seen = HashSet::new();
            while !done.load(Ordering::Relaxed) {
                let mut rows = read.effective_bindings(&group).await.unwrap();
                rows.sort();
                assert!(declared.contains(&rows), "a reader saw a mixture: {rows:?}");
                seen.insert(rows);
                reads += 1;
            }
            (reads, seen.len())
        }));
    }
    for i in 0..SWAPS {
        let set = &sets()[(i + 1) % sets().len()];
        let declarer = DeclarerId::parse("declarer", &format!("swapper-{i}")).unwrap();
        wharf
            .as_declarer(declarer)
            .register(&Registration::new("g", "t", "1", set).unwrap())
            .await
            .unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let mut total_reads = 0;
    for reader in readers {
        let (reads, distinct) = reader.await.unwrap();
        total_reads += reads;
        assert!(distinct >= 1);
    }
    assert!(total_reads > 0);
    let installs = wharf
        .store()
        .load("consumer_group", "g")
        .await
        .unwrap()
        .len();
    assert_eq!(
        installs,
        SWAPS + 1,
        "every swap installed (no live declarers)"
    );
}
on_both_backends!(no_union_window, readers_see_exactly_one_declared_set);
