//! The consumer runtime end to end on real stores: a consumer with a handler handles exactly
//! what its set routes to it and acks it; failures are retried with growing attempts, then
//! dead-lettered and replayable; concurrency is bounded; a waiting consumer never handles
//! anything; shutdown drains running handlers before it leaves, and aborts them past the drain
//! deadline (the message is redelivered); a panicking handler is a failed message, not a dead
//! consumer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use wharf::config::QueueConfig;
use wharf::domain::{DeclarerId, GroupName};
use wharf::handler::{handler_fn, HandlerError};
use wharf::queue::{Claimed, GroupQueueStats, Headers};
use wharf::{Consumer, ConsumerState, ConsumerStats, Registration, Wharf, WharfError};
use wharf_tests::states::StateLog;
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(20);

/// A Wharf over `store` with fast queue timings, adjusted by `adjust`.
fn fast_wharf(store: &TestStore, adjust: impl FnOnce(&mut QueueConfig)) -> Wharf {
    let mut config = store.config();
    // Every consumer here leaves gracefully, so nothing waits on a lapse; a long TTL keeps a
    // loaded machine's late heartbeat from swapping an incumbent out mid-test.
    config.declarations.instance_ttl = Duration::from_secs(5);
    config.queue = QueueConfig {
        visibility_timeout: Duration::from_millis(500),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        poll_interval: Duration::from_millis(20),
        drain_timeout: Duration::from_secs(10),
        ..QueueConfig::default()
    };
    adjust(&mut config.queue);
    Wharf::with_store(store.store.clone(), &config.settings())
}

fn as_declarer(wharf: &Wharf, name: &str) -> Wharf {
    wharf.as_declarer(DeclarerId::parse("declarer", name).unwrap())
}

fn registration(patterns: &[&str]) -> Registration {
    Registration::new("billing", "orders", "1", patterns).unwrap()
}

fn group() -> GroupName {
    GroupName::parse("group", "billing").unwrap()
}

fn message(subject: &str) -> (String, Vec<u8>, Headers) {
    let headers = Headers::from([("subject".to_owned(), subject.to_owned())]);
    (subject.to_owned(), subject.as_bytes().to_vec(), headers)
}

async fn publish(wharf: &Wharf, subjects: &[&str]) -> Vec<i64> {
    let messages = subjects.iter().map(|s| message(s)).collect();
    wharf.publish("orders", messages).await.unwrap()
}

async fn queue_stats(wharf: &Wharf) -> GroupQueueStats {
    let mut stats = wharf.queue().group_stats(Some(&group())).await.unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    stats.remove(0)
}

fn settled(stats: &GroupQueueStats) -> bool {
    stats.claimable + stats.in_flight + stats.backing_off == 0
}

/// A handler that records every message it gets and succeeds.
fn recorder(sink: Arc<Mutex<Vec<Claimed>>>) -> impl wharf::Handler {
    handler_fn(move |message: Claimed| {
        let sink = sink.clone();
        async move {
            sink.lock().unwrap().push(message);
            Ok(())
        }
    })
}

fn subjects(seen: &Mutex<Vec<Claimed>>) -> Vec<String> {
    let mut subjects: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.subject.clone())
        .collect();
    subjects.sort();
    subjects
}

async fn reach(consumer: &Consumer, what: &str, done: impl FnMut(&ConsumerState) -> bool) {
    let mut watch = consumer.watch();
    tokio::time::timeout(DEADLINE, watch.wait_for(done))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}: {:?}", consumer.state()))
        .unwrap();
}

async fn ready(consumer: &Consumer, what: &str) {
    reach(consumer, what, ConsumerState::is_ready).await;
}

async fn counted(consumer: &Consumer, what: &str, done: impl Fn(ConsumerStats) -> bool) {
    wait_until(what, DEADLINE, || {
        let stats = consumer.stats();
        let done = done(stats);
        async move { done }
    })
    .await;
}

