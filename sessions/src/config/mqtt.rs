//! The `mqtt` section: the MQTT sessions Wharf bridges into the message log (ADR 0026).
//!
//! ```toml
//! [mqtt]
//! unmatched_grace = "5s"
//!
//! [mqtt.sessions.plant]
//! brokers = ["mqtt://127.0.0.1:1883"]
//! client_id = "wharf-plant"
//! mode = "persistent"            # ephemeral | persistent | exclusive
//! session_expiry = "1h"
//! subscriptions = [
//!   { filter = "sensors/#", qos = 1, topic = "sensors" },
//!   { filter = "$share/wharf/alarms/+", qos = 1, topic = "alarms" },
//! ]
//! ```
//!
//! Everything is validated before anything connects: filters (exact, `$share/` forms kept byte
//! for byte), QoS, log topics, broker URLs, and that a persistent or exclusive session names one
//! broker (its managed-filter ledger belongs to one broker's session). Credentials are never
//! printed: `Debug` redacts the password, and the durable identity leaves them out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf_domain::session::{
    CanonicalBroker, DurableSessionIdentity, ExactFilter, IdentityInputs, Qos, SessionMode,
};
use wharf_domain::{GroupName, TopicName};

use crate::error::SessionError;

/// The MQTT sessions and their shared settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// How long a delivery that matches no filter is held before it is acked and dropped, and
    /// how long a recycled connection is watched for replays through removed filters.
    #[serde(with = "humantime_serde")]
    pub unmatched_grace: Duration,
    /// How long a connection attempt (TCP and CONNACK) may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long a SUBSCRIBE or UNSUBSCRIBE may wait for its acknowledgement.
    #[serde(with = "humantime_serde")]
    pub subscribe_timeout: Duration,
    /// The most deliveries the ingest handler appends to the log in one commit. A batch takes
    /// only what has already arrived (it never waits to fill), so a larger cap costs no
    /// latency; it bounds a backlog's commits.
    pub ingest_batch: u32,
    /// The most payload bytes one ingest batch gathers (a delivery larger than this is a batch
    /// of its own): with `ingest_batch`, what bounds the memory a batch holds.
    pub ingest_batch_bytes: u64,
    /// How long a reload waits for every session runtime to disconnect (in-flight batches
    /// committed and acked) before the new runtimes start; past it the old ones are abandoned
    /// (their unacked deliveries stay with the broker).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Accepted for operators who expect the switch; it does **not** bypass the identity
    /// guard: a reload that changes or removes a persistent or exclusive session's durable
    /// identity is refused either way (ADR 0029, docs/runbooks/config-rollback.md).
    pub allow_destructive_reload: bool,
    /// `direct` (each change is one swap) or `debounced` (changes within `reload_window` of
    /// each other fold into one swap).
    pub reload_strategy: ReloadStrategy,
    /// The quiet period of the `debounced` strategy: a swap runs once no change arrived for
    /// this long.
    #[serde(with = "humantime_serde")]
    pub reload_window: Duration,
    /// How often `serve` polls the configuration file's contents for a change (0s: only
    /// SIGHUP reloads).
    #[serde(with = "humantime_serde")]
    pub reload_poll_interval: Duration,
    /// The sessions, by name (`[mqtt.sessions.NAME]`).
    pub sessions: BTreeMap<String, SessionConfig>,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            unmatched_grace: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(30),
            subscribe_timeout: Duration::from_secs(30),
            ingest_batch: 500,
            ingest_batch_bytes: 16 * 1024 * 1024,
            drain_timeout: Duration::from_secs(30),
            allow_destructive_reload: false,
            reload_strategy: ReloadStrategy::Direct,
            reload_window: Duration::from_secs(1),
            reload_poll_interval: Duration::from_secs(2),
            sessions: BTreeMap::new(),
        }
    }
}

/// How configuration changes become swaps of the session runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReloadStrategy {
    /// Every change (a SIGHUP, a changed file) is its own swap: N rapid writes are N swaps.
    #[default]
    Direct,
    /// Changes are folded: the swap runs once `mqtt.reload_window` passed with no new one.
    Debounced,
}

impl ReloadStrategy {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Debounced => "debounced",
        }
    }
}

