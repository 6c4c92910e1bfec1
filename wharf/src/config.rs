//! Typed configuration: a TOML file, then `WHARF_<SECTION>__<KEY>` environment overrides.
//!
//! Every key has a default, so no file is needed for the embedded SQLite default. Unknown keys
//! are refused by name, so a typo never silently falls back to a default.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::WharfError;

mod log;
mod mqtt;

pub use log::{parse_filter, LogConfig, LogFormat, FILTER_FORMAT};
pub use mqtt::{ClientIdSuffix, MqttConfig, ResolvedSession, SessionConfig, SubscriptionConfig};

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the ledger lives.
    pub store: StoreConfig,
    /// How declarations retry and how liveness is judged.
    pub declarations: DeclarationConfig,
    /// The REST listing API.
    pub http: HttpConfig,
    /// The deferred pruner.
    pub prune: PruneConfig,
    /// The message log: claims, retries, the consumer runtime and log retention.
    pub queue: QueueConfig,
    /// How the `wharf` binary logs (the library installs no subscriber).
    pub log: LogConfig,
    /// The MQTT sessions bridged into the message log.
    pub mqtt: MqttConfig,
}

/// Where the ledger lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite://PATH` (the embedded default) or `postgres://...` (cluster mode).
    pub url: String,
    /// Postgres only: the schema Wharf's tables live in (created if missing). Empty = default.
    pub schema: String,
    /// Postgres only: the most connections this process holds (1 to 1000).
    pub max_connections: u32,
    /// Apply pending migrations at start. When false, start fails on an unmigrated schema.
    pub auto_migrate: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://wharf.db".into(),
            schema: String::new(),
            max_connections: 10,
            auto_migrate: true,
        }
    }
}

/// How declarations retry and how liveness is judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeclarationConfig {
    /// How often a waiting `consume` re-attempts its declaration. There is deliberately no
    /// timeout: deadline policy belongs to the orchestrator's readiness probe.
    #[serde(with = "humantime_serde")]
    pub retry_interval: Duration,
    /// How often a consuming instance heartbeats. Must be below half of `instance_ttl`.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// How old a heartbeat may be, by the store's clock, for its instance to count as live.
    /// It also bounds a consumer's readiness: a consumer whose heartbeat has not been confirmed
    /// for this long stops being ready and claiming, and re-declares before it claims again.
    /// Every store call of a consumer gets a third of it as its deadline.
    #[serde(with = "humantime_serde")]
    pub instance_ttl: Duration,
}

impl DeclarationConfig {
    /// The deadline of every store call on a consumer's path (a declaration attempt, a
    /// heartbeat, the effective-install read, a leave, a fetch): a third of `instance_ttl`.
    ///
    /// A third leaves time for a retry before an instance's heartbeat row can lapse (the last
    /// confirmed heartbeat plus the TTL), yet does not abandon a store that is merely slow.
    /// Never below a millisecond, even for an unvalidated configuration.
    pub fn call_deadline(&self) -> Duration {
        (self.instance_ttl / 3).max(Duration::from_millis(1))
    }
}

impl Default for DeclarationConfig {
    fn default() -> Self {
        Self {
            retry_interval: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(5),
            instance_ttl: Duration::from_secs(30),
        }
    }
}

/// The REST listing API, and the bounds that keep a slow or idle client from pinning it
/// (ADR 0018).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// The address `serve` listens on (loopback by default).
    pub listen: SocketAddr,
    /// How long a client may take to send a request's headers (also while a kept-alive
    /// connection waits for its next request); the connection is closed after it.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long one request may take from its headers to its response; after it the answer is
    /// 503 `unavailable`.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a connection may stay open with no request in flight before it is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// The largest request body accepted, in bytes; larger is 413 (every endpoint is a GET, so
    /// a body is never needed).
    pub max_body_bytes: u64,
    /// The most open connections; further ones wait in the listen backlog until one closes.
    pub max_connections: u32,
    /// The most requests handled at once; further ones wait (within `request_timeout`).
    pub max_concurrent_requests: u32,
    /// How long a `/metrics` scrape waits for the store's figures; past it `wharf_store_up` is
    /// 0 and the process counters are served without them. Below `request_timeout`.
    #[serde(with = "humantime_serde")]
    pub metrics_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_body_bytes: 64 * 1024,
            max_connections: 1024,
            max_concurrent_requests: 256,
            metrics_timeout: Duration::from_secs(5),
        }
    }
}

