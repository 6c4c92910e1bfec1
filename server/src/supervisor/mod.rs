//! The supervisor: one per process, it runs every MQTT session runtime and swaps them when the
//! configuration changes (ADR 0029).
//!
//! A change arrives as a reload request ([`Supervisor::request_reload`]: `serve` sends one on
//! SIGHUP and when the polled file's contents change, see [`Supervisor::watch_file`]). The
//! configuration is loaded when the request is made, so each request carries the file as it
//! was then. Requests are handled one at a time (a serialized prepare-commit swap):
//!
//! 1. **Prepare**, with the old runtimes untouched: the file loads and validates completely
//!    (every session resolved, every password and TLS file read); no key outside `mqtt`
//!    changed (those need a restart: refused naming the key); the identity guard passes
//!    (`guard.rs`: no persistent or exclusive session changes or loses its durable identity,
//!    whatever `mqtt.allow_destructive_reload` says). A configuration equal to the running one,
//!    TLS files' contents included (a certificate rotated in place is a change), is
//!    `unchanged` and swaps nothing. Any refusal is logged with its reason, counted, and
//!    shown in the config watch; the old runtimes keep running exactly as they were.
//! 2. **Commit**: every session runtime is told to stop and the supervisor waits for them,
//!    at most the new `mqtt.drain_timeout` (a runtime still busy past it ends at its next
//!    step, without dialing again); then the new runtimes are built and started. That is
//!    *applied*: the generation goes up by one. Should the new runtimes fail to start (a file
//!    removed since the prepare), the previous configuration's are started again and the
//!    reload is `failed`.
//!
//! **Strategy** (`mqtt.reload_strategy`): `direct` handles every request as its own swap (N
//! rapid writes, each signalled, are N swaps); `debounced` waits until no request came for
//! `mqtt.reload_window` and applies only the newest. Applied is not converged: after each
//! swap the convergence watch (`converge.rs`) follows the sessions and sets the configuration
//! degraded past the activation budget, clearing it once they converge.

mod converge;
pub mod guard;
mod poll;

pub use converge::{activation_budget, behind, converged};

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use wharf::Wharf;
use wharf_sessions::{MqttHandler, SessionLedger, SessionRuntime, SessionStatus};

use crate::config::{Config, ReloadStrategy};
use crate::error::ServerError;

/// Loads the configuration again (the file, and the environment the process started with).
pub type ConfigLoader = Arc<dyn Fn() -> Result<Config, ServerError> + Send + Sync>;

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReloadOutcome {
    /// The new runtimes were built and started (not yet converged).
    Applied,
    /// The configuration equals the running one; nothing was swapped.
    Unchanged,
    /// Refused in the prepare step; the old runtimes kept running untouched.
    Refused,
    /// The new runtimes could not start; the previous configuration's were started again.
    Failed,
}

impl ReloadOutcome {
    /// The metric label and JSON value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Unchanged => "unchanged",
            Self::Refused => "refused",
            Self::Failed => "failed",
        }
    }
}

/// What one reload did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// How it ended.
    pub outcome: ReloadOutcome,
    /// The generation in effect afterwards.
    pub generation: u64,
    /// What asked for it (`SIGHUP`, `file changed`, `api`...); the newest of a folded batch.
    pub trigger: String,
    /// How many requests this reload answered (above 1 when the debounce folded some).
    pub requests: u64,
    /// Why it was refused or failed.
    pub reason: Option<String>,
    /// When it finished.
    pub at: DateTime<Utc>,
}

/// The configuration's state: applied versus converged (`config_watch` in deep health).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigWatch {
    /// The generation in effect: 1 at start, one more per applied swap.
    pub applied_generation: u64,
    /// The newest generation whose sessions all reached subscribed (0: none yet).
    pub converged_generation: u64,
    /// True while the applied generation is past its activation budget unconverged.
    pub degraded: bool,
    /// Why it is degraded ("applied but not converged: ...").
    pub reason: Option<String>,
    /// The reload strategy in effect.
    pub strategy: &'static str,
    /// The newest reload, if any happened since start.
    pub last_reload: Option<ReloadReport>,
}