/// How the client ID is completed before it is used (and before the identity is computed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientIdSuffix {
    /// The client ID as written.
    #[default]
    None,
    /// `-<hostname>` appended: one session per machine (a StatefulSet pod name, say).
    Hostname,
}

/// One MQTT session.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {
    /// Broker URLs (`mqtt://host:port`). Persistent and exclusive sessions take exactly one.
    pub brokers: Vec<String>,
    /// The MQTT client ID (before the suffix).
    pub client_id: String,
    /// How the client ID is completed.
    #[serde(default)]
    pub client_id_suffix: ClientIdSuffix,
    /// `ephemeral`, `persistent` (the default) or `exclusive`.
    #[serde(default = "default_mode")]
    pub mode: SessionMode,
    /// Clean start on connect; by default on for ephemeral sessions only.
    #[serde(default)]
    pub clean_start: Option<bool>,
    /// How long the broker keeps the session after a disconnect (persistent and exclusive;
    /// default 1h, at most 2^32-1 seconds). Ephemeral sessions always use 0.
    #[serde(default, with = "humantime_serde")]
    pub session_expiry: Option<Duration>,
    /// Keep-alive interval (default 30s).
    #[serde(default = "default_keep_alive", with = "humantime_serde")]
    pub keep_alive: Duration,
    /// User name, if the broker wants one.
    #[serde(default)]
    pub username: Option<String>,
    /// Password (prefer `password_env`).
    #[serde(default)]
    pub password: Option<String>,
    /// The name of an environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// TLS (`mqtts://` brokers): the CA that signed the broker's certificate, as PEM (the
    /// Mozilla roots when absent).
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// TLS client certificate chain (PEM), with `tls_key_file`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// TLS client private key (PEM), with `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// The desired subscriptions: exactly the filters this session holds at the broker.
    #[serde(default)]
    pub subscriptions: Vec<SubscriptionConfig>,
}

impl SessionConfig {
    /// A persistent session on `broker` as `client_id` with every other key at its default and
    /// no subscriptions (fill them in with struct update syntax).
    pub fn new(broker: &str, client_id: &str) -> Self {
        Self {
            brokers: vec![broker.to_owned()],
            client_id: client_id.to_owned(),
            client_id_suffix: ClientIdSuffix::None,
            mode: default_mode(),
            clean_start: None,
            session_expiry: None,
            keep_alive: default_keep_alive(),
            username: None,
            password: None,
            password_env: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            subscriptions: Vec::new(),
        }
    }
}

fn default_mode() -> SessionMode {
    SessionMode::Persistent
}

fn default_keep_alive() -> Duration {
    Duration::from_secs(30)
}

impl fmt::Debug for SessionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionConfig")
            .field("brokers", &self.brokers)
            .field("client_id", &self.client_id)
            .field("client_id_suffix", &self.client_id_suffix)
            .field("mode", &self.mode)
            .field("clean_start", &self.clean_start)
            .field("session_expiry", &self.session_expiry)
            .field("keep_alive", &self.keep_alive)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_env", &self.password_env)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("subscriptions", &self.subscriptions)
            .finish()
    }
}

/// One desired subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfig {
    /// The exact filter (`sensors/#`, `$share/wharf/sensors/#`).
    pub filter: String,
    /// The QoS requested (0, 1 or 2; default 1).
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// The message-log topic its messages are appended to.
    pub topic: String,
}

fn default_qos() -> u8 {
    1
}

/// A session's validated settings: what the session runtime is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedSession {
    /// The session's name in the configuration.
    pub name: String,
    /// The durable identity (the managed-filter ledger's id).
    pub identity: DurableSessionIdentity,
    /// The brokers, canonical.
    pub brokers: Vec<CanonicalBroker>,
    /// The effective client ID.
    pub client_id: String,
    /// The effective clean-start flag.
    pub clean_start: bool,
    /// The effective session expiry in seconds.
    pub session_expiry_secs: u32,
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// User name, if any.
    pub username: Option<String>,
    /// The desired filters with their QoS and log topic, in configuration order.
    pub subscriptions: Vec<(ExactFilter, Qos, TopicName)>,
    /// TLS, for `mqtts://` brokers.
    pub tls: Option<TlsFiles>,
}