impl HttpConfig {
    /// The server bounds these settings describe.
    pub fn limits(&self) -> wharf_api::HttpLimits {
        wharf_api::HttpLimits {
            header_read_timeout: self.header_read_timeout,
            request_timeout: self.request_timeout,
            idle_timeout: self.idle_timeout,
            max_body_bytes: self.max_body_bytes,
            max_connections: self.max_connections as usize,
            max_concurrent_requests: self.max_concurrent_requests as usize,
        }
    }

    fn validate(&self) -> Result<(), WharfError> {
        let hour = Duration::from_secs(3600);
        for (key, value) in [
            ("header_read_timeout", self.header_read_timeout),
            ("request_timeout", self.request_timeout),
            ("idle_timeout", self.idle_timeout),
            ("metrics_timeout", self.metrics_timeout),
        ] {
            if value < Duration::from_millis(10) || value > hour {
                return Err(WharfError::Config(format!(
                    "http.{key} must be between 10ms and 1h, got {}",
                    humantime::format_duration(value)
                )));
            }
        }
        if self.metrics_timeout >= self.request_timeout {
            return Err(WharfError::Config(format!(
                "http.metrics_timeout ({}) must be below http.request_timeout ({}): a scrape \
                 answers within the request timeout",
                humantime::format_duration(self.metrics_timeout),
                humantime::format_duration(self.request_timeout)
            )));
        }
        if !(1..=16 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(WharfError::Config(format!(
                "http.max_body_bytes must be between 1 and 16777216 (16 MiB), got {}",
                self.max_body_bytes
            )));
        }
        for (key, value) in [
            ("max_connections", self.max_connections),
            ("max_concurrent_requests", self.max_concurrent_requests),
        ] {
            if !(1..=65_536).contains(&value) {
                return Err(WharfError::Config(format!(
                    "http.{key} must be between 1 and 65536, got {value}"
                )));
            }
        }
        Ok(())
    }
}

/// The deferred pruner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PruneConfig {
    /// Superseded waiting attempts younger than this are kept.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How often `serve` runs the pruner; `0s` disables the schedule.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Rows per delete transaction.
    pub batch: i64,
}

impl Default for PruneConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(24 * 3600),
            interval: Duration::from_secs(3600),
            batch: 1000,
        }
    }
}

/// The message log: how claims and retries behave, how a consumer's runtime claims and drains,
/// and how long the log keeps aged messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// How long a claim hides a message from other instances; a handler still running after
    /// this may see its message redelivered elsewhere (delivery is at least once).
    #[serde(with = "humantime_serde")]
    pub visibility_timeout: Duration,
    /// How many times a message may be claimed before it goes to the group's dead letters.
    pub max_attempts: u32,
    /// The backoff after a message's first failure; it doubles with every further attempt.
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// The longest backoff between attempts.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// How many log positions one routing step reads.
    pub route_batch: i64,
    /// The most messages a consumer claims in one fetch.
    pub claim_batch: u32,
    /// How long a consumer waits after a fetch that claimed nothing before it fetches again.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// The most handlers one consumer runs at once.
    pub concurrency: u32,
    /// How long a running handler's claim is kept alive by extending it (by the visibility
    /// timeout, every third of it). After this the claim is left to expire, so a hung handler
    /// cannot hold its message forever. `0s` never extends.
    #[serde(with = "humantime_serde")]
    pub max_claim_hold: Duration,
    /// How long a shutting-down consumer waits for its running handlers before it aborts them
    /// (their claims then expire and the messages are redelivered).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Messages older than this that no live group still needs are deleted from the log.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Rows per retention delete transaction.
    pub retention_batch: i64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            route_batch: 1000,
            claim_batch: 32,
            poll_interval: Duration::from_millis(200),
            concurrency: 8,
            max_claim_hold: Duration::from_secs(3600),
            drain_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
            retention_batch: 5000,
        }
    }
}

impl QueueConfig {
    /// The claim and retry settings the queue layer works with.
    pub fn settings(&self) -> wharf_queue::QueueSettings {
        wharf_queue::QueueSettings {
            visibility_timeout: self.visibility_timeout,
            max_attempts: self.max_attempts,
            backoff_base: self.backoff_base,
            backoff_max: self.backoff_max,
            route_batch: self.route_batch,
        }
    }

