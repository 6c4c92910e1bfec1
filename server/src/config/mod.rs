//! Typed configuration: a TOML file, then `WHARF_<SECTION>__<KEY>` environment overrides.
//!
//! Every key has a default, so no file is needed for the embedded SQLite default. Unknown keys
//! are refused by name, so a typo never silently falls back to a default.

use std::path::Path;

use serde::{Deserialize, Serialize};

use wharf::config::{check_retention, DeclarationConfig, QueueConfig, Settings, StoreConfig};
use wharf_sessions::SessionsSettings;

use crate::error::ServerError;

mod env;
mod http;
mod layers;
mod log;
mod prune;

use env::env_overrides;
pub use env::ENV_PREFIX;
pub use http::HttpConfig;
use layers::Layer;
pub use prune::PruneConfig;
pub use wharf::config::{parse_retention, MAX_RETENTION, RETENTION_FORMAT};
pub use wharf_sessions::config::{
    ClientIdSuffix, LeaseConfig, MqttConfig, ReloadStrategy, ResolvedSession, SessionConfig,
    SubscriptionConfig, TlsFiles,
};

pub use log::{parse_filter, LogConfig, LogFormat, FILTER_FORMAT};

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
    /// The HA lease of exclusive MQTT sessions.
    pub lease: LeaseConfig,
}

impl Config {
    /// Loads `path` (when given) and applies environment overrides from `env`.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ServerError> {
        Self::load_layers(path, env, &[])
    }

    /// Loads the layers in order, later ones winning key by key: the defaults, `path` (when
    /// given), the `WHARF_<SECTION>__<KEY>` overrides in `env`, then `flags` (dotted keys such
    /// as `store.url`, from the command line). Validates the result.
    pub fn load_layers(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &[(&str, String)],
    ) -> Result<Self, ServerError> {
        let mut layers = Vec::new();
        if let Some(path) = path {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ServerError::Config(format!("cannot read {}: {e}", path.display())))?;
            let table = text.parse::<toml::Table>().map_err(|e| {
                ServerError::Config(format!("{} is not valid TOML: {e}", path.display()))
            })?;
            layers.push(Layer::new(path.display().to_string(), table));
        }
        layers.push(Layer::new(
            "WHARF_ environment variables",
            env_overrides(env)?,
        ));
        if !flags.is_empty() {
            layers.push(Layer::of_keys("command-line flags", flags)?);
        }
        let config = layers::extract(layers)?;
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

    /// The sections an embedded Wharf reads ([`wharf::Wharf::open`]).
    pub fn settings(&self) -> Settings {
        Settings {
            store: self.store.clone(),
            declarations: self.declarations.clone(),
            queue: self.queue.clone(),
        }
    }

    /// What starting this process's MQTT sessions reads: the `mqtt` and `lease` sections, a
    /// third of `declarations.instance_ttl` as every ledger call's deadline, and this process's
    /// declarer identity as the lease holders' name.
    pub fn sessions_settings(&self) -> SessionsSettings {
        SessionsSettings {
            mqtt: self.mqtt.clone(),
            lease: self.lease,
            store_deadline: self.declarations.call_deadline(),
            process: wharf::declarer::process_declarer(),
        }
    }

    fn validate(&self) -> Result<(), ServerError> {
        self.declarations.validate()?;
        check_retention("prune.retention", self.prune.retention)?;
        self.store.validate()?;
        self.http.validate()?;
        if self.prune.batch < 1 {
            return Err(ServerError::Config(format!(
                "prune.batch must be at least 1, got {}",
                self.prune.batch
            )));
        }
        self.queue.validate()?;
        self.log.validate()?;
        self.mqtt.validate()?;
        self.lease.timing()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
    fn layers_merge_key_by_key_defaults_file_environment_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(
            &path,
            "[store]\nurl = \"sqlite://file.db\"\nmax_connections = 3\n\n\
             [queue]\nconcurrency = 7\n",
        )
        .unwrap();
        let flags = [("store.url", "sqlite://flag.db".to_owned())];
        let config = Config::load_layers(
            Some(&path),
            env(&[
                ("WHARF_STORE__URL", "sqlite://env.db"),
                ("WHARF_STORE__MAX_CONNECTIONS", "5"),
            ]),
            &flags,
        )
        .unwrap();
        assert_eq!(config.store.url, "sqlite://flag.db", "flags win");
        assert_eq!(
            config.store.max_connections, 5,
            "the environment beats the file"
        );
        assert_eq!(config.queue.concurrency, 7, "the file beats the defaults");
        assert_eq!(
            config.http,
            HttpConfig::default(),
            "untouched sections keep their defaults"
        );
    }

    #[test]
    fn an_error_names_the_key_and_the_layer_it_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, "[queue]\nconcurrency = \"many\"\n").unwrap();
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("queue.concurrency") && err.contains("wharf.toml"),
            "{err}"
        );
        let err = Config::load(None, env(&[("WHARF_QUEUE__CONCURRENCY", "many")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("queue.concurrency") && err.contains("environment"),
            "{err}"
        );
        let flags = [("store.max_connections", "lots".to_owned())];
        let err = Config::load_layers(None, env(&[]), &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("store.max_connections") && err.contains("command-line flags"),
            "{err}"
        );
        let bad = [("nosection", "x".to_owned())];
        let err = Config::load_layers(None, env(&[]), &bad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nosection") && err.contains("SECTION.KEY"),
            "{err}"
        );
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
            (
                "WHARF_HTTP__MAX_CONCURRENT_READS",
                "0",
                "http.max_concurrent_reads",
            ),
            ("WHARF_HTTP__METRICS_TIMEOUT", "0s", "http.metrics_timeout"),
            ("WHARF_MQTT__DRAIN_TIMEOUT", "0s", "mqtt.drain_timeout"),
            (
                "WHARF_MQTT__INGEST_BATCH_BYTES",
                "512",
                "mqtt.ingest_batch_bytes must be between 1024 and 1073741824, got 512",
            ),
            ("WHARF_MQTT__RELOAD_WINDOW", "2h", "mqtt.reload_window"),
            (
                "WHARF_MQTT__RELOAD_POLL_INTERVAL",
                "5ms",
                "mqtt.reload_poll_interval must be 0s (no polling) or at least 10ms, got 5ms",
            ),
            (
                "WHARF_MQTT__RELOAD_STRATEGY",
                "sometimes",
                "reload_strategy",
            ),
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
