//! The terminal tools as real processes on both backends: `wharf publish`, `wharf tail`
//! (printing and acking, waiting behind a live divergent set, JSON lines, `--no-ack`), bad
//! input, and the binary's `log` section. No test sleeps: every wait is for a line or a state,
//! with a deadline, and every child is killed when dropped.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;
use support::{wharf_in, Backend, Running, TestStore};
use wharf::domain::GroupName;
use wharf::queue::GroupQueueStats;

/// Runs an async test body once per backend.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await;
            }
        }
    };
}

/// `wharf tail --topic orders ARGS...`, running.
fn tail(store: &TestStore, name: &str, args: &[&str]) -> Running {
    let mut all = vec!["tail", "--topic", "orders"];
    all.extend_from_slice(args);
    Running::start(name, store.command(), &all)
}

/// The group's queue figures, read through the library.
async fn figures(store: &TestStore, group: &str) -> GroupQueueStats {
    let group = GroupName::parse("group", group).unwrap();
    let stats = store.wharf().await.queue().group_stats(Some(&group)).await;
    stats
        .unwrap()
        .into_iter()
        .next()
        .expect("the group has figures")
}

fn settled(figures: &GroupQueueStats) -> (i64, i64, i64, i64, i64) {
    (
        figures.claimable,
        figures.in_flight,
        figures.backing_off,
        figures.dead_letters,
        figures.set_aside,
    )
}

async fn publish_then_tail_prints_and_acks(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    // A group starts at the log's head when first declared: the tail declares it first.
    let mut tail_g = tail(&store, "tail", &["--group", "g"]);
    tail_g
        .expect_err("consuming group g with {whole topic}")
        .await;
    let args = [
        "publish",
        "--topic",
        "orders",
        "--subject",
        "orders/eu/paid",
        "--header",
        "source=test",
        "--header",
        "trace=a=b",
        "{\"id\":1}",
    ];
    let first = store.run(&args).await;
    assert_eq!(first.success().trim(), "1", "{first}");
    let args = [
        "publish",
        "--topic",
        "orders",
        "--subject",
        "orders/us/paid",
        "-",
    ];
    let piped = support::run(store.command(), &args, Some(b"from stdin\n".as_slice())).await;
    assert_eq!(piped.success().trim(), "2", "{piped}");

    assert_eq!(
        tail_g.next_out("message 1").await,
        "1 orders/eu/paid {\"id\":1}  [source=test trace=a=b]"
    );
    assert_eq!(
        tail_g.next_out("message 2").await,
        "2 orders/us/paid from stdin\\n"
    );
    assert_eq!(tail_g.terminate().await, Some(0), "{}", tail_g.transcript());
    tail_g.expect_err("stopped: printed 2, acked 2").await;

    let after = figures(&store, "g").await;
    assert_eq!(settled(&after), (0, 0, 0, 0, 0), "{after:?}");
    assert_eq!(after.routed_position, 2, "{after:?}");

    // Another tail of the group gets nothing of that again: its first line is the next publish.
    let mut again = tail(&store, "again", &["--group", "g"]);
    again.expect_err("consuming group g").await;
    assert_eq!(store.publish("orders/eu/paid", "later").await, 3);
    assert_eq!(again.next_out("message 3").await, "3 orders/eu/paid later");
    assert_eq!(again.terminate().await, Some(0), "{}", again.transcript());
}

on_both_backends!(publish_then_tail_prints_and_acks);

async fn tail_waits_behind_a_live_divergent_set(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let mut paid = tail(
        &store,
        "paid",
        &["--group", "g", "--pattern", "orders/+/paid"],
    );
    let declared = paid.expect_err("as instance ").await;
    let paid_id = declared
        .rsplit("as instance ")
        .next()
        .unwrap()
        .trim()
        .to_owned();
    paid.expect_err("consuming group g").await;

    let mut all = tail(&store, "all", &["--group", "g", "--pattern", "orders/#"]);
    let waiting = all.expect_err("WAITING").await;
    for part in ["{orders/+/paid}", paid_id.as_str(), "{orders/#}"] {
        assert!(waiting.contains(part), "{part} in {waiting:?}");
    }

    let eu_paid = store.publish("orders/eu/paid", "p1").await;
    let shipped = store.publish("orders/eu/shipped", "s1").await;
    let us_paid = store.publish("orders/us/paid", "p2").await;
    assert_eq!(
        paid.next_out("p1").await,
        format!("{eu_paid} orders/eu/paid p1")
    );
    assert_eq!(
        paid.next_out("p2").await,
        format!("{us_paid} orders/us/paid p2")
    );
    assert!(
        all.out_so_far().is_empty(),
        "a waiting tail prints nothing\n{}",
        all.transcript()
    );

    assert_eq!(paid.terminate().await, Some(0), "{}", paid.transcript());
    // The waiting set swaps in and gets what it matches and nobody consumed (ADR 0014):
    // the shipped message, not the two the first tail acked.
    all.expect_err("consuming group g with {orders/#}").await;
    assert_eq!(
        all.next_out("the shipped message").await,
        format!("{shipped} orders/eu/shipped s1")
    );
    let later = store.publish("orders/eu/paid", "p3").await;
    assert_eq!(
        all.next_out("p3").await,
        format!("{later} orders/eu/paid p3")
    );
    assert_eq!(all.terminate().await, Some(0), "{}", all.transcript());
    let after = figures(&store, "g").await;
    assert_eq!(settled(&after), (0, 0, 0, 0, 0), "{after:?}");
}