/// A TLS session's files, checked to exist (their contents are read when the runtime starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s); `None` for the Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain and its key, when the broker wants a client certificate.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl ResolvedSession {
    /// Whether the broker keeps this session's subscriptions across connections, so that its
    /// filters must be tracked in the managed-filter ledger.
    pub fn is_durable(&self) -> bool {
        self.identity.mode() != SessionMode::Ephemeral
    }

    /// The desired filters and their QoS.
    pub fn desired(&self) -> Vec<(ExactFilter, Qos)> {
        self.subscriptions
            .iter()
            .map(|(filter, qos, _)| (filter.clone(), *qos))
            .collect()
    }
}

impl MqttConfig {
    /// Checks every bound and every session, naming the key and the value.
    pub fn validate(&self) -> Result<(), SessionError> {
        let hour = Duration::from_secs(3600);
        for (key, value) in [
            ("unmatched_grace", self.unmatched_grace),
            ("connect_timeout", self.connect_timeout),
            ("subscribe_timeout", self.subscribe_timeout),
        ] {
            if value < Duration::from_millis(10) || value > hour {
                return Err(SessionError::Config(format!(
                    "mqtt.{key} must be between 10ms and 1h, got {}",
                    humantime::format_duration(value)
                )));
            }
        }
        for (key, value, low) in [
            (
                "drain_timeout",
                self.drain_timeout,
                Duration::from_millis(10),
            ),
            (
                "reload_window",
                self.reload_window,
                Duration::from_millis(10),
            ),
            (
                "reload_poll_interval",
                self.reload_poll_interval,
                Duration::ZERO,
            ),
        ] {
            if value < low || value > hour {
                return Err(SessionError::Config(format!(
                    "mqtt.{key} must be between {} and 1h, got {}",
                    humantime::format_duration(low),
                    humantime::format_duration(value)
                )));
            }
        }
        if !self.reload_poll_interval.is_zero()
            && self.reload_poll_interval < Duration::from_millis(10)
        {
            return Err(SessionError::Config(format!(
                "mqtt.reload_poll_interval must be 0s (no polling) or at least 10ms, got {}",
                humantime::format_duration(self.reload_poll_interval)
            )));
        }
        if !(1..=10_000).contains(&self.ingest_batch) {
            return Err(SessionError::Config(format!(
                "mqtt.ingest_batch must be between 1 and 10000, got {}",
                self.ingest_batch
            )));
        }
        if !(1024..=1024 * 1024 * 1024).contains(&self.ingest_batch_bytes) {
            return Err(SessionError::Config(format!(
                "mqtt.ingest_batch_bytes must be between 1024 and 1073741824, got {}",
                self.ingest_batch_bytes
            )));
        }
        self.resolve_with(&|| "host".to_owned()).map(|_| ())
    }

    /// Every session, validated and resolved (the client ID suffix from this machine).
    pub fn resolve(&self) -> Result<Vec<ResolvedSession>, SessionError> {
        self.resolve_with(&local_hostname)
    }

    fn resolve_with(
        &self,
        hostname: &dyn Fn() -> String,
    ) -> Result<Vec<ResolvedSession>, SessionError> {
        let mut seen_ids = BTreeMap::new();
        let mut resolved = Vec::with_capacity(self.sessions.len());
        for (name, session) in &self.sessions {
            let session = session.resolve(name, hostname)?;
            if let Some(other) = seen_ids.insert(session.identity.id().to_owned(), name.clone()) {
                return Err(SessionError::Config(format!(
                    "mqtt.sessions.{name} and mqtt.sessions.{other} resolve to the same durable \
                     session ({}): two runtimes must never share one broker session",
                    session.identity.describe()
                )));
            }
            resolved.push(session);
        }
        Ok(resolved)
    }
}

fn local_hostname() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

