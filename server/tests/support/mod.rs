//! The harness of the terminal-tool tests: a fresh store per test on either backend, the real
//! `wharf` binary pointed at it, and long-running children (`tail`, `serve`) whose output lines
//! are collected as they come, waited on with deadlines, and killed when dropped.
//!
//! Postgres is found at `WHARF_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`);
//! when it cannot be reached the Postgres variants are skipped with a message, unless
//! `WHARF_REQUIRE_SERVICES=1`, in which case they fail.

#![allow(clippy::unwrap_used, dead_code)]

pub mod broker;

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;
use wharf::Wharf;
use wharf_server::Config;

/// The binary under test.
pub const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// The longest a one-shot command, or a wait for a line, may take.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// What a finished command left behind.
pub struct Run {
    pub what: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` exited with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.code, self.stdout, self.stderr
        )
    }
}

impl Run {
    pub fn success(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success: {self}");
        &self.stdout
    }

    pub fn failure(&self) -> &str {
        assert!(
            matches!(self.code, Some(code) if code != 0),
            "expected failure: {self}"
        );
        &self.stderr
    }
}

/// The binary run from `dir`, with no inherited `WHARF_*` or `RUST_LOG` variables.
pub fn wharf_in(dir: &Path) -> Command {
    let mut command = Command::new(WHARF);
    command
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (name, _) in std::env::vars() {
        if name.starts_with("WHARF_") {
            command.env_remove(name);
        }
    }
    command
}

/// Runs `command` with `args` to completion, feeding `stdin` (or nothing: stdin is null).
pub async fn run(mut command: Command, args: &[&str], stdin: Option<&[u8]>) -> Run {
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if stdin.is_some() {
        command.stdin(Stdio::piped());
    }
    let what = format!("wharf {}", args.join(" "));
    let mut child = command.spawn().unwrap();
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).await.unwrap();
        drop(pipe);
    }
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`{what}` did not finish within {DEADLINE:?}"))
        .unwrap();
    Run {
        what,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn pg_url() -> String {
    std::env::var("WHARF_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub async fn pg_connect() -> Result<sqlx::PgConnection, sqlx::Error> {
    use sqlx::Connection;
    sqlx::PgConnection::connect(&pg_url()).await
}

/// A fresh, unmigrated store and the scratch directory commands run in. A Postgres schema is
/// dropped with it; the SQLite file goes with the directory.
pub struct TestStore {
    pub dir: TempDir,
    pub url: String,
    pub schema: Option<String>,
}

impl TestStore {
    /// A fresh store; `None` (after saying why) when Postgres is unreachable and not required.
    pub async fn new(backend: Backend) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        if backend == Backend::Sqlite {
            let url = format!("sqlite://{}", dir.path().join("wharf.db").display());
            return Some(Self {
                dir,
                url,
                schema: None,
            });
        }
        let schema = format!("wharf_tools_{:016x}", rand::random::<u64>());
        let created = async {
            let mut conn = pg_connect().await?;
            sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
                .execute(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>(())
        }
        .await;
        if let Err(e) = created {
            let required = std::env::var("WHARF_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(!required, "Postgres at {} is required: {e}", pg_url());
            eprintln!("SKIPPED: Postgres at {} is unreachable: {e}", pg_url());
            return None;
        }
        Some(Self {
            dir,
            url: pg_url(),
            schema: Some(schema),
        })
    }

    /// A fresh store, migrated by `wharf migrate`.
    pub async fn migrated(backend: Backend) -> Option<Self> {
        let store = Self::new(backend).await?;
        store.run(&["migrate"]).await.success();
        Some(store)
    }

    pub fn sqlite_path(&self) -> PathBuf {
        self.dir.path().join("wharf.db")
    }

    /// The binary pointed at this store, with fast declaration retries and heartbeats so a
    /// waiting tail notices a departed incumbent within a fraction of a second.
    pub fn command(&self) -> Command {
        let mut command = wharf_in(self.dir.path());
        command
            .env("WHARF_STORE__URL", &self.url)
            .env("WHARF_DECLARATIONS__RETRY_INTERVAL", "100ms")
            .env("WHARF_DECLARATIONS__HEARTBEAT_INTERVAL", "100ms")
            .env("WHARF_DECLARATIONS__INSTANCE_TTL", "5s")
            .env("WHARF_QUEUE__BACKOFF_BASE", "100ms");
        if let Some(schema) = &self.schema {
            command.env("WHARF_STORE__SCHEMA", schema);
        }
        command
    }

    pub async fn run(&self, args: &[&str]) -> Run {
        run(self.command(), args, None).await
    }

    /// `wharf publish` of one message; returns its position.
    pub async fn publish(&self, subject: &str, payload: &str) -> i64 {
        let run = self
            .run(&[
                "publish",
                "--topic",
                "orders",
                "--subject",
                subject,
                payload,
            ])
            .await;
        run.success()
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("publish must print a position ({e}): {run}"))
    }

    /// The library on the same store.
    pub async fn wharf(&self) -> Wharf {
        let mut config = Config::default();
        config.store.url = self.url.clone();
        config.store.schema = self.schema.clone().unwrap_or_default();
        config.store.auto_migrate = false;
        Wharf::open(&config.settings()).await.unwrap()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let Some(schema) = self.schema.take() else {
            return;
        };
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut conn) = pg_connect().await {
                    let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                    let _ = sqlx::raw_sql(&sql).execute(&mut conn).await;
                }
            });
        })
        .join();
    }
}

/// One line of a running child's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Out(String),
    Err(String),
}

/// A running `wharf` child (killed when dropped) whose stdout and stderr lines arrive as
/// they are written.
pub struct Running {
    pub name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<Line>,
    /// Every line seen so far, for failure messages.
    pub seen: Vec<Line>,
    pending_out: VecDeque<String>,
    pending_err: VecDeque<String>,
}

fn forward(
    pipe: impl AsyncRead + Unpin + Send + 'static,
    lines: mpsc::UnboundedSender<Line>,
    wrap: fn(String) -> Line,
) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if lines.send(wrap(line)).is_err() {
                return;
            }
        }
    });
}

impl Running {
    /// Starts `command` with `args`.
    pub fn start(name: &str, mut command: Command, args: &[&str]) -> Self {
        command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        forward(child.stdout.take().unwrap(), tx.clone(), Line::Out);
        forward(child.stderr.take().unwrap(), tx, Line::Err);
        Self {
            name: name.to_owned(),
            child,
            lines,
            seen: Vec::new(),
            pending_out: VecDeque::new(),
            pending_err: VecDeque::new(),
        }
    }

    /// Everything seen so far, for a failure message.
    pub fn transcript(&self) -> String {
        let lines: Vec<String> = self
            .seen
            .iter()
            .map(|line| match line {
                Line::Out(text) => format!("out| {text}"),
                Line::Err(text) => format!("err| {text}"),
            })
            .collect();
        format!("--- {} ---\n{}", self.name, lines.join("\n"))
    }

    fn file(&mut self, line: Line) {
        self.seen.push(line.clone());
        match line {
            Line::Out(text) => self.pending_out.push_back(text),
            Line::Err(text) => self.pending_err.push_back(text),
        }
    }

    /// Waits for one more line (stdout or stderr) until `deadline`.
    async fn receive(&mut self, what: &str, deadline: Instant) {
        match tokio::time::timeout_at(deadline, self.lines.recv()).await {
            Ok(Some(line)) => self.file(line),
            Ok(None) => panic!("{what}: the output ended first\n{}", self.transcript()),
            Err(_) => panic!(
                "{what}: not seen within {DEADLINE:?}\n{}",
                self.transcript()
            ),
        }
    }

    /// The next stdout line not returned yet.
    pub async fn next_out(&mut self, what: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(line) = self.pending_out.pop_front() {
                return line;
            }
            self.receive(what, deadline).await;
        }
    }

    /// The next stderr line containing `text` (earlier stderr lines are passed over).
    pub async fn expect_err(&mut self, text: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            while let Some(line) = self.pending_err.pop_front() {
                if line.contains(text) {
                    return line;
                }
            }
            self.receive(&format!("stderr {text:?}"), deadline).await;
        }
    }

    /// Every stdout line received so far, without waiting.
    pub fn out_so_far(&mut self) -> Vec<String> {
        while let Ok(line) = self.lines.try_recv() {
            self.file(line);
        }
        self.lines_of(true)
    }

    /// Every stderr line received so far, without waiting.
    pub fn out_so_far_err(&mut self) -> Vec<String> {
        while let Ok(line) = self.lines.try_recv() {
            self.file(line);
        }
        self.lines_of(false)
    }

    /// Every stderr (`false`) or stdout (`true`) line seen.
    pub fn lines_of(&self, stdout: bool) -> Vec<String> {
        self.seen
            .iter()
            .filter_map(|l| match (l, stdout) {
                (Line::Out(text), true) | (Line::Err(text), false) => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Sends the signal `name` (`STOP`, `CONT`, `HUP`...) without waiting for anything.
    pub fn signal(&self, name: &str) {
        let pid = self.pid().to_string();
        let status = std::process::Command::new("kill")
            .args([format!("-{name}").as_str(), &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} {pid}");
    }

    /// Sends SIGKILL (no chance to clean up, as a crash or an OOM kill) and waits for the exit;
    /// returns the exit code (`None`: killed by the signal).
    pub async fn kill(&mut self) -> Option<i32> {
        let pid = self.child.id().expect("still running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -KILL {pid}");
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("no exit within {DEADLINE:?} of SIGKILL"))
            .unwrap();
        while let Ok(line) = self.lines.try_recv() {
            self.file(line);
        }
        status.code()
    }

    /// The `listen=ADDRESS` of `serve`'s "wharf serving" line (waited for).
    pub async fn serving_address(&mut self) -> std::net::SocketAddr {
        let line = self.expect_err("wharf serving").await;
        let start = line.find("listen=").expect("a listen= field") + "listen=".len();
        line[start..]
            .split_whitespace()
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line}"))
    }

    /// Sends SIGTERM and waits for the exit; returns the exit code (the rest of the output
    /// is in `seen`).
    pub async fn terminate(&mut self) -> Option<i32> {
        let pid = self.child.id().expect("still running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}");
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no exit within {DEADLINE:?} of SIGTERM\n{}",
                    self.transcript()
                )
            })
            .unwrap();
        let rest = async {
            while let Some(line) = self.lines.recv().await {
                self.file(line);
            }
        };
        let _ = tokio::time::timeout(DEADLINE, rest).await;
        status.code()
    }
}

/// A running `wharf serve` on the store's `wharf.toml`, with its listen address.
pub struct Server {
    pub running: Running,
    pub address: std::net::SocketAddr,
}

impl Server {
    /// Starts `wharf --config wharf.toml serve` on `store`, named `name` in transcripts, and
    /// waits for its listen address.
    pub async fn start(store: &TestStore, name: &str) -> Self {
        let mut running =
            Running::start(name, store.command(), &["--config", "wharf.toml", "serve"]);
        let address = running.serving_address().await;
        Self { running, address }
    }
}