    fn validate(&self) -> Result<(), WharfError> {
        let zero_durations = [
            ("visibility_timeout", self.visibility_timeout),
            ("poll_interval", self.poll_interval),
            ("retention", self.retention),
        ];
        if let Some((key, _)) = zero_durations.iter().find(|(_, d)| d.is_zero()) {
            return Err(WharfError::Config(format!("queue.{key} must be above 0")));
        }
        check_retention("queue.retention", self.retention)?;
        let counts = [
            ("max_attempts", i64::from(self.max_attempts)),
            ("route_batch", self.route_batch),
            ("claim_batch", i64::from(self.claim_batch)),
            ("concurrency", i64::from(self.concurrency)),
            ("retention_batch", self.retention_batch),
        ];
        if let Some((key, value)) = counts.iter().find(|(_, n)| *n < 1) {
            return Err(WharfError::Config(format!(
                "queue.{key} must be at least 1, got {value}"
            )));
        }
        if self.max_claim_hold > Duration::from_secs(7 * 24 * 3600) {
            return Err(WharfError::Config(format!(
                "queue.max_claim_hold must be at most 7 days, got {}",
                humantime::format_duration(self.max_claim_hold)
            )));
        }
        if self.backoff_max < self.backoff_base {
            return Err(WharfError::Config(format!(
                "queue.backoff_max ({}) must not be below queue.backoff_base ({})",
                humantime::format_duration(self.backoff_max),
                humantime::format_duration(self.backoff_base)
            )));
        }
        Ok(())
    }
}

/// The prefix of environment overrides: `WHARF_STORE__URL`, `WHARF_HTTP__LISTEN`, ...
pub const ENV_PREFIX: &str = "WHARF_";

/// `WHARF_` variables that are not configuration keys and are left alone: the file
/// (`WHARF_CONFIG`, read by the command line) and the test harness's own.
const ENV_NOT_CONFIG: &[&str] = &["WHARF_CONFIG", "WHARF_REQUIRE_SERVICES"];
const ENV_NOT_CONFIG_PREFIXES: &[&str] = &["WHARF_TEST_", "WHARF_BENCH_"];

/// The longest retention accepted (100 years of 365.25 days): a cutoff further back than this
/// is not a retention but a mistake, and could leave the store's time range.
pub const MAX_RETENTION: Duration = Duration::from_secs(100 * 31_557_600);

/// What a retention accepts, for error messages.
pub const RETENTION_FORMAT: &str =
    "a duration such as 90s, 15m, 24h or 7d (units s, m, h, d, w, months, years), at most 100 years";

fn check_retention(key: &str, value: Duration) -> Result<(), WharfError> {
    if value > MAX_RETENTION {
        return Err(WharfError::Config(format!(
            "{key} must be at most 100 years, got {}",
            humantime::format_duration(value)
        )));
    }
    Ok(())
}

/// Parses a retention flag (`--retention 7d`): humantime, at most [`MAX_RETENTION`]; the error
/// names the accepted formats and bounds.
pub fn parse_retention(text: &str) -> Result<Duration, String> {
    let value =
        humantime::parse_duration(text).map_err(|e| format!("{e}: expected {RETENTION_FORMAT}"))?;
    if value > MAX_RETENTION {
        return Err(format!("expected {RETENTION_FORMAT}"));
    }
    Ok(value)
}