impl SessionConfig {
    fn resolve(
        &self,
        name: &str,
        hostname: &dyn Fn() -> String,
    ) -> Result<ResolvedSession, SessionError> {
        let key = |field: &str| format!("mqtt.sessions.{name}.{field}");
        GroupName::parse("session name", name)
            .map_err(|e| SessionError::Config(format!("mqtt.sessions.{name}: {e}")))?;
        let brokers = self.canonical_brokers(&key("brokers"))?;
        let tls = self.tls_files(name, &brokers)?;
        let client_id = match self.client_id_suffix {
            ClientIdSuffix::None => self.client_id.clone(),
            ClientIdSuffix::Hostname => format!("{}-{}", self.client_id, hostname()),
        };
        check_client_id(&key("client_id"), &client_id)?;
        let durable = self.mode != SessionMode::Ephemeral;
        let clean_start = self.clean_start.unwrap_or(!durable);
        let session_expiry_secs = self.expiry_secs(&key("session_expiry"), durable)?;
        if self.keep_alive < Duration::from_secs(1) || self.keep_alive > Duration::from_secs(65_535)
        {
            return Err(SessionError::Config(format!(
                "{} must be between 1s and 65535s, got {}",
                key("keep_alive"),
                humantime::format_duration(self.keep_alive)
            )));
        }
        if self.password.is_some() && self.password_env.is_some() {
            return Err(SessionError::Config(format!(
                "{} and {} are both set: give the password one way",
                key("password"),
                key("password_env")
            )));
        }
        let identity = DurableSessionIdentity::new(IdentityInputs {
            broker_url: &self.brokers[0],
            client_id: &client_id,
            mode: self.mode,
            clean_start,
            session_expiry_secs,
        })
        .map_err(|e| SessionError::Config(format!("mqtt.sessions.{name}: {e}")))?;
        Ok(ResolvedSession {
            name: name.to_owned(),
            identity,
            brokers,
            client_id,
            clean_start,
            session_expiry_secs,
            keep_alive: self.keep_alive,
            username: self.username.clone(),
            subscriptions: self.subscriptions(&key("subscriptions"))?,
            tls,
        })
    }

    /// The password, from the file or the named environment variable.
    pub fn password(&self) -> Result<Option<String>, SessionError> {
        match (&self.password, &self.password_env) {
            (Some(password), _) => Ok(Some(password.clone())),
            (None, Some(var)) => std::env::var(var).map(Some).map_err(|_| {
                SessionError::Config(format!(
                    "password_env names {var}, which is not set (or not UTF-8)"
                ))
            }),
            (None, None) => Ok(None),
        }
    }

    fn canonical_brokers(&self, key: &str) -> Result<Vec<CanonicalBroker>, SessionError> {
        if self.brokers.is_empty() {
            return Err(SessionError::Config(format!("{key} must name a broker")));
        }
        let mut brokers = Vec::new();
        for url in &self.brokers {
            let broker = CanonicalBroker::parse(key, url)
                .map_err(|e| SessionError::Config(e.to_string()))?;
            if !brokers.contains(&broker) {
                brokers.push(broker);
            }
        }
        if self.mode != SessionMode::Ephemeral && brokers.len() > 1 {
            return Err(SessionError::Config(format!(
                "{key} names {} different brokers for a {} session: its managed-filter ledger \
                 records one broker session's filters, and failing over to another broker would \
                 apply one broker's history to another; use one broker URL, or mode \"ephemeral\"",
                brokers.len(),
                self.mode
            )));
        }
        Ok(brokers)
    }

