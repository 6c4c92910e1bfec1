//! Never a union, end to end, with real processes on both backends (ADR 0014, issue scenario).
//!
//! Group `g` on topic `orders`: an old process declares `{x/+}` (one message at a time, 300 ms
//! each); a new process declares `{y/+}` and waits. Fifteen `x/*` and fifteen `y/*` messages
//! are published, shuffled. Once the old process has handled two, it is stopped, by `kill -9`
//! or by SIGTERM (graceful: drain, then leave). Then:
//!
//! - the `{y/+}` process handles every `y/*` message exactly once (those published while
//!   `{x/+}` was in effect included), and no `x/*` message;
//! - the swap's record counts the `x/*` deliveries it set aside;
//! - rolling back (the `{y/+}` process stops, an `{x/+}` process starts) hands out every `x/*`
//!   message the old process did not finish, no `y/*` message, and again none the old process
//!   acked (after `kill -9`, at most the one whose handler had finished but whose ack had not
//!   committed: at-least-once).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rand::seq::SliceRandom;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use wharf_queue::{Headers, Queue, QueueSettings};
use wharf_tests::fixtures::group;
use wharf_tests::{on_both_backends, wait_until, Backend, TestStore};

const DEADLINE: Duration = Duration::from_secs(60);

/// How the old process is stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Kill,
    Graceful,
}

/// A running `swap_consumer` process.
struct Process {
    child: Child,
    states: watch::Receiver<Vec<String>>,
    out: PathBuf,
}

impl Process {
    async fn start(store: &TestStore, dir: &Path, name: &str, patterns: &[&str]) -> Self {
        let config = store.config();
        let out = dir.join(format!("{name}.out"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_swap_consumer"));
        command
            .arg(&config.store.url)
            .arg(store.schema().unwrap_or("-"))
            .args(["g", "orders", "300"])
            .arg(&out)
            .args(patterns)
            .env("WHARF_DECLARATIONS__INSTANCE_TTL", "2s")
            .env("WHARF_DECLARATIONS__HEARTBEAT_INTERVAL", "300ms")
            .env("WHARF_DECLARATIONS__RETRY_INTERVAL", "200ms")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("starting swap_consumer");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, states) = watch::channel(Vec::new());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tx.send_modify(|seen| seen.push(line));
            }
        });
        Self { child, states, out }
    }

    /// Waits until the process has printed a state starting with `prefix`.
    async fn reached(&mut self, prefix: &str) {
        let wanted = prefix.to_owned();
        let reached = tokio::time::timeout(
            DEADLINE,
            self.states
                .wait_for(|seen| seen.iter().any(|line| line.starts_with(&wanted))),
        )
        .await
        .is_ok_and(|waited| waited.is_ok());
        assert!(
            reached,
            "never reached {prefix:?}: {:?}",
            self.states.borrow().clone()
        );
    }

    /// The messages its handler finished: (position, subject, routed_by).
    fn handled(&self) -> Vec<(i64, String, i64)> {
        handled(&self.out)
    }

    async fn kill(mut self) {
        self.child.start_kill().expect("kill -9");
        self.child.wait().await.expect("reaping the killed process");
    }

    async fn terminate(mut self) {
        let pid = self.child.id().expect("a running process");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let exited = tokio::time::timeout(DEADLINE, self.child.wait()).await;
        assert!(
            matches!(exited, Ok(Ok(status)) if status.success()),
            "graceful shutdown: {exited:?}"
        );
    }
}

fn handled(out: &Path) -> Vec<(i64, String, i64)> {
    let Ok(text) = std::fs::read_to_string(out) else {
        return Vec::new();
    };
    // The worker may be writing a line as it is read: only complete lines count.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|line| {
            let mut fields = line.split(' ');
            let position = fields.next().unwrap().parse().unwrap();
            let subject = fields.next().unwrap().to_owned();
            let routed_by = fields.next().unwrap().parse().unwrap();
            (position, subject, routed_by)
        })
        .collect()
}

fn subjects(handled: &[(i64, String, i64)]) -> Vec<String> {
    handled.iter().map(|(_, s, _)| s.clone()).collect()
}

