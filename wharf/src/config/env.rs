//! Environment overrides and decoding: `WHARF_<SECTION>__<KEY>` values merged into the file's
//! table, each read as its key's type, then decoded with the key named in any error.

use super::Config;
use crate::error::WharfError;

/// The prefix of environment overrides: `WHARF_STORE__URL`, `WHARF_HTTP__LISTEN`, ...
pub const ENV_PREFIX: &str = "WHARF_";

/// `WHARF_` variables that are not configuration keys and are left alone: the file
/// (`WHARF_CONFIG`, read by the command line) and the test harness's own.
const ENV_NOT_CONFIG: &[&str] = &["WHARF_CONFIG", "WHARF_REQUIRE_SERVICES"];
const ENV_NOT_CONFIG_PREFIXES: &[&str] = &["WHARF_TEST_", "WHARF_BENCH_"];
/// Deserializes the merged table through its TOML text, so a value of the wrong type can be
/// reported with its key (`queue.concurrency: invalid type ...`).
pub(super) fn decode(table: &toml::Table) -> Result<Config, WharfError> {
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

pub(super) fn apply_env(
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