on_both_backends!(tail_waits_behind_a_live_divergent_set);

/// Starts a tail and returns it with its instance identity, once it consumes.
async fn consuming_tail(store: &TestStore, name: &str, args: &[&str]) -> (Running, String) {
    let mut running = tail(store, name, args);
    let declared = running.expect_err("as instance ").await;
    let id = declared.rsplit("as instance ").next().unwrap().trim();
    let id = id.to_owned();
    running.expect_err("consuming group").await;
    (running, id)
}

/// The waiting line is said once per change of the incumbent's live declarers, not per retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_line_is_said_again_when_the_live_declarers_change() {
    let store = TestStore::migrated(Backend::Sqlite).await.unwrap();
    let paid = ["--group", "g", "--pattern", "orders/+/paid"];
    let (mut first, first_id) = consuming_tail(&store, "first", &paid).await;
    let mut all = tail(&store, "all", &["--group", "g", "--pattern", "orders/#"]);
    let waiting = all.expect_err("WAITING").await;
    assert!(waiting.contains(&first_id), "{waiting}");

    let (mut second, second_id) = consuming_tail(&store, "second", &paid).await;
    let both = all.expect_err("WAITING").await;
    assert!(
        both.contains(&first_id) && both.contains(&second_id),
        "{both}"
    );

    assert_eq!(first.terminate().await, Some(0), "{}", first.transcript());
    let one = all.expect_err("WAITING").await;
    assert!(
        one.contains(&second_id) && !one.contains(&first_id),
        "{one}"
    );
    assert_eq!(second.terminate().await, Some(0), "{}", second.transcript());
    all.expect_err("consuming group g with {orders/#}").await;
    assert_eq!(all.terminate().await, Some(0), "{}", all.transcript());
    let said = all.lines_of(false);
    let waits = said.iter().filter(|l| l.contains("WAITING")).count();
    assert_eq!(
        waits,
        3,
        "one line per change, not per retry:\n{}",
        all.transcript()
    );
}

fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

async fn json_lines_and_no_ack_leave_messages_for_the_next_consumer(backend: Backend) {
    let Some(store) = TestStore::migrated(backend).await else {
        return;
    };
    let mut peek = tail(&store, "peek", &["--group", "g", "--json", "--no-ack"]);
    peek.expect_err("consuming group g").await;
    let args = [
        "publish",
        "--topic",
        "orders",
        "--subject",
        "orders/eu/paid",
        "--header",
        "k=v",
        "héllo",
    ];
    assert_eq!(store.run(&args).await.success().trim(), "1");
    // No payload argument, and stdin is not a terminal: the payload is stdin, bytes as given.
    let args = [
        "publish",
        "--topic",
        "orders",
        "--subject",
        "orders/eu/paid",
    ];
    let binary = support::run(
        store.command(),
        &args,
        Some([0xffu8, 0x00, 0x01].as_slice()),
    )
    .await;
    assert_eq!(binary.success().trim(), "2", "{binary}");

    let one = parse(&peek.next_out("message 1").await);
    assert_eq!(one["position"], 1, "{one}");
    assert_eq!(one["topic"], "orders", "{one}");
    assert_eq!(one["subject"], "orders/eu/paid", "{one}");
    assert_eq!(one["payload"], "héllo", "{one}");
    assert_eq!(one["headers"], serde_json::json!({"k": "v"}), "{one}");
    assert_eq!(one["attempts"], 1, "{one}");
    assert!(one["routed_by"].is_i64(), "{one}");
    let published = one["published_at"].as_str().unwrap();
    chrono::DateTime::parse_from_rfc3339(published).unwrap();
    let two = parse(&peek.next_out("message 2").await);
    assert_eq!(two["payload_base64"], "/wAB", "{two}");
    assert!(two.get("payload").is_none(), "{two}");

    // While the peek runs it holds both: nothing is claimable, nothing is settled.
    let held = figures(&store, "g").await;
    assert_eq!(
        (held.claimable, held.in_flight, held.dead_letters),
        (0, 2, 0),
        "{held:?}"
    );
    assert_eq!(peek.terminate().await, Some(0), "{}", peek.transcript());
    peek.expect_err("stopped: printed 2, gave back 2").await;

    // The next consumer of the group gets both, the peek counted as an attempt.
    let mut next = tail(&store, "next", &["--group", "g", "--json"]);
    let mut again = vec![
        parse(&next.next_out("message 1 again").await),
        parse(&next.next_out("message 2 again").await),
    ];
    again.sort_by_key(|m| m["position"].as_i64());
    assert_eq!(
        (again[0]["position"].as_i64(), again[1]["position"].as_i64()),
        (Some(1), Some(2))
    );
    assert!(again.iter().all(|m| m["attempts"] == 2), "{again:?}");
    assert_eq!(next.terminate().await, Some(0), "{}", next.transcript());
    let after = figures(&store, "g").await;
    assert_eq!(settled(&after), (0, 0, 0, 0, 0), "{after:?}");
}