struct Request {
    config: Result<Config, ServerError>,
    trigger: String,
    reply: Option<oneshot::Sender<ReloadReport>>,
}

/// What the supervisor's task and its handle share.
struct Shared {
    sessions: RwLock<Vec<watch::Receiver<SessionStatus>>>,
    state: watch::Sender<ConfigWatch>,
}

/// Asks a supervisor for reloads; cheap to clone (a signal handler or a file poller holds
/// one).
#[derive(Clone)]
pub struct Reloader {
    loader: ConfigLoader,
    requests: mpsc::UnboundedSender<Request>,
}

impl Reloader {
    /// Asks for a reload: the configuration is loaded now and queued behind any reload in
    /// progress (see the module docs for the strategies). Returns at once.
    pub fn request_reload(&self, trigger: &str) {
        let _ = self.requests.send(Request {
            config: (self.loader)(),
            trigger: trigger.to_owned(),
            reply: None,
        });
    }

    /// Asks for a reload like [`Reloader::request_reload`] and waits for its outcome.
    pub async fn reload(&self, trigger: &str) -> Result<ReloadReport, ServerError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request {
                config: (self.loader)(),
                trigger: trigger.to_owned(),
                reply: Some(reply),
            })
            .map_err(|_| ServerError::Config("the supervisor has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| ServerError::Config("the supervisor has stopped".to_owned()))
    }
}

