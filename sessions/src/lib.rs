//! Managed MQTT sessions: the durable managed-filter ledger, baseline seeding, and (in the
//! session runtime) the reconcile that keeps the broker's filters exactly the desired ones.
//!
//! A persistent session's filters live at the broker across connections, so Wharf records,
//! durably and before each SUBSCRIBE, every filter that may exist there (ADR 0022, ADR 0026).
//! Existing broker sessions predate that record: each durable identity must be seeded once,
//! with the exact filters it holds (or explicitly empty); nothing seeds implicitly.
//!
//! An application starts its sessions with [`start_all`], passing the `mqtt` and `lease`
//! settings, the identity its lease holders name, the ledger on its store, and an
//! [`MqttHandler`] ([`LogIngest`] appends to a Wharf message log):
//!
//! ```no_run
//! # async fn example(wharf: wharf_store::Store, queue: wharf_queue::Queue) -> Result<(), wharf_sessions::SessionError> {
//! use std::sync::Arc;
//! use wharf_sessions::{config::MqttConfig, LogIngest, SessionLedger, SessionsSettings};
//!
//! let ledger = SessionLedger::new(wharf);
//! let settings = SessionsSettings::new(MqttConfig::default(), "host-1:42:ab12")?;
//! let runtimes = wharf_sessions::start_all(&settings, &ledger, Arc::new(LogIngest::new(queue)))?;
//! # drop(runtimes); Ok(()) }
//! ```
//!
//! Architecture invariant: this crate knows the store, the queue, the domain's session and
//! lease decisions and the MQTT driver; it knows nothing of consumers, of the HTTP API, of
//! configuration files or of the command line. The identity a lease holder names is passed in.

pub mod config;
mod error;
mod lease;
mod ledger;
mod seed;

pub use error::SessionError;

pub use lease::{Acquired, LeaseLedger, RenewVerdict};
pub use ledger::SessionLedger;
pub use seed::{parse_seed_spec, SeedSpec};

use crate::config::{MqttConfig, ResolvedSession};

/// Finds the session a command names: a configured session's name, or a durable identity
/// (`ms-...`) that may or may not be configured here. The configured session comes with it.
pub fn find_session(
    config: &MqttConfig,
    reference: &str,
) -> Result<(String, Option<ResolvedSession>), SessionError> {
    let sessions = config.resolve()?;
    if let Some(session) = sessions
        .iter()
        .find(|s| s.name == reference || s.identity.id() == reference)
    {
        return Ok((session.identity.id().to_owned(), Some(session.clone())));
    }
    if is_identity(reference) {
        return Ok((reference.to_owned(), None));
    }
    let names: Vec<&str> = sessions.iter().map(|s| s.name.as_str()).collect();
    Err(SessionError::Config(format!(
        "no session named \"{reference}\" in the configuration (configured: {}), and it is not \
         a durable session identity (ms- and 32 hex digits, as `wharf sessions list` shows)",
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    )))
}

fn is_identity(reference: &str) -> bool {
    reference
        .strip_prefix("ms-")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

mod exclusive;
mod ingest;
mod renewal;
mod run;
mod runtime;
mod settings;
mod status;
mod subscribe;

pub use exclusive::{activation_bound, activation_phases};
pub use ingest::{to_log_message, LogIngest, MqttHandler, MqttMessage};
pub use runtime::SessionRuntime;
pub use settings::RuntimeSettings;
pub use status::{LeaseView, ReconcileOutcome, SessionStatus};

use std::sync::Arc;
use std::time::Duration;

use wharf_domain::DeclarerId;

use crate::config::LeaseConfig;

/// What starting the sessions reads: the `mqtt` and `lease` sections, the deadline of every
/// ledger call, and the process identity the lease holders of exclusive sessions name.
#[derive(Debug, Clone)]
pub struct SessionsSettings {
    /// The sessions, their subscriptions and timings.
    pub mqtt: MqttConfig,
    /// The HA lease of exclusive sessions.
    pub lease: LeaseConfig,
    /// The deadline of every ledger call (the `wharf` server uses a third of
    /// `declarations.instance_ttl`).
    pub store_deadline: Duration,
    /// The process identity a lease holder names (`host:pid:random` in the `wharf` server).
    pub process: DeclarerId,
}

impl SessionsSettings {
    /// `mqtt` with the default lease and a 10 s store deadline, holding leases as `process`.
    pub fn new(mqtt: MqttConfig, process: &str) -> Result<Self, SessionError> {
        Ok(Self {
            mqtt,
            lease: LeaseConfig::default(),
            store_deadline: Duration::from_secs(10),
            process: DeclarerId::parse("process", process)?,
        })
    }
}

/// Starts a runtime for every configured session, each delivering to `handler`.
///
/// Every session is validated first, and every password resolved, so a bad configuration
/// starts nothing.
pub fn start_all(
    settings: &SessionsSettings,
    ledger: &SessionLedger,
    handler: Arc<dyn MqttHandler>,
) -> Result<Vec<SessionRuntime>, SessionError> {
    let mqtt = &settings.mqtt;
    let resolved = mqtt.resolve()?;
    let mut prepared = Vec::with_capacity(resolved.len());
    for session in resolved {
        let password = mqtt.sessions[&session.name].password()?;
        let tls = match &session.tls {
            None => None,
            Some(files) => Some(
                wharf_mqtt::TlsOptions::from_files(
                    files.ca_file.as_deref(),
                    files
                        .client
                        .as_ref()
                        .map(|(c, k)| (c.as_path(), k.as_path())),
                )
                .map_err(|e| {
                    SessionError::Config(format!("mqtt.sessions.{}: {e}", session.name))
                })?,
            ),
        };
        let runtime = RuntimeSettings {
            unmatched_grace: mqtt.unmatched_grace,
            connect_timeout: mqtt.connect_timeout,
            subscribe_timeout: mqtt.subscribe_timeout,
            ingest_batch: mqtt.ingest_batch as usize,
            ingest_batch_bytes: usize::try_from(mqtt.ingest_batch_bytes).unwrap_or(usize::MAX),
            password,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(30),
            store_deadline: settings.store_deadline,
            tls,
            lease: settings.lease.timing()?,
            process: settings.process.clone(),
        };
        prepared.push((session, runtime));
    }
    Ok(prepared
        .into_iter()
        .map(|(session, settings)| {
            SessionRuntime::start(session, settings, ledger.clone(), handler.clone())
        })
        .collect())
}