on_both_backends!(json_lines_and_no_ack_leave_messages_for_the_next_consumer);

#[tokio::test]
async fn bad_input_is_refused_naming_the_flag_and_no_store_is_created() {
    let store = TestStore::new(Backend::Sqlite).await.unwrap();
    for args in [
        &[
            "publish",
            "--topic",
            "orders",
            "--subject",
            "orders/eu/paid",
            "x",
        ][..],
        &["tail", "--group", "g", "--topic", "orders"][..],
    ] {
        let failed = store.run(args).await;
        assert!(failed.failure().contains("no store at"), "{failed}");
    }
    let left: Vec<_> = std::fs::read_dir(store.dir.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "publish and tail must create nothing: {left:?}"
    );

    store.run(&["migrate"]).await.success();
    let publish = |topic: &'static str, subject: &'static str, header: &'static str| {
        vec![
            "publish",
            "--topic",
            topic,
            "--subject",
            subject,
            "--header",
            header,
            "x",
        ]
    };
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            publish("orders", "orders/eu/paid", "novalue"),
            vec!["--header", "novalue", "NAME=VALUE"],
        ),
        (
            publish("orders", "orders/+/paid", "k=v"),
            vec!["--subject", "orders/+/paid"],
        ),
        (
            publish("orders/x", "orders/eu/paid", "k=v"),
            vec!["--topic", "orders/x"],
        ),
        (
            vec![
                "tail",
                "--group",
                "g",
                "--topic",
                "orders",
                "--pattern",
                "orders/#/x",
            ],
            vec!["--pattern", "orders/#/x"],
        ),
        (
            vec!["tail", "--group", "g/h", "--topic", "orders"],
            vec!["--group", "g/h"],
        ),
        (
            vec![
                "tail",
                "--group",
                "g",
                "--topic",
                "orders",
                "--max-unacked",
                "5",
            ],
            vec!["--no-ack"],
        ),
    ];
    for (args, needles) in cases {
        let failed = store.run(&args).await;
        let stderr = failed.failure();
        for needle in needles {
            assert!(stderr.contains(needle), "{needle} in: {failed}");
        }
        assert!(
            !stderr.contains("ValidationError {"),
            "a debug form: {failed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_span_fields() {
    let store = TestStore::migrated(Backend::Sqlite).await.unwrap();
    let mut command = store.command();
    command
        .env("WHARF_LOG__FORMAT", "json")
        .env("WHARF_HTTP__LISTEN", "127.0.0.1:0");
    let mut serve = Running::start("serve", command, &["serve"]);
    let serving = parse(&serve.expect_err("wharf serving").await);
    assert_eq!(serving["fields"]["message"], "wharf serving", "{serving}");
    assert_eq!(serving["level"], "INFO", "{serving}");
    assert!(serving["fields"]["listen"].is_string(), "{serving}");
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
    for line in serve.lines_of(false) {
        assert!(parse(&line).is_object(), "{line}");
    }

    let mut command = store.command();
    command.env("WHARF_LOG__FORMAT", "json");
    let mut tail = Running::start(
        "tail",
        command,
        &["tail", "--group", "g", "--topic", "orders"],
    );
    let joined = parse(&tail.expect_err("declaration in effect").await);
    assert_eq!(joined["span"]["name"], "consume", "{joined}");
    assert_eq!(joined["span"]["group"], "g", "{joined}");
    assert_eq!(joined["span"]["topic"], "orders", "{joined}");
    assert!(
        joined["spans"].as_array().is_some_and(|s| !s.is_empty()),
        "{joined}"
    );
    assert_eq!(tail.terminate().await, Some(0), "{}", tail.transcript());
    for line in tail.lines_of(false) {
        assert!(parse(&line).is_object(), "{line}");
    }
}

#[tokio::test]
async fn a_bad_log_filter_is_refused_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = wharf_in(dir.path());
    command.env("WHARF_LOG__FILTER", "wharf=loud");
    let failed = support::run(command, &["groups"], None).await;
    let stderr = failed.failure();
    assert!(
        stderr.contains("log.filter") && stderr.contains("wharf=loud"),
        "{failed}"
    );

    let mut command = wharf_in(dir.path());
    command.env("RUST_LOG", "wharf=loud");
    let failed = support::run(command, &["groups"], None).await;
    assert!(failed.failure().contains("RUST_LOG"), "{failed}");

    let printed = support::run(wharf_in(dir.path()), &["config", "default"], None).await;
    let table: toml::Table = printed.success().parse().unwrap();
    assert_eq!(table["log"]["format"].as_str(), Some("text"), "{printed}");
    assert_eq!(table["log"]["filter"].as_str(), Some("info"), "{printed}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing is created: {left:?}");
}