impl Config {
    /// Loads `path` (when given) and applies environment overrides from `env`.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, WharfError> {
        let mut table = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    WharfError::Config(format!("cannot read {}: {e}", path.display()))
                })?;
                text.parse::<toml::Table>().map_err(|e| {
                    WharfError::Config(format!("{} is not valid TOML: {e}", path.display()))
                })?
            }
            None => toml::Table::new(),
        };
        apply_env(&mut table, env)?;
        let config = decode(&table)?;
        config.validate()?;
        Ok(config)
    }

    /// The default configuration as a commented TOML document.
    pub fn default_toml() -> String {
        let body = toml::to_string_pretty(&Config::default()).unwrap_or_default();
        format!(
            "# Wharf configuration. Every key is optional; shown here with its default.\n\
             # Override any key with an environment variable WHARF_<SECTION>__<KEY>,\n\
             # e.g. WHARF_STORE__URL=postgres://wharf@db/wharf for cluster mode.\n\n{body}"
        )
    }

    fn validate(&self) -> Result<(), WharfError> {
        let d = &self.declarations;
        if d.heartbeat_interval.is_zero() || d.retry_interval.is_zero() {
            return Err(WharfError::Config(
                "declarations.heartbeat_interval and declarations.retry_interval must be above 0"
                    .into(),
            ));
        }
        if d.instance_ttl <= d.heartbeat_interval * 2 {
            return Err(WharfError::Config(format!(
                "declarations.instance_ttl ({}) must exceed twice declarations.heartbeat_interval ({}), \
                 or one late heartbeat would let a live incumbent be swapped out",
                humantime::format_duration(d.instance_ttl),
                humantime::format_duration(d.heartbeat_interval)
            )));
        }
        check_retention("prune.retention", self.prune.retention)?;
        if !(1..=1000).contains(&self.store.max_connections) {
            return Err(WharfError::Config(format!(
                "store.max_connections must be between 1 and 1000, got {}",
                self.store.max_connections
            )));
        }
        if !self.store.schema.is_empty() {
            wharf_store::postgres::check_schema_name(&self.store.schema)
                .map_err(|e| WharfError::Config(e.to_string()))?;
        }
        self.http.validate()?;
        if self.prune.batch < 1 {
            return Err(WharfError::Config(format!(
                "prune.batch must be at least 1, got {}",
                self.prune.batch
            )));
        }
        self.queue.validate()?;
        self.log.validate()?;
        self.mqtt.validate()?;
        wharf_store::StoreLocation::parse(&self.store.url)
            .map_err(|e| WharfError::Config(format!("store.url: {e}")))?;
        Ok(())
    }
}

/// Deserializes the merged table through its TOML text, so a value of the wrong type can be
/// reported with its key (`queue.concurrency: invalid type ...`).
fn decode(table: &toml::Table) -> Result<Config, WharfError> {
    let text = toml::to_string(table)
        .map_err(|e| WharfError::Config(format!("cannot re-encode the configuration: {e}")))?;
    toml::from_str(&text).map_err(|e: toml::de::Error| {
        let message = e.message().trim_end();
        WharfError::Config(match e.span().and_then(|span| key_at(&text, span.start)) {
            Some(key) => format!("{key}: {message}"),
            None => message.to_owned(),
        })
    })
}

/// The dotted key (`section.key`) of the line of `text` that holds byte `offset`.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let line_start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(line_start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    let section = text[..line_start]
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix('[')?.strip_suffix(']'));
    Some(match section {
        Some(section) => format!("{section}.{key}"),
        None => key.to_owned(),
    })
}

fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), WharfError> {
    let defaults = toml::Table::try_from(Config::default()).unwrap_or_default();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let Some((section, key)) = rest.split_once("__") else {
            let not_config = ENV_NOT_CONFIG.contains(&name.as_str())
                || ENV_NOT_CONFIG_PREFIXES.iter().any(|p| name.starts_with(p));
            if not_config {
                continue;
            }
            return Err(WharfError::Config(format!(
                "unknown environment variable {name}: configuration variables are named \
                 WHARF_<SECTION>__<KEY> (e.g. WHARF_STORE__URL), and WHARF_CONFIG names the file"
            )));
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let default = defaults
            .get(&section)
            .and_then(|s| s.as_table())
            .and_then(|s| s.get(&key));
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(section_table) = entry else {
            return Err(WharfError::Config(format!(
                "{name}: [{section}] in the file is not a table"
            )));
        };
        section_table.insert(key, scalar(&value, default));
    }
    Ok(())
}

