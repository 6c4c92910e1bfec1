//! Environment overrides: `WHARF_<SECTION>__<KEY>` values as a table of overrides, each read as
//! its key's type (the layers are merged in `layers.rs`).

use super::Config;
use crate::error::ServerError;

/// The prefix of environment overrides: `WHARF_STORE__URL`, `WHARF_HTTP__LISTEN`, ...
pub const ENV_PREFIX: &str = "WHARF_";

/// `WHARF_` variables that are not configuration keys and are left alone: the file
/// (`WHARF_CONFIG`, read by the command line) and the test harness's own.
const ENV_NOT_CONFIG: &[&str] = &["WHARF_CONFIG", "WHARF_REQUIRE_SERVICES"];
const ENV_NOT_CONFIG_PREFIXES: &[&str] = &["WHARF_TEST_", "WHARF_BENCH_"];
/// The `WHARF_<SECTION>__<KEY>` variables of `env` as a table of overrides, each value read as
/// its key's type; an unknown `WHARF_` variable (no `__`, and not one of the harness's or the
/// file's own) is refused by name.
pub(super) fn env_overrides(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<toml::Table, ServerError> {
    let mut table = toml::Table::new();
    let defaults = defaults();
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
            return Err(ServerError::Config(format!(
                "unknown environment variable {name}: configuration variables are named \
                 WHARF_<SECTION>__<KEY> (e.g. WHARF_STORE__URL), and WHARF_CONFIG names the file"
            )));
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        insert_typed(&mut table, &defaults, &section, &key, &value)
            .map_err(|e| ServerError::Config(format!("{name}: {e}")))?;
    }
    Ok(table)
}

/// The defaults as a table, to read each override as its key's type.
pub(super) fn defaults() -> toml::Table {
    toml::Table::try_from(Config::default()).unwrap_or_default()
}

/// Sets `section.key` in `table` to `value` read as the type of the key's default in
/// `defaults`.
pub(super) fn insert_typed(
    table: &mut toml::Table,
    defaults: &toml::Table,
    section: &str,
    key: &str,
    value: &str,
) -> Result<(), String> {
    let default = defaults
        .get(section)
        .and_then(|s| s.as_table())
        .and_then(|s| s.get(key));
    let entry = table
        .entry(section.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(section_table) = entry else {
        return Err(format!("[{section}] is not a table"));
    };
    section_table.insert(key.to_owned(), scalar(value, default));
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
