//! Typed configuration: a TOML file, then `WHARF_<SECTION>__<KEY>` environment overrides.
//!
//! Every key has a default, so no file is needed for the embedded SQLite default. Unknown keys
//! are refused by name, so a typo never silently falls back to a default.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::WharfError;

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
}

/// Where the ledger lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite://PATH` (the embedded default) or `postgres://...` (cluster mode).
    pub url: String,
    /// Postgres only: the schema Wharf's tables live in (created if missing). Empty = default.
    pub schema: String,
    /// Postgres only: the most connections this process holds.
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
    /// How often a consuming instance heartbeats.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// How old a heartbeat may be, by the store's clock, for its instance to count as live.
    #[serde(with = "humantime_serde")]
    pub instance_ttl: Duration,
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

/// The REST listing API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// The address `serve` listens on (loopback by default).
    pub listen: SocketAddr,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        }
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

/// The prefix of environment overrides: `WHARF_STORE__URL`, `WHARF_HTTP__LISTEN`, ...
pub const ENV_PREFIX: &str = "WHARF_";

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
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| WharfError::Config(e.message().to_owned()))?;
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
        if self.prune.batch < 1 {
            return Err(WharfError::Config(format!(
                "prune.batch must be at least 1, got {}",
                self.prune.batch
            )));
        }
        wharf_store::StoreLocation::parse(&self.store.url)
            .map_err(|e| WharfError::Config(format!("store.url: {e}")))?;
        Ok(())
    }
}

fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), WharfError> {
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let Some((section, key)) = rest.split_once("__") else {
            continue;
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(section_table) = entry else {
            return Err(WharfError::Config(format!(
                "{name}: [{section}] in the file is not a table"
            )));
        };
        section_table.insert(key, scalar(&value));
    }
    Ok(())
}

/// Reads an environment value as a TOML integer or boolean when it is one, else as a string.
fn scalar(value: &str) -> toml::Value {
    if let Ok(i) = value.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    match value {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
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
        assert!(
            err.to_string().contains("listen") || err.to_string().contains("address"),
            "{err}"
        );
        let err =
            Config::load(None, env(&[("WHARF_DECLARATIONS__INSTANCE_TTL", "1s")])).unwrap_err();
        assert!(err.to_string().contains("instance_ttl"), "{err}");
        let err = Config::load(None, env(&[("WHARF_STORE__URL", "mysql://x")])).unwrap_err();
        assert!(err.to_string().contains("store.url"), "{err}");
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