/// Waits until the group has nothing left to route, rescan, claim or finish.
async fn settled(queue: &Queue) {
    wait_until("the group settles", DEADLINE, || async {
        let s = queue
            .group_stats(Some(&group("g")))
            .await
            .unwrap()
            .remove(0);
        s.routed_lag == 0 && s.rescan_remaining == 0 && s.claimable + s.in_flight == 0
    })
    .await;
}

async fn never_a_union_across_processes(backend: Backend, stop: Stop) {
    let store = TestStore::new(backend).await;
    let wharf = store.wharf();
    let queue = Queue::new(store.store.clone(), QueueSettings::default());
    let dir = tempfile::tempdir().unwrap();

    let mut old = Process::start(&store, dir.path(), "old", &["x/+"]).await;
    old.reached("consuming").await;
    let mut new = Process::start(&store, dir.path(), "new", &["y/+"]).await;
    new.reached("waiting").await;

    let mut subjects_published: Vec<String> = (1..=15)
        .flat_map(|i| [format!("x/{i}"), format!("y/{i}")])
        .collect();
    subjects_published.shuffle(&mut rand::thread_rng());
    let batch = subjects_published
        .iter()
        .map(|s| (s.clone(), s.as_bytes().to_vec(), Headers::new()))
        .collect();
    wharf.publish("orders", batch).await.unwrap();
    wait_until("the old process handled two", DEADLINE, || async {
        old.handled().len() >= 2
    })
    .await;
    let old_out = old.out.clone();
    match stop {
        Stop::Kill => old.kill().await,
        Stop::Graceful => old.terminate().await,
    }
    let old_handled = handled(&old_out);
    assert!(old_handled.iter().all(|(_, s, _)| s.starts_with("x/")));

    new.reached("consuming").await;
    wait_until("the new process handled every y", DEADLINE, || async {
        new.handled().len() >= 15
    })
    .await;
    settled(&queue).await;
    let by_new = new.handled();
    let mut got = subjects(&by_new);
    got.sort();
    let mut ys: Vec<String> = (1..=15).map(|i| format!("y/{i}")).collect();
    ys.sort();
    assert_eq!(
        got, ys,
        "every y exactly once, and no x: {by_new:?} (the old process handled {old_handled:?})"
    );
    let swaps = queue.swaps(&group("g"), 1).await.unwrap();
    let stats = queue
        .group_stats(Some(&group("g")))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(stats.set_aside, swaps[0].set_aside, "{stats:?} {swaps:?}");
    assert!(
        swaps[0].set_aside as usize + old_handled.len() >= 15,
        "the x deliveries routed under {{x/+}} and not finished are set aside: {swaps:?}"
    );

    // Rollback: the y process leaves; an x process hands out what the old one did not finish.
    let new_out = new.out.clone();
    new.terminate().await;
    assert_eq!(
        handled(&new_out).len(),
        15,
        "nothing more reached the y process"
    );
    let mut back = Process::start(&store, dir.path(), "back", &["x/+"]).await;
    back.reached("consuming").await;
    let done_before: BTreeSet<String> = subjects(&old_handled).into_iter().collect();
    wait_until("the rollback finished every x", DEADLINE, || async {
        let mut all: BTreeSet<String> = subjects(&back.handled()).into_iter().collect();
        all.extend(done_before.iter().cloned());
        all.len() >= 15
    })
    .await;
    settled(&queue).await;
    let by_back = back.handled();
    assert!(
        by_back.iter().all(|(_, s, _)| s.starts_with("x/")),
        "{by_back:?}"
    );
    let again: Vec<&String> = by_back
        .iter()
        .map(|(_, s, _)| s)
        .filter(|s| done_before.contains(*s))
        .collect();
    let allowed = if stop == Stop::Kill { 1 } else { 0 };
    assert!(
        again.len() <= allowed,
        "handled again after its ack: {again:?} (old {old_handled:?}, back {by_back:?})"
    );
    let distinct: BTreeSet<&String> = by_back.iter().map(|(_, s, _)| s).collect();
    assert_eq!(distinct.len(), by_back.len(), "each x once: {by_back:?}");
    back.terminate().await;
}

async fn after_kill(backend: Backend) {
    never_a_union_across_processes(backend, Stop::Kill).await;
}
on_both_backends!(kill_9, after_kill);

async fn after_graceful_stop(backend: Backend) {
    never_a_union_across_processes(backend, Stop::Graceful).await;
}
on_both_backends!(graceful, after_graceful_stop);