    /// TLS for `mqtts://` brokers; TLS files for a plain broker, half a client certificate, or
    /// a file that is not there are refused naming the key.
    fn tls_files(
        &self,
        name: &str,
        brokers: &[CanonicalBroker],
    ) -> Result<Option<TlsFiles>, SessionError> {
        let key = |field: &str| format!("mqtt.sessions.{name}.{field}");
        let tls = brokers.iter().any(|b| b.scheme == "mqtts");
        if tls && brokers.iter().any(|b| b.scheme != "mqtts") {
            return Err(SessionError::Config(format!(
                "{} mixes mqtt:// and mqtts:// brokers: a session is TLS or not",
                key("brokers")
            )));
        }
        let given = [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ];
        for (field, path) in given {
            let Some(path) = path else { continue };
            if !tls {
                return Err(SessionError::Config(format!(
                    "{} is set but the broker is not mqtts://: use an mqtts:// URL for TLS",
                    key(field)
                )));
            }
            if !path.is_file() {
                return Err(SessionError::Config(format!(
                    "{} {} is not a readable file",
                    key(field),
                    path.display()
                )));
            }
        }
        if !tls {
            return Ok(None);
        }
        let client = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key_file)) => Some((cert.clone(), key_file.clone())),
            (None, None) => None,
            _ => {
                return Err(SessionError::Config(format!(
                    "{} and {} go together: a client certificate needs its key",
                    key("tls_cert_file"),
                    key("tls_key_file")
                )))
            }
        };
        Ok(Some(TlsFiles {
            ca_file: self.tls_ca_file.clone(),
            client,
        }))
    }

    fn expiry_secs(&self, key: &str, durable: bool) -> Result<u32, SessionError> {
        if !durable {
            if self.session_expiry.is_some_and(|e| !e.is_zero()) {
                return Err(SessionError::Config(format!(
                    "{key} is set for an ephemeral session, whose broker session ends with its \
                     connection: remove it, or use mode \"persistent\""
                )));
            }
            return Ok(0);
        }
        let expiry = self.session_expiry.unwrap_or(Duration::from_secs(3600));
        u32::try_from(expiry.as_secs())
            .ok()
            .filter(|secs| *secs >= 1)
            .ok_or_else(|| {
                SessionError::Config(format!(
                    "{key} must be between 1s and 4294967295s for a persistent session, got {}",
                    humantime::format_duration(expiry)
                ))
            })
    }

    fn subscriptions(&self, key: &str) -> Result<Vec<(ExactFilter, Qos, TopicName)>, SessionError> {
        let mut seen = BTreeSet::new();
        let mut desired = Vec::with_capacity(self.subscriptions.len());
        for (i, sub) in self.subscriptions.iter().enumerate() {
            let at = format!("{key}[{i}]");
            let filter = ExactFilter::parse_field(&format!("{at}.filter"), &sub.filter)
                .map_err(|e| SessionError::Config(e.to_string()))?;
            let qos = Qos::parse_field(&format!("{at}.qos"), sub.qos)
                .map_err(|e| SessionError::Config(e.to_string()))?;
            let topic = TopicName::parse(&format!("{at}.topic"), &sub.topic)
                .map_err(|e| SessionError::Config(e.to_string()))?;
            if !seen.insert(filter.clone()) {
                return Err(SessionError::Config(format!(
                    "{at}.filter \"{filter}\" is listed twice: one session holds each filter once"
                )));
            }
            desired.push((filter, qos, topic));
        }
        Ok(desired)
    }
}