async fn handles_exactly_the_matching_messages_and_acks_them(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = fast_wharf(&store, |_| {});
    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = wharf.consume_with(registration(&["orders/+/paid"]), recorder(seen.clone()));
    ready(&consumer, "the consumer").await;

    let positions = publish(
        &wharf,
        &[
            "orders/eu/paid",
            "orders/eu/refunded",
            "orders/us/paid",
            "other",
        ],
    )
    .await;
    assert_eq!(positions, vec![1, 2, 3, 4]);
    counted(&consumer, "two messages handled", |s| s.handled_ok == 2).await;

    assert_eq!(subjects(&seen), vec!["orders/eu/paid", "orders/us/paid"]);
    for handled in seen.lock().unwrap().iter() {
        assert_eq!(handled.payload, handled.subject.as_bytes());
        assert_eq!(handled.headers["subject"], handled.subject);
        assert_eq!((handled.group.as_str(), handled.attempts), ("billing", 1));
    }
    let stats = queue_stats(&wharf).await;
    assert_eq!(stats.routed_position, 4, "every position was routed");
    assert!(settled(&stats), "nothing claimable or in flight: {stats:?}");
    assert_eq!(stats.dead_letters, 0);

    let last = consumer.shutdown().await;
    assert_eq!(
        last,
        ConsumerStats {
            handled_ok: 2,
            // Fetches depend on timing (empty polls); at least the claiming one happened.
            fetches: last.fetches.max(1),
            ..ConsumerStats::default()
        }
    );
    assert_eq!(subjects(&seen).len(), 2, "nothing handled twice");
}
on_both_backends!(
    matching_messages,
    handles_exactly_the_matching_messages_and_acks_them
);

async fn publish_refuses_a_bad_batch_by_index_and_writes_nothing(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = fast_wharf(&store, |_| {});
    let err = wharf
        .publish("orders", vec![message("a/b"), message("a/+")])
        .await
        .unwrap_err();
    let WharfError::Invalid(invalid) = err else {
        panic!("a bad subject is invalid input: {err:?}");
    };
    assert_eq!(
        (invalid.field.as_str(), invalid.value.as_str()),
        ("messages[1].subject", "a/+")
    );
    let err = wharf.publish("", vec![message("a")]).await.unwrap_err();
    assert!(
        matches!(&err, WharfError::Invalid(e) if e.field == "topic"),
        "{err:?}"
    );
    let err = wharf.publish("orders", Vec::new()).await.unwrap_err();
    assert!(
        matches!(&err, WharfError::Invalid(e) if e.field == "messages"),
        "{err:?}"
    );
    assert!(wharf.queue().topic_stats().await.unwrap().is_empty());
}
on_both_backends!(
    publish_validation,
    publish_refuses_a_bad_batch_by_index_and_writes_nothing
);

async fn failures_retry_then_dead_letter_and_replay_succeeds(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = fast_wharf(&store, |q| q.max_attempts = 3);
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let fixed = Arc::new(AtomicBool::new(false));
    let handler = {
        let (attempts, fixed) = (attempts.clone(), fixed.clone());
        handler_fn(move |message: Claimed| {
            let (attempts, fixed) = (attempts.clone(), fixed.clone());
            async move {
                attempts.lock().unwrap().push(message.attempts);
                if fixed.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(HandlerError::new(format!(
                        "cannot bill {}",
                        message.subject
                    )))
                }
            }
        })
    };
    let consumer = wharf.consume_with(registration(&["orders/#"]), handler);
    ready(&consumer, "the consumer").await;
    publish(&wharf, &["orders/eu/paid"]).await;

    counted(&consumer, "three failed attempts", |s| s.handled_err == 3).await;
    let dead = wharf.queue().dead_letters(&group(), 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].position, dead[0].attempts), (1, 3));
    assert_eq!(
        dead[0].last_error.as_deref(),
        Some("cannot bill orders/eu/paid")
    );
    assert_eq!(dead[0].payload, b"orders/eu/paid");
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3], "attempts grow");
    let stats = queue_stats(&wharf).await;
    assert!(settled(&stats) && stats.dead_letters == 1, "{stats:?}");

    fixed.store(true, Ordering::SeqCst);
    assert!(wharf.queue().replay_dead_letter(&group(), 1).await.unwrap());
    counted(&consumer, "the replayed message handled", |s| {
        s.handled_ok == 1
    })
    .await;
    assert_eq!(
        *attempts.lock().unwrap(),
        vec![1, 2, 3, 1],
        "a replay starts with fresh attempts"
    );
    assert!(wharf
        .queue()
        .dead_letters(&group(), 0, 10)
        .await
        .unwrap()
        .is_empty());
    let stats = queue_stats(&wharf).await;
    assert!(settled(&stats) && stats.dead_letters == 0, "{stats:?}");
    let last = consumer.shutdown().await;
    assert_eq!((last.handled_ok, last.handled_err), (1, 3));
}
on_both_backends!(
    retry_dead_letter_replay,
    failures_retry_then_dead_letter_and_replay_succeeds
);