/// Reads an environment value as the type of its key's default: an integer or boolean key
/// takes the number or `true`/`false` it spells, everything else (strings, durations,
/// addresses, and values that do not parse, so the decoder can name the key) stays a string.
/// So `WHARF_STORE__SCHEMA=2024` is the schema named "2024".
fn scalar(value: &str, default: Option<&toml::Value>) -> toml::Value {
    match default {
        Some(toml::Value::Integer(_)) => value.parse::<i64>().map_or_else(
            |_| toml::Value::String(value.to_owned()),
            toml::Value::Integer,
        ),
        Some(toml::Value::Boolean(_)) => match value {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => toml::Value::String(value.to_owned()),
        },
        _ => toml::Value::String(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn no_file_gives_the_embedded_defaults() {
        let config = Config::load(None, env(&[])).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.store.url, "sqlite://wharf.db");
        assert_eq!(config.http.listen.to_string(), "127.0.0.1:8080");
    }

    #[test]
    fn environment_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(
            &path,
            "[store]\nurl = \"sqlite://a.db\"\nmax_connections = 3\n",
        )
        .unwrap();
        let config = Config::load(
            Some(&path),
            env(&[
                ("WHARF_STORE__URL", "postgres://x@127.0.0.1/test"),
                ("WHARF_DECLARATIONS__INSTANCE_TTL", "1m"),
                ("WHARF_STORE__AUTO_MIGRATE", "false"),
                ("UNRELATED", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(config.store.url, "postgres://x@127.0.0.1/test");
        assert_eq!(config.store.max_connections, 3);
        assert!(!config.store.auto_migrate);
        assert_eq!(config.declarations.instance_ttl, Duration::from_secs(60));
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = Config::load(None, env(&[("WHARF_STORE__URLL", "x")])).unwrap_err();
        assert!(err.to_string().contains("urll"), "{err}");
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let err = Config::load(None, env(&[("WHARF_HTTP__LISTEN", "not-an-address")])).unwrap_err();
        assert!(err.to_string().contains("http.listen"), "{err}");
        let err =
            Config::load(None, env(&[("WHARF_DECLARATIONS__INSTANCE_TTL", "1s")])).unwrap_err();
        assert!(err.to_string().contains("instance_ttl"), "{err}");
        let err = Config::load(None, env(&[("WHARF_STORE__URL", "mysql://x")])).unwrap_err();
        assert!(err.to_string().contains("store.url"), "{err}");
    }

    #[test]
    fn a_heartbeat_interval_too_close_to_the_ttl_names_both_values() {
        let err = Config::load(
            None,
            env(&[
                ("WHARF_DECLARATIONS__HEARTBEAT_INTERVAL", "10s"),
                ("WHARF_DECLARATIONS__INSTANCE_TTL", "15s"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("declarations.instance_ttl (15s)")
                && err.contains("declarations.heartbeat_interval (10s)"),
            "{err}"
        );
    }

    #[test]
    fn numeric_looking_strings_stay_strings_for_string_keys() {
        let config = Config::load(None, env(&[("WHARF_STORE__SCHEMA", "2024")])).unwrap();
        assert_eq!(config.store.schema, "2024");
        let config = Config::load(None, env(&[("WHARF_STORE__MAX_CONNECTIONS", "7")])).unwrap();
        assert_eq!(config.store.max_connections, 7);
    }

    #[test]
    fn unknown_wharf_variables_are_refused_by_name() {
        let err = Config::load(None, env(&[("WHARF_FOO", "1")])).unwrap_err();
        assert!(err.to_string().contains("WHARF_FOO"), "{err}");
        for name in [
            "WHARF_CONFIG",
            "WHARF_TEST_PG_URL",
            "WHARF_REQUIRE_SERVICES",
        ] {
            Config::load(None, env(&[(name, "x")])).unwrap();
        }
    }

    #[test]
    fn bounds_name_the_key_and_the_value() {
        for (name, value, expected) in [
            ("WHARF_STORE__MAX_CONNECTIONS", "0", "store.max_connections"),
            ("WHARF_STORE__MAX_CONNECTIONS", "5000", "between 1 and 1000"),
            (
                "WHARF_STORE__SCHEMA",
                "bad-name",
                "store.schema \"bad-name\"",
            ),
            ("WHARF_PRUNE__RETENTION", "101years", "prune.retention"),
            ("WHARF_QUEUE__RETENTION", "101years", "queue.retention"),
            ("WHARF_HTTP__IDLE_TIMEOUT", "0s", "http.idle_timeout"),
            (
                "WHARF_HTTP__HEADER_READ_TIMEOUT",
                "2h",
                "http.header_read_timeout",
            ),
            ("WHARF_HTTP__MAX_BODY_BYTES", "0", "http.max_body_bytes"),
            ("WHARF_HTTP__MAX_CONNECTIONS", "0", "http.max_connections"),
            (
                "WHARF_HTTP__MAX_CONCURRENT_REQUESTS",
                "0",
                "http.max_concurrent_requests",
            ),
            ("WHARF_HTTP__METRICS_TIMEOUT", "0s", "http.metrics_timeout"),
            (
                "WHARF_HTTP__METRICS_TIMEOUT",
                "40s",
                "http.metrics_timeout (40s) must be below http.request_timeout (30s)",
            ),
        ] {
            let err = Config::load(None, env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(expected), "{name}={value}: {err}");
            assert!(
                !err.to_string().contains("store url"),
                "{name}={value}: {err}"
            );
        }
        assert!(parse_retention("99999999999years").is_err());
        assert!(parse_retention("forever").unwrap_err().contains("7d"));
        assert_eq!(parse_retention("7d"), Ok(Duration::from_secs(7 * 86_400)));
    }

    #[test]
    fn http_defaults_match_the_api_layer() {
        assert_eq!(
            HttpConfig::default().limits(),
            wharf_api::HttpLimits::default()
        );
    }

    #[test]
    fn store_calls_of_a_consumer_get_a_third_of_the_ttl() {
        let defaults = DeclarationConfig::default();
        assert_eq!(defaults.call_deadline(), Duration::from_secs(10));
        let broken = DeclarationConfig {
            instance_ttl: Duration::ZERO,
            ..defaults
        };
        assert_eq!(broken.call_deadline(), Duration::from_millis(1));
    }

    #[test]
    fn queue_defaults_match_the_queue_layer() {
        let queue = Config::load(None, env(&[])).unwrap().queue;
        assert_eq!(queue.settings(), wharf_queue::QueueSettings::default());
        assert_eq!(queue.claim_batch, 32);
        assert_eq!(queue.poll_interval, Duration::from_millis(200));
        assert_eq!(queue.concurrency, 8);
        assert_eq!(queue.drain_timeout, Duration::from_secs(30));
        assert_eq!(queue.retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(queue.retention_batch, 5000);
    }

    #[test]
    fn queue_keys_take_humantime_and_integers_from_the_environment() {
        let config = Config::load(
            None,
            env(&[
                ("WHARF_QUEUE__VISIBILITY_TIMEOUT", "2m"),
                ("WHARF_QUEUE__POLL_INTERVAL", "50ms"),
                ("WHARF_QUEUE__CLAIM_BATCH", "64"),
                ("WHARF_QUEUE__MAX_ATTEMPTS", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(config.queue.visibility_timeout, Duration::from_secs(120));
        assert_eq!(config.queue.poll_interval, Duration::from_millis(50));
        assert_eq!(config.queue.claim_batch, 64);
        assert_eq!(config.queue.settings().max_attempts, 1);
    }

    #[test]
    fn unusable_queue_values_name_their_key() {
        for (name, value, key) in [
            ("WHARF_QUEUE__MAX_ATTEMPTS", "0", "queue.max_attempts"),
            ("WHARF_QUEUE__CONCURRENCY", "0", "queue.concurrency"),
            ("WHARF_QUEUE__CLAIM_BATCH", "0", "queue.claim_batch"),
            ("WHARF_QUEUE__ROUTE_BATCH", "-1", "queue.route_batch"),
            ("WHARF_QUEUE__RETENTION_BATCH", "0", "queue.retention_batch"),
            (
                "WHARF_QUEUE__VISIBILITY_TIMEOUT",
                "0s",
                "queue.visibility_timeout",
            ),
            ("WHARF_QUEUE__POLL_INTERVAL", "0s", "queue.poll_interval"),
            ("WHARF_QUEUE__RETENTION", "0s", "queue.retention"),
            ("WHARF_QUEUE__BACKOFF_BASE", "10m", "queue.backoff_max"),
        ] {
            let err = Config::load(None, env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{name}={value}: {err}");
        }
        let err = Config::load(None, env(&[("WHARF_QUEUE__CONCURRENCY", "many")])).unwrap_err();
        assert!(err.to_string().contains("queue.concurrency"), "{err}");
        let err = Config::load(None, env(&[("WHARF_QUEUE__DRAIN_TIMEOUT", "soon")])).unwrap_err();
        assert!(err.to_string().contains("queue.drain_timeout"), "{err}");
    }

    #[test]
    fn the_default_document_loads_back_to_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("default.toml");
        std::fs::write(&path, Config::default_toml()).unwrap();
        assert_eq!(
            Config::load(Some(&path), env(&[])).unwrap(),
            Config::default()
        );
    }
}