/// MQTT v5 allows client IDs of up to 65535 bytes; brokers commonly accept 1 to 23 at least.
fn check_client_id(key: &str, client_id: &str) -> Result<(), SessionError> {
    if client_id.is_empty() || client_id.len() > 65_535 || client_id.contains('\0') {
        return Err(SessionError::Config(format!(
            "{key} \"{}\" must be 1 to 65535 bytes without NUL",
            client_id.escape_debug()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(toml_text: &str) -> Result<Vec<ResolvedSession>, SessionError> {
        let config: MqttConfig = toml::from_str(toml_text).expect("valid TOML of the section");
        config.resolve_with(&|| "node-7".to_owned())
    }

    fn error(toml_text: &str) -> String {
        session(toml_text).expect_err("refused").to_string()
    }

    const PLANT: &str = r#"
        [sessions.plant]
        brokers = ["mqtt://u:secret@Broker.Example:1883"]
        client_id = "wharf-plant"
        subscriptions = [
          { filter = "sensors/#", topic = "sensors" },
          { filter = "$share/wharf/alarms/+", qos = 2, topic = "alarms" },
        ]
    "#;

    #[test]
    fn a_persistent_session_resolves_with_its_defaults() {
        let sessions = session(PLANT).expect("valid");
        let s = &sessions[0];
        assert_eq!(s.name, "plant");
        assert!(s.is_durable());
        assert!(!s.clean_start);
        assert_eq!(s.session_expiry_secs, 3600);
        assert_eq!(s.subscriptions[1].0.as_str(), "$share/wharf/alarms/+");
        assert_eq!(s.subscriptions[1].1, Qos::ExactlyOnce);
        assert_eq!(s.subscriptions[0].1, Qos::AtLeastOnce);
        assert!(!s.identity.describe().contains("secret"));
    }

    #[test]
    fn credentials_do_not_change_the_identity() {
        let a = session(PLANT).expect("valid");
        let b =
            session(&PLANT.replace("u:secret@Broker.Example", "broker.example")).expect("valid");
        assert_eq!(a[0].identity.id(), b[0].identity.id());
    }

    #[test]
    fn the_hostname_suffix_is_part_of_the_client_id() {
        let text = PLANT.replace(
            "client_id = \"wharf-plant\"",
            "client_id = \"wharf-plant\"\nclient_id_suffix = \"hostname\"",
        );
        let s = session(&text).expect("valid");
        assert_eq!(s[0].client_id, "wharf-plant-node-7");
        assert_ne!(
            s[0].identity.id(),
            session(PLANT).expect("valid")[0].identity.id()
        );
    }

    #[test]
    fn a_persistent_session_with_two_brokers_is_refused_saying_why() {
        let text = PLANT.replace(
            "brokers = [\"mqtt://u:secret@Broker.Example:1883\"]",
            "brokers = [\"mqtt://a:1883\", \"mqtt://b:1883\"]",
        );
        let e = error(&text);
        assert!(
            e.contains("mqtt.sessions.plant.brokers names 2 different brokers"),
            "{e}"
        );
        assert!(e.contains("one broker's history to another"), "{e}");
        // The same broker spelled twice is one broker.
        let same = PLANT.replace(
            "brokers = [\"mqtt://u:secret@Broker.Example:1883\"]",
            "brokers = [\"mqtt://a\", \"MQTT://a:1883\"]",
        );
        assert!(session(&same).is_ok());
        let ephemeral = text.replace(
            "client_id = \"wharf-plant\"",
            "client_id = \"x\"\nmode = \"ephemeral\"",
        );
        assert!(
            session(&ephemeral).is_ok(),
            "ephemeral sessions may list several brokers"
        );
    }

    #[test]
    fn bad_filters_and_shared_forms_are_named() {
        let e = error(&PLANT.replace("sensors/#", "sensors/#/x"));
        assert!(
            e.contains("mqtt.sessions.plant.subscriptions[0].filter"),
            "{e}"
        );
        assert!(e.contains("sensors/#/x"), "{e}");
        let e = error(&PLANT.replace("$share/wharf/alarms/+", "$share//alarms/+"));
        assert!(e.contains("subscriptions[1].filter"), "{e}");
        let e = error(&PLANT.replace("qos = 2", "qos = 3"));
        assert!(e.contains("subscriptions[1].qos"), "{e}");
        let e = error(&PLANT.replace("$share/wharf/alarms/+", "sensors/#"));
        assert!(e.contains("listed twice"), "{e}");
    }

    #[test]
    fn credentials_never_reach_debug_or_errors() {
        let text = PLANT.replace(
            "client_id = \"wharf-plant\"",
            "client_id = \"c\"\npassword = \"hunter2\"",
        );
        let config: MqttConfig = toml::from_str(&text).expect("valid TOML");
        assert!(!format!("{config:?}").contains("hunter2"));
        let e = error(&text.replace("mqtt://u:secret@Broker.Example:1883", "mqtt://u:secret@/x"));
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn tls_takes_an_mqtts_broker_and_files_that_exist() {
        let tls = PLANT.replace("mqtt://u:secret@Broker.Example:1883", "mqtts://b");
        let s = session(&tls).expect("mqtts with the Mozilla roots");
        let roots = TlsFiles {
            ca_file: None,
            client: None,
        };
        assert_eq!(s[0].tls, Some(roots));
        assert_eq!(s[0].brokers[0].port, 8883);
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "x").expect("write");
        let with_ca = tls.replace(
            "client_id = \"wharf-plant\"",
            &format!(
                "client_id = \"wharf-plant\"\ntls_ca_file = {:?}",
                ca.display().to_string()
            ),
        );
        let s = session(&with_ca).expect("a CA file");
        let plain_id = session(&tls).expect("valid")[0].identity.id().to_owned();
        assert_eq!(s[0].identity.id(), plain_id, "TLS files are not identity");
        let e = error(&with_ca.replace("ca.crt", "missing.crt"));
        assert!(
            e.contains("tls_ca_file") && e.contains("not a readable file"),
            "{e}"
        );
        assert!(error(&with_ca.replace("mqtts://b", "mqtt://b")).contains("not mqtts://"));
        assert!(error(&with_ca.replace("tls_ca_file", "tls_cert_file")).contains("go together"));
    }

    #[test]
    fn two_sessions_with_one_identity_are_refused() {
        let text = format!(
            "{PLANT}\n{}",
            PLANT.replace("sessions.plant", "sessions.copy")
        );
        let e = error(&text);
        assert!(e.contains("resolve to the same durable session"), "{e}");
    }
}