async fn concurrency_is_bounded(backend: Backend) {
    let store = TestStore::new(backend).await;
    // A long visibility timeout: the blocked handlers' claims must not expire mid-test.
    let wharf = fast_wharf(&store, |q| {
        q.concurrency = 3;
        q.claim_batch = 32;
        q.visibility_timeout = Duration::from_secs(60);
    });
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let handler = {
        let (running, most) = (running.clone(), most.clone());
        handler_fn(move |_message: Claimed| {
            let (running, most, mut released) = (running.clone(), most.clone(), released.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let waited = tokio::time::timeout(DEADLINE, released.wait_for(|go| *go)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                match waited {
                    Ok(Ok(_)) => Ok(()),
                    _ => Err("never released".into()),
                }
            }
        })
    };
    let consumer = wharf.consume_with(registration(&[]), handler);
    ready(&consumer, "the consumer").await;
    let subjects: Vec<String> = (0..10).map(|i| format!("orders/{i}")).collect();
    let subjects: Vec<&str> = subjects.iter().map(String::as_str).collect();
    publish(&wharf, &subjects).await;

    wait_until("three handlers running", DEADLINE, || {
        let now = running.load(Ordering::SeqCst);
        async move { now == 3 }
    })
    .await;
    // The other seven wait: claimable, or on SQLite possibly not routed yet (ADR 0069).
    let stats = queue_stats(&wharf).await;
    assert_eq!(
        (stats.in_flight, stats.claimable + stats.routed_lag),
        (3, 7),
        "claims only as many as there are free slots: {stats:?}"
    );
    assert_eq!(consumer.stats().in_flight, 3);

    release.send_replace(true);
    counted(&consumer, "all ten handled", |s| s.handled_ok == 10).await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        3,
        "never more than three at once"
    );
    assert!(settled(&queue_stats(&wharf).await));
    consumer.shutdown().await;
}
on_both_backends!(bounded_concurrency, concurrency_is_bounded);

