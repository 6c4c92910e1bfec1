//! A consumer worker running as its own process (the `swap_consumer` binary), for the tests
//! that stop real consumers with `kill -9` or SIGTERM (`swap_processes.rs`,
//! `consumer_crash.rs`). The process prints its states on stdout, watched line by line, and
//! its handler appends one line per finished message to an output file.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// How long a worker may take to reach a state or to exit.
const DEADLINE: Duration = Duration::from_secs(60);

/// A running worker process.
pub struct WorkerProcess {
    child: Child,
    states: watch::Receiver<Vec<String>>,
    out: PathBuf,
}

impl WorkerProcess {
    /// Starts `command` (its stdout watched, its stderr dropped, killed if dropped) whose
    /// handler writes to `out`.
    pub fn spawn(mut command: Command, out: PathBuf) -> Self {
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("starting the worker process");
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
    pub async fn reached(&mut self, prefix: &str) {
        let wanted = prefix.to_owned();
        let reached = tokio::time::timeout(
            DEADLINE,
            self.states
                .wait_for(|seen| seen.iter().any(|line| line.starts_with(&wanted))),
        )
        .await
        .is_ok_and(|waited| waited.is_ok());
        assert!(reached, "never reached {prefix:?}: {:?}", self.states());
    }

    /// Every state it printed so far (for a failure's message).
    pub fn states(&self) -> Vec<String> {
        self.states.borrow().clone()
    }

    /// The file its handler writes to.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// `kill -9`, then reaps it.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("kill -9");
        self.child.wait().await.expect("reaping the killed process");
    }

    /// SIGTERM, then waits for a successful exit (a graceful shutdown).
    pub async fn terminate(mut self) {
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

/// The complete lines of `out` (the worker may be writing one as it is read); none when the
/// file does not exist yet.
pub fn complete_lines(out: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(out) else {
        return Vec::new();
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete.lines().map(str::to_owned).collect()
}
