//! The configuration's layers, merged by figment: the defaults, then the file, then the
//! `WHARF_<SECTION>__<KEY>` environment overrides, then the command line's flags; later layers
//! win key by key. The merged value is extracted into [`Config`] once, so every value is parsed
//! by its key's own type, and an error names the key and the layer it came from
//! (`queue.concurrency (from WHARF_ environment variables): invalid type ...`).
//!
//! The environment is not handed to figment's own `Env` provider: that one guesses a type from
//! the text (`WHARF_STORE__SCHEMA=2024` would become a number and be refused for a string key).
//! Each value is read as the type of its key's default instead (`env.rs`), and unknown `WHARF_`
//! variables are refused by name before anything merges.

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::Config;
use crate::error::ServerError;

/// One layer: a table of keys and where it came from.
pub(super) struct Layer {
    name: String,
    table: toml::Table,
}

impl Layer {
    /// A layer named `name` (for errors) holding `table`.
    pub(super) fn new(name: impl Into<String>, table: toml::Table) -> Self {
        Self {
            name: name.into(),
            table,
        }
    }

    /// A layer of dotted keys (`store.url`) and their values, as strings read like environment
    /// values (by the type of the key's default).
    pub(super) fn of_keys(name: &str, keys: &[(&str, String)]) -> Result<Self, ServerError> {
        let mut table = toml::Table::new();
        let defaults = super::env::defaults();
        for (key, value) in keys {
            let Some((section, field)) = key.split_once('.') else {
                return Err(ServerError::Config(format!(
                    "{name}: \"{key}\" is not a SECTION.KEY configuration key"
                )));
            };
            super::env::insert_typed(&mut table, &defaults, section, field, value)
                .map_err(|e| ServerError::Config(format!("{name}: {e}")))?;
        }
        Ok(Self::new(name, table))
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let dict = Value::serialize(&self.table)?
            .into_dict()
            .ok_or_else(|| figment::Error::from(format!("{} is not a table", self.name)))?;
        Ok(Profile::Default.collect(dict))
    }
}

/// Merges `layers` over the defaults and extracts the configuration.
pub(super) fn extract(layers: Vec<Layer>) -> Result<Config, ServerError> {
    let mut figment = Figment::from(figment::providers::Serialized::defaults(Config::default()));
    for layer in layers {
        figment = figment.merge(layer);
    }
    figment.extract::<Config>().map_err(describe)
}

/// The first error, as `key (from LAYER): what is wrong`.
fn describe(error: figment::Error) -> ServerError {
    let Some(first) = error.into_iter().next() else {
        return ServerError::Config("the configuration could not be read".to_owned());
    };
    let key = first.path.join(".");
    let source = first
        .metadata
        .as_ref()
        .map(|m| m.name.to_string())
        .filter(|name| !name.is_empty());
    let message = first.kind.to_string();
    ServerError::Config(match (key.is_empty(), source) {
        (true, Some(source)) => format!("{message} (in {source})"),
        (true, None) => message,
        (false, Some(source)) => format!("{key} (from {source}): {message}"),
        (false, None) => format!("{key}: {message}"),
    })
}