async fn a_waiting_consumer_handles_nothing_until_its_set_is_installed(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = fast_wharf(&store, |_| {});
    // The incumbent handles one message at a time and holds its first (under a long claim)
    // until released, so a second message of its set stays claimable while the new set waits.
    let old_seen = Arc::new(Mutex::new(Vec::new()));
    let (release, released) = watch::channel(false);
    let gated = {
        let old_seen = old_seen.clone();
        handler_fn(move |message: Claimed| {
            let (old_seen, mut released) = (old_seen.clone(), released.clone());
            async move {
                tokio::time::timeout(DEADLINE, released.wait_for(|go| *go))
                    .await
                    .map_err(HandlerError::from_error)?
                    .map_err(HandlerError::from_error)?;
                old_seen.lock().unwrap().push(message);
                Ok(())
            }
        })
    };
    let one_at_a_time = fast_wharf(&store, |q| {
        q.concurrency = 1;
        q.visibility_timeout = Duration::from_secs(60);
    });
    let old =
        as_declarer(&one_at_a_time, "old").consume_with(registration(&["orders/eu/#"]), gated);
    ready(&old, "the incumbent").await;

    let new_seen = Arc::new(Mutex::new(Vec::new()));
    let new = as_declarer(&wharf, "new")
        .consume_with(registration(&["orders/us/#"]), recorder(new_seen.clone()));
    let states = StateLog::record(&new);
    reach(&new, "the new set waiting", |s| {
        matches!(s, ConsumerState::Waiting { .. })
    })
    .await;

    // Published while the incumbent's set is in effect: routed with that set (orders/us/1 is
    // routed past, not delivered).
    let positions = publish(&wharf, &["orders/us/1", "orders/eu/1", "orders/eu/2"]).await;
    counted(&old, "the incumbent holding a message", |s| {
        s.in_flight == 1
    })
    .await;
    reach(
        &new,
        "several waiting attempts",
        |s| matches!(s, ConsumerState::Waiting { attempts, .. } if *attempts >= 6),
    )
    .await;
    // orders/eu/2 waits for the incumbent: a claimable delivery, or on SQLite possibly still in
    // the log, where a claim routes only as far as it claims (ADR 0069) once the group's
    // routing is aligned with its install.
    let stats = queue_stats(&wharf).await;
    let unrouted = i64::from(stats.routed_position < positions[2]);
    assert_eq!(
        (stats.in_flight, stats.claimable + unrouted),
        (1, 1),
        "the waiter left the claimable message alone: {stats:?}"
    );
    assert!(unrouted == 0 || backend == Backend::Sqlite, "{stats:?}");
    assert!(!new.is_ready());
    assert_eq!(
        new.stats(),
        ConsumerStats::default(),
        "a waiter claims nothing"
    );
    release.send_replace(true);
    counted(&old, "the incumbent handled its messages", |s| {
        s.handled_ok == 2
    })
    .await;
    assert!(new_seen.lock().unwrap().is_empty());
    assert_eq!(subjects(&old_seen), vec!["orders/eu/1", "orders/eu/2"]);

    old.shutdown().await;
    ready(&new, "the new set after the incumbent left").await;
    publish(&wharf, &["orders/us/2", "orders/eu/2"]).await;
    // orders/us/1 was routed past while the incumbent's set was in effect; the swap applies to
    // everything the group has not consumed, so the new set handles it too (ADR 0014).
    counted(&new, "the new set handled its messages", |s| {
        s.handled_ok == 2
    })
    .await;
    let mut handled = subjects(&new_seen);
    handled.sort();
    assert_eq!(handled, vec!["orders/us/1", "orders/us/2"]);
    let stats = queue_stats(&wharf).await;
    assert_eq!(stats.routed_position, 5);
    assert!(settled(&stats), "{stats:?}");

    let states = states.until_ready().await;
    let first_ready = states.iter().position(ConsumerState::is_ready).unwrap();
    assert!(
        states[..first_ready]
            .iter()
            .any(|s| matches!(s, ConsumerState::Waiting { .. })),
        "the new consumer waited before it became ready: {states:?}"
    );
    new.shutdown().await;
}
on_both_backends!(
    waiting_consumer,
    a_waiting_consumer_handles_nothing_until_its_set_is_installed
);

async fn shutdown_drains_running_handlers_before_leaving(backend: Backend) {
    let store = TestStore::new(backend).await;
    // The claim must outlive the slow handler, however loaded the machine.
    let wharf = fast_wharf(&store, |q| q.visibility_timeout = Duration::from_secs(60));
    let (started, mut has_started) = watch::channel(false);
    let finished = Arc::new(AtomicBool::new(false));
    let still_live_when_done = Arc::new(AtomicBool::new(false));
    let handler = {
        let (finished, still_live) = (finished.clone(), still_live_when_done.clone());
        // The consumer's own instance identity, known once it has started.
        let (store, declarer) = (wharf.store().clone(), Arc::new(Mutex::new(String::new())));
        let named = declarer.clone();
        (
            named,
            handler_fn(move |_message: Claimed| {
                let (started, finished, still_live) =
                    (started.clone(), finished.clone(), still_live.clone());
                let (store, declarer) = (store.clone(), declarer.clone());
                async move {
                    started.send_replace(true);
                    tokio::time::sleep(Duration::from_millis(200)).await; // the work itself
                    let instances = store
                        .instances(None)
                        .await
                        .map_err(HandlerError::from_error)?;
                    let declarer = declarer.lock().unwrap().clone();
                    still_live.store(
                        instances.iter().any(|i| i.declarer == declarer),
                        Ordering::SeqCst,
                    );
                    finished.store(true, Ordering::SeqCst);
                    Ok(())
                }
            }),
        )
    };
    let (named, handler) = handler;
    let consumer = wharf.consume_with(registration(&["orders/#"]), handler);
    *named.lock().unwrap() = consumer.declarer().to_string();
    ready(&consumer, "the consumer").await;
    publish(&wharf, &["orders/slow"]).await;
    tokio::time::timeout(DEADLINE, has_started.wait_for(|s| *s))
        .await
        .expect("the handler started")
        .unwrap();

    let last = consumer.shutdown().await;
    assert!(
        finished.load(Ordering::SeqCst),
        "shutdown waited for the handler"
    );
    assert!(
        still_live_when_done.load(Ordering::SeqCst),
        "the instance was still live while its handler ran"
    );
    assert_eq!(
        last,
        ConsumerStats {
            handled_ok: 1,
            // Fetches depend on timing (empty polls); at least the claiming one happened.
            fetches: last.fetches.max(1),
            ..ConsumerStats::default()
        }
    );
    let stats = queue_stats(&wharf).await;
    assert!(
        settled(&stats) && stats.dead_letters == 0,
        "acked, so never redelivered: {stats:?}"
    );
    assert!(
        wharf.store().instances(None).await.unwrap().is_empty(),
        "left after draining"
    );
}
on_both_backends!(
    drain_on_shutdown,
    shutdown_drains_running_handlers_before_leaving
);

