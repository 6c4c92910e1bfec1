//! Managed MQTT sessions: the durable managed-filter ledger, baseline seeding, and (in the
//! session runtime) the reconcile that keeps the broker's filters exactly the desired ones.
//!
//! A persistent session's filters live at the broker across connections, so Wharf records,
//! durably and before each SUBSCRIBE, every filter that may exist there (ADR 0022, ADR 0026).
//! Existing broker sessions predate that record: each durable identity must be seeded once,
//! with the exact filters it holds (or explicitly empty); nothing seeds implicitly.

mod lease;
mod ledger;
mod seed;

pub use lease::{Acquired, LeaseLedger, RenewVerdict};
pub use ledger::SessionLedger;
pub use seed::{parse_seed_spec, SeedSpec};

use crate::config::{MqttConfig, ResolvedSession};
use crate::error::WharfError;

/// Finds the session a command names: a configured session's name, or a durable identity
/// (`ms-...`) that may or may not be configured here. The configured session comes with it.
pub fn find_session(
    config: &MqttConfig,
    reference: &str,
) -> Result<(String, Option<ResolvedSession>), WharfError> {
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
    Err(WharfError::Config(format!(
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
mod subscribe;

pub use exclusive::{activation_bound, activation_phases};
pub use ingest::{to_log_message, LogIngest, MqttHandler, MqttMessage};
pub use runtime::{LeaseView, ReconcileOutcome, RuntimeSettings, SessionRuntime, SessionStatus};

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;

/// Starts a runtime for every configured session, each delivering to `handler`.
///
/// Every session is validated first, and every password resolved, so a bad configuration
/// starts nothing.
pub fn start_all(
    config: &Config,
    ledger: &SessionLedger,
    handler: Arc<dyn MqttHandler>,
) -> Result<Vec<SessionRuntime>, WharfError> {
    let resolved = config.mqtt.resolve()?;
    let mut prepared = Vec::with_capacity(resolved.len());
    for session in resolved {
        let password = config.mqtt.sessions[&session.name].password()?;
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
                .map_err(|e| WharfError::Config(format!("mqtt.sessions.{}: {e}", session.name)))?,
            ),
        };
        let settings = RuntimeSettings {
            unmatched_grace: config.mqtt.unmatched_grace,
            connect_timeout: config.mqtt.connect_timeout,
            subscribe_timeout: config.mqtt.subscribe_timeout,
            ingest_batch: config.mqtt.ingest_batch as usize,
            ingest_batch_bytes: usize::try_from(config.mqtt.ingest_batch_bytes)
                .unwrap_or(usize::MAX),
            password,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(30),
            store_deadline: config.declarations.call_deadline(),
            tls,
            lease: config.lease.timing()?,
        };
        prepared.push((session, settings));
    }
    Ok(prepared
        .into_iter()
        .map(|(session, settings)| {
            SessionRuntime::start(session, settings, ledger.clone(), handler.clone())
        })
        .collect())
}