/// The process's session supervisor. Call [`Supervisor::shutdown`] to stop it.
pub struct Supervisor {
    shared: Arc<Shared>,
    reloader: Reloader,
    stop: watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    pollers: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Supervisor {
    /// Starts every session of `config` (generation 1), appending what each receives to
    /// `wharf`'s message log; `loader` reads the configuration again for each reload.
    pub fn start(wharf: &Wharf, config: Config, loader: ConfigLoader) -> Result<Self, ServerError> {
        let handler = Arc::new(wharf_sessions::LogIngest::new(wharf.queue().clone()));
        Self::start_with(wharf, config, loader, handler)
    }

    /// Like [`Supervisor::start`], with the application's own handler.
    pub fn start_with(
        wharf: &Wharf,
        config: Config,
        loader: ConfigLoader,
        handler: Arc<dyn MqttHandler>,
    ) -> Result<Self, ServerError> {
        let runtimes = start_sessions(wharf, &config, handler.clone())?;
        let metrics = wharf.metrics().clone();
        metrics.config().started(unix_now());
        metrics.config().generations(1, 0);
        metrics.config().set_degraded(false);
        let state = watch::Sender::new(ConfigWatch {
            applied_generation: 1,
            converged_generation: 0,
            degraded: false,
            reason: None,
            strategy: config.mqtt.reload_strategy.as_str(),
            last_reload: None,
        });
        let shared = Arc::new(Shared {
            sessions: RwLock::new(runtimes.iter().map(SessionRuntime::watch).collect()),
            state,
        });
        let (requests, inbox) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let mut running = Running {
            wharf: wharf.clone(),
            handler,
            config,
            runtimes,
            generation: 1,
            shared: shared.clone(),
            watchers: Vec::new(),
            tls: TlsMaterial::new(),
        };
        running.tls = tls_material(&running.config.mqtt.resolve().unwrap_or_default());
        running.watch();
        let task = tokio::spawn(tracing::Instrument::instrument(
            running.serve(inbox, stop_rx),
            tracing::info_span!("supervisor"),
        ));
        Ok(Self {
            shared,
            reloader: Reloader { loader, requests },
            stop,
            task: tokio::sync::Mutex::new(Some(task)),
            pollers: std::sync::Mutex::default(),
        })
    }

    /// A handle that asks this supervisor for reloads.
    pub fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// See [`Reloader::request_reload`].
    pub fn request_reload(&self, trigger: &str) {
        self.reloader.request_reload(trigger);
    }

    /// See [`Reloader::reload`].
    pub async fn reload(&self, trigger: &str) -> Result<ReloadReport, ServerError> {
        self.reloader.reload(trigger).await
    }

    /// Polls `path` every `every` (nothing when zero) and requests a reload (`file changed`)
    /// whenever its bytes differ from the previous poll's. A file that cannot be read is
    /// logged and polled again. The poller ends with the supervisor.
    pub fn watch_file(&self, path: std::path::PathBuf, every: Duration) {
        if every.is_zero() {
            return;
        }
        let mut stop = self.stop.subscribe();
        let task = tokio::spawn(poll::poll_file(path, every, self.reloader(), async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
        self.pollers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
    }

    /// Every session's newest status, in configuration order.
    pub fn sessions(&self) -> Vec<SessionStatus> {
        self.shared
            .sessions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|w| w.borrow().clone())
            .collect()
    }

    /// A receiver of each session runtime's status, in configuration order (the current
    /// generation's: take them again after a swap).
    pub fn session_watches(&self) -> Vec<watch::Receiver<SessionStatus>> {
        self.shared
            .sessions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The configuration's state now.
    pub fn config_watch(&self) -> ConfigWatch {
        self.shared.state.borrow().clone()
    }

    /// A receiver of every change of the configuration's state.
    pub fn watch_config(&self) -> watch::Receiver<ConfigWatch> {
        self.shared.state.subscribe()
    }

    /// Stops reloading, then every session runtime (each disconnects; unacked deliveries stay
    /// with the broker, waited for at most `mqtt.drain_timeout`), and waits for them. Later
    /// calls return at once.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let pollers = std::mem::take(&mut *self.pollers.lock().unwrap_or_else(|p| p.into_inner()));
        for poller in pollers {
            let _ = poller.await;
        }
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
    }
}

/// The supervisor task's own state: the configuration in effect and its runtimes.
struct Running {
    wharf: Wharf,
    handler: Arc<dyn MqttHandler>,
    config: Config,
    runtimes: Vec<SessionRuntime>,
    generation: u64,
    shared: Arc<Shared>,
    watchers: Vec<JoinHandle<()>>,
    /// The bytes of every TLS file the running runtimes read when they started: a file
    /// rotated in place (same path, new certificate) is a change a reload applies.
    tls: TlsMaterial,
}

/// TLS file contents by path.
type TlsMaterial = std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>;

/// The contents of every TLS file `sessions` use (unreadable ones are left out: starting
/// refuses them anyway).
fn tls_material(sessions: &[crate::config::ResolvedSession]) -> TlsMaterial {
    let mut files = TlsMaterial::new();
    for tls in sessions.iter().filter_map(|s| s.tls.as_ref()) {
        let client = tls.client.iter().flat_map(|(c, k)| [c, k]);
        for path in tls.ca_file.iter().chain(client) {
            if let Ok(bytes) = std::fs::read(path) {
                files.insert(path.clone(), bytes);
            }
        }
    }
    files
}

impl Running {
    async fn serve(
        mut self,
        mut inbox: mpsc::UnboundedReceiver<Request>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let first = tokio::select! {
                request = inbox.recv() => match request {
                    Some(request) => request,
                    None => break,
                },
                _ = stop.wait_for(|s| *s) => break,
            };
            let mut newest = first;
            let mut replies: Vec<oneshot::Sender<ReloadReport>> = Vec::new();
            let mut count = 1;
            let mut stopping = false;
            if self.config.mqtt.reload_strategy == ReloadStrategy::Debounced {
                let window = self.config.mqtt.reload_window;
                loop {
                    tokio::select! {
                        next = inbox.recv() => match next {
                            Some(next) => {
                                replies.extend(std::mem::replace(&mut newest, next).reply);
                                count += 1;
                            }
                            None => break,
                        },
                        _ = tokio::time::sleep(window) => break,
                        // Stopping: the folded requests are dropped (their callers hear so).
                        _ = stop.wait_for(|s| *s) => {
                            stopping = true;
                            break;
                        }
                    }
                }
            }
            if stopping {
                break;
            }
            replies.extend(newest.reply.take());
            let report = self.reload(newest, count).await;
            for reply in replies {
                let _ = reply.send(report.clone());
            }
        }
        self.stop_all(self.config.mqtt.drain_timeout).await;
        for watcher in self.watchers.drain(..) {
            watcher.abort();
        }
    }

    async fn reload(&mut self, request: Request, requests: u64) -> ReloadReport {
        let trigger = request.trigger.clone();
        let (outcome, reason) = match self.prepare(request.config) {
            Err(reason) => (ReloadOutcome::Refused, Some(reason)),
            Ok(None) => (ReloadOutcome::Unchanged, None),
            Ok(Some((next, tls))) => match self.commit(next, tls).await {
                Ok(()) => (ReloadOutcome::Applied, None),
                Err(reason) => (ReloadOutcome::Failed, Some(reason)),
            },
        };
        match &reason {
            Some(reason) => tracing::error!(
                outcome = outcome.as_str(), %trigger, %reason,
                "configuration reload {}; the running configuration stays in effect",
                outcome.as_str()
            ),
            None => tracing::info!(
                outcome = outcome.as_str(), %trigger, generation = self.generation, requests,
                "configuration reload {}", outcome.as_str()
            ),
        }
        self.wharf
            .metrics()
            .config()
            .reloaded(outcome.as_str(), unix_now());
        let report = ReloadReport {
            outcome,
            generation: self.generation,
            trigger,
            requests,
            reason,
            at: Utc::now(),
        };
        let strategy = self.config.mqtt.reload_strategy.as_str();
        self.shared.state.send_modify(|w| {
            w.last_reload = Some(report.clone());
            w.strategy = strategy;
        });
        report
    }

    /// The prepare step: `Ok(Some(config))` to swap, `Ok(None)` when nothing changed, or the
    /// refusal. Touches nothing that runs.
    fn prepare(
        &self,
        loaded: Result<Config, ServerError>,
    ) -> Result<Option<(Config, TlsMaterial)>, String> {
        let next = loaded.map_err(|e| match e {
            ServerError::Config(why) => format!("the configuration does not load: {why}"),
            other => format!("the configuration does not load: {other}"),
        })?;
        let restart_only = guard::restart_only_changes(&self.config, &next);
        if !restart_only.is_empty() {
            return Err(format!(
                "{} changed, which a reload does not apply (only the mqtt section reloads): \
                 restart wharf to change {}; nothing was applied",
                restart_only.join(", "),
                if restart_only.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            ));
        }
        let running = self.config.mqtt.resolve().map_err(|e| e.to_string())?;
        let sessions = next.mqtt.resolve().map_err(|e| e.to_string())?;
        let changes = guard::identity_changes(&running, &sessions);
        if !changes.is_empty() {
            return Err(guard::identity_refusal(
                &changes,
                next.mqtt.allow_destructive_reload,
            ));
        }
        // What starting would read: every password and TLS file, so a commit does not fail
        // on what a prepare could have seen.
        for session in &sessions {
            next.mqtt.sessions[&session.name]
                .password()
                .map_err(|e| format!("mqtt.sessions.{}: {e}", session.name))?;
            if let Some(files) = &session.tls {
                wharf_mqtt::TlsOptions::from_files(
                    files.ca_file.as_deref(),
                    files
                        .client
                        .as_ref()
                        .map(|(c, k)| (c.as_path(), k.as_path())),
                )
                .map_err(|e| format!("mqtt.sessions.{}: {e}", session.name))?;
            }
        }
        let tls = tls_material(&sessions);
        // Unchanged only while the running runtimes are up: after a failed restart of the
        // previous configuration, the same file starts them again.
        let up = self.runtimes.len() == sessions.len();
        if next.mqtt == self.config.mqtt && tls == self.tls && up {
            return Ok(None);
        }
        Ok(Some((next, tls)))
    }

    /// The commit step: stop every runtime, start the new configuration's.
    async fn commit(&mut self, next: Config, tls: TlsMaterial) -> Result<(), String> {
        self.stop_all(next.mqtt.drain_timeout).await;
        match start_sessions(&self.wharf, &next, self.handler.clone()) {
            Ok(runtimes) => {
                self.runtimes = runtimes;
                self.config = next;
                self.tls = tls;
                self.generation += 1;
                self.publish_sessions();
                self.watch();
                Ok(())
            }
            Err(e) => {
                let reason = format!("the new session runtimes could not start: {e}");
                // The previous configuration started once; start it again.
                match start_sessions(&self.wharf, &self.config, self.handler.clone()) {
                    Ok(runtimes) => {
                        self.runtimes = runtimes;
                        self.publish_sessions();
                        self.watch();
                        Err(format!(
                            "{reason}; the previous configuration's were restarted"
                        ))
                    }
                    Err(again) => {
                        self.publish_sessions();
                        let why = format!(
                            "{reason}; restarting the previous configuration's failed too: \
                             {again}; no session runs"
                        );
                        self.shared.state.send_modify(|w| {
                            w.degraded = true;
                            w.reason = Some(why.clone());
                        });
                        self.wharf.metrics().config().set_degraded(true);
                        Err(why)
                    }
                }
            }
        }
    }

    /// Tells every runtime to stop and waits for them, at most `drain`.
    async fn stop_all(&mut self, drain: Duration) {
        let stopping: Vec<JoinHandle<bool>> = self
            .runtimes
            .drain(..)
            .map(|runtime| tokio::spawn(runtime.shutdown_within(drain)))
            .collect();
        let stopped = futures::future::join_all(stopping).await;
        let aborted = stopped.iter().filter(|s| !matches!(s, Ok(true))).count();
        if aborted > 0 {
            tracing::warn!(
                sessions = aborted,
                drain_timeout = %humantime::format_duration(drain),
                "not every session runtime stopped within mqtt.drain_timeout: aborted (their \
                 unacked deliveries stay with the broker; an exclusive lease expires by its TTL)"
            );
        }
    }

    fn publish_sessions(&self) {
        *self
            .shared
            .sessions
            .write()
            .unwrap_or_else(|p| p.into_inner()) =
            self.runtimes.iter().map(SessionRuntime::watch).collect();
    }

    /// Replaces the convergence watch and the reconcile counters with the current runtimes'.
    fn watch(&mut self) {
        for watcher in self.watchers.drain(..) {
            watcher.abort();
        }
        let generation = self.generation;
        let metrics = self.wharf.metrics().clone();
        self.shared.state.send_modify(|w| {
            w.applied_generation = generation;
            w.degraded = false;
            w.reason = None;
        });
        metrics.config().set_degraded(false);
        let sessions: Vec<_> = self.runtimes.iter().map(SessionRuntime::watch).collect();
        for session in &sessions {
            self.watchers
                .push(converge::count_reconciles(session.clone(), metrics.clone()));
        }
        self.watchers.push(converge::watch_generation(
            generation,
            sessions,
            activation_budget(&self.config),
            self.shared.state.clone(),
            metrics,
        ));
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The managed-filter ledger of MQTT sessions on `wharf`'s store.
pub fn session_ledger(wharf: &Wharf) -> SessionLedger {
    SessionLedger::new(wharf.store().clone())
}

/// Starts every session `config.mqtt` names on `wharf`'s store, each delivering to `handler`,
/// with the lease and deadlines `config` sets ([`Config::sessions_settings`]).
pub fn start_sessions(
    wharf: &Wharf,
    config: &Config,
    handler: Arc<dyn MqttHandler>,
) -> Result<Vec<SessionRuntime>, wharf_sessions::SessionError> {
    wharf_sessions::start_all(&config.sessions_settings(), &session_ledger(wharf), handler)
}