async fn handlers_past_the_drain_deadline_are_aborted_and_redelivered(backend: Backend) {
    let store = TestStore::new(backend).await;
    let wharf = fast_wharf(&store, |q| q.drain_timeout = Duration::from_millis(100));
    let (started, mut has_started) = watch::channel(0i32);
    let stuck = handler_fn(move |message: Claimed| {
        let started = started.clone();
        async move {
            started.send_replace(message.attempts);
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    let consumer = as_declarer(&wharf, "stuck").consume_with(registration(&["orders/#"]), stuck);
    ready(&consumer, "the stuck consumer").await;
    publish(&wharf, &["orders/stuck"]).await;
    tokio::time::timeout(DEADLINE, has_started.wait_for(|a| *a == 1))
        .await
        .expect("the handler started")
        .unwrap();
    let began = Instant::now();
    let last = consumer.shutdown().await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "the drain deadline held"
    );
    assert_eq!(last.handled_ok + last.handled_err, 0);
    assert_eq!(last.in_flight, 0, "the aborted handler freed its slot");
    assert!(wharf.store().instances(None).await.unwrap().is_empty());

    // The claim expires and another instance gets the message again: at least once.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let next = as_declarer(&wharf, "next")
        .consume_with(registration(&["orders/#"]), recorder(seen.clone()));
    counted(&next, "the message redelivered", |s| s.handled_ok == 1).await;
    let redelivered = seen.lock().unwrap()[0].clone();
    assert_eq!(
        (redelivered.subject.as_str(), redelivered.attempts),
        ("orders/stuck", 2)
    );
    next.shutdown().await;
}
on_both_backends!(
    drain_deadline,
    handlers_past_the_drain_deadline_are_aborted_and_redelivered
);

async fn a_panicking_handler_is_nacked_and_the_consumer_carries_on(backend: Backend) {
    let store = TestStore::new(backend).await;
    // Printing a panic (with RUST_BACKTRACE set) can outlast a short claim, which would turn
    // the nack into a lost claim; this test is about the nack, so claims last.
    let wharf = fast_wharf(&store, |q| {
        q.max_attempts = 1;
        q.visibility_timeout = Duration::from_secs(60);
    });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        handler_fn(move |message: Claimed| {
            let seen = seen.clone();
            async move {
                if message.subject.ends_with("boom") {
                    panic!("exploded at position {}", message.position);
                }
                seen.lock().unwrap().push(message);
                Ok(())
            }
        })
    };
    let consumer = wharf.consume_with(registration(&["orders/#"]), handler);
    ready(&consumer, "the consumer").await;
    publish(&wharf, &["orders/boom"]).await;
    counted(&consumer, "the panic counted as a failure", |s| {
        s.handled_err == 1
    })
    .await;
    let dead = wharf.queue().dead_letters(&group(), 0, 10).await.unwrap();
    let error = dead[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("panicked") && error.contains("exploded at position 1"),
        "{error}"
    );
    assert!(consumer.is_ready(), "the consumer survived the panic");

    publish(&wharf, &["orders/fine"]).await;
    counted(&consumer, "the next message handled", |s| s.handled_ok == 1).await;
    assert_eq!(subjects(&seen), vec!["orders/fine"]);
    let last = consumer.shutdown().await;
    assert_eq!((last.handled_ok, last.handled_err), (1, 1));
}
on_both_backends!(
    panicking_handler,
    a_panicking_handler_is_nacked_and_the_consumer_carries_on
);
