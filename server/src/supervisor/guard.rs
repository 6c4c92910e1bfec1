//! The prepare step's refusals, pure: what a reload may not change live.
//!
//! - **Restart-only sections.** Only the `mqtt` section is reloaded. Every other key (the
//!   store URL, `http.listen`, the consumers' settings, logging...) is read once at start; a
//!   reload that changes one is refused naming the key, so an operator never believes a
//!   change applied that did not.
//! - **The identity guard.** A persistent or exclusive session's durable identity (canonical
//!   broker without userinfo, effective client ID, mode, clean start, expiry) keys the ledger
//!   of the filters it may hold at the broker. A reload that changes or removes one, by
//!   session name, is refused before anything is stopped, whatever
//!   `mqtt.allow_destructive_reload` says: the old identity's filters would stay subscribed at
//!   the broker with nobody managing them. Credentials, TLS files, keep-alive, subscriptions
//!   and tuning are not identity and pass.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::{Config, ResolvedSession};

/// Where the operator's procedure for an identity change is written.
pub const CUTOVER_RUNBOOK: &str = "docs/runbooks/config-rollback.md";

/// The keys outside `mqtt` whose values differ between `running` and `next` (dotted paths,
/// sorted). Values are not shown: a store URL may hold a password.
pub fn restart_only_changes(running: &Config, next: &Config) -> Vec<String> {
    let (Ok(a), Ok(b)) = (toml::Value::try_from(running), toml::Value::try_from(next)) else {
        return vec!["(the configuration could not be compared)".to_owned()];
    };
    let mut changed = Vec::new();
    diff("", &strip_mqtt(a), &strip_mqtt(b), &mut changed);
    changed.sort();
    changed
}

fn strip_mqtt(value: toml::Value) -> toml::Value {
    match value {
        toml::Value::Table(mut table) => {
            table.remove("mqtt");
            toml::Value::Table(table)
        }
        other => other,
    }
}

fn diff(path: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    match (a, b) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff(&at, x, y, out),
                    _ => out.push(at),
                }
            }
        }
        (a, b) if a != b => out.push(path.to_owned()),
        _ => {}
    }
}

/// One durable session a reload would change or remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityChange {
    /// The session is no longer configured.
    Removed {
        /// The session's name.
        name: String,
        /// Its durable identity.
        id: String,
        /// The identity for people.
        describe: String,
    },
    /// The session is configured with another durable identity.
    Changed {
        /// The session's name.
        name: String,
        /// The running identity and its description.
        from: (String, String),
        /// The new identity and its description.
        to: (String, String),
        /// Which identity inputs differ (`brokers`, `client_id`, `mode`, `clean_start`,
        /// `session_expiry`).
        fields: Vec<&'static str>,
    },
}

impl fmt::Display for IdentityChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Removed { name, id, describe } => write!(
                f,
                "mqtt.sessions.{name} would be removed, but it is a durable session ({id}: \
                 {describe}) whose filters may remain subscribed at the broker"
            ),
            Self::Changed {
                name,
                from,
                to,
                fields,
            } => write!(
                f,
                "mqtt.sessions.{name} would change its durable identity ({} changed): {} ({}) \
                 -> {} ({})",
                fields.join(", "),
                from.0,
                from.1,
                to.0,
                to.1
            ),
        }
    }
}

/// The identity guard: every persistent or exclusive session of `running` must be in `next`
/// under the same name with the same durable identity. Sessions added, ephemeral sessions
/// changed or removed, and every non-identity change pass.
pub fn identity_changes(
    running: &[ResolvedSession],
    next: &[ResolvedSession],
) -> Vec<IdentityChange> {
    let next: BTreeMap<&str, &ResolvedSession> =
        next.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut changes = Vec::new();
    for old in running.iter().filter(|s| s.is_durable()) {
        match next.get(old.name.as_str()) {
            None => changes.push(IdentityChange::Removed {
                name: old.name.clone(),
                id: old.identity.id().to_owned(),
                describe: old.identity.describe(),
            }),
            Some(new) if new.identity.id() != old.identity.id() => {
                changes.push(IdentityChange::Changed {
                    name: old.name.clone(),
                    from: (old.identity.id().to_owned(), old.identity.describe()),
                    to: (new.identity.id().to_owned(), new.identity.describe()),
                    fields: changed_inputs(old, new),
                })
            }
            Some(_) => {}
        }
    }
    changes
}

fn changed_inputs(a: &ResolvedSession, b: &ResolvedSession) -> Vec<&'static str> {
    let (a, b) = (&a.identity, &b.identity);
    let mut fields = Vec::new();
    if a.broker() != b.broker() {
        fields.push("brokers");
    }
    if a.client_id() != b.client_id() {
        fields.push("client_id");
    }
    if a.mode() != b.mode() {
        fields.push("mode");
    }
    if a.clean_start() != b.clean_start() {
        fields.push("clean_start");
    }
    if a.session_expiry_secs() != b.session_expiry_secs() {
        fields.push("session_expiry");
    }
    fields
}

/// The refusal message for `changes`, naming each session and what to do instead.
pub fn identity_refusal(changes: &[IdentityChange], allow_destructive: bool) -> String {
    let list: Vec<String> = changes.iter().map(ToString::to_string).collect();
    let flag = if allow_destructive {
        " (mqtt.allow_destructive_reload = true does not bypass this guard)"
    } else {
        ""
    };
    format!(
        "identity guard: {}; a live reload never changes or removes a persistent or exclusive \
         session's durable identity{flag}: stop ingress, drain, unsubscribe the old identity's \
         filters exactly, then cut over with a restart ({CUTOVER_RUNBOOK})",
        list.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::SessionConfig;

    fn config(sessions: &[(&str, SessionConfig)]) -> Config {
        let mut config = Config::default();
        for (name, session) in sessions {
            config
                .mqtt
                .sessions
                .insert((*name).to_owned(), session.clone());
        }
        config
    }

    fn plant() -> SessionConfig {
        SessionConfig::new("mqtt://broker.example:1883", "wharf-plant")
    }

    fn changes(a: &Config, b: &Config) -> Vec<IdentityChange> {
        identity_changes(
            &a.mqtt.resolve().expect("valid"),
            &b.mqtt.resolve().expect("valid"),
        )
    }

    #[test]
    fn credentials_tls_and_tuning_pass_the_guard() {
        let old = config(&[("plant", plant())]);
        let mut rotated = plant();
        rotated.brokers = vec!["mqtt://user:new-secret@broker.example:1883".to_owned()];
        rotated.password = Some("new".to_owned());
        rotated.keep_alive = Duration::from_secs(10);
        let mut new = config(&[("plant", rotated)]);
        new.mqtt.ingest_batch = 7;
        new.mqtt.drain_timeout = Duration::from_secs(3);
        assert_eq!(changes(&old, &new), Vec::new());
        assert_eq!(restart_only_changes(&old, &new), Vec::<String>::new());
    }

    #[test]
    fn each_identity_input_is_named() {
        let old = config(&[("plant", plant())]);
        type Edit = fn(&mut SessionConfig);
        let cases: [(&str, Edit); 5] = [
            ("client_id", |s| s.client_id = "other".to_owned()),
            ("brokers", |s| {
                s.brokers = vec!["mqtt://elsewhere:1883".to_owned()]
            }),
            ("mode", |s| {
                s.mode = wharf_domain::session::SessionMode::Ephemeral;
                s.clean_start = Some(false);
            }),
            ("clean_start", |s| s.clean_start = Some(true)),
            ("session_expiry", |s| {
                s.session_expiry = Some(Duration::from_secs(60))
            }),
        ];
        for (field, change) in cases {
            let mut session = plant();
            change(&mut session);
            let found = changes(&old, &config(&[("plant", session)]));
            let [IdentityChange::Changed { fields, .. }] = found.as_slice() else {
                panic!("{field}: {found:?}");
            };
            assert!(fields.contains(&field), "{field}: {fields:?}");
            let text = identity_refusal(&found, true);
            assert!(text.contains("mqtt.sessions.plant"), "{text}");
            assert!(text.contains("does not bypass"), "{text}");
        }
    }

    #[test]
    fn removing_a_durable_session_is_refused_and_an_ephemeral_one_is_not() {
        let mut ephemeral = SessionConfig::new("mqtt://broker.example:1883", "eph");
        ephemeral.mode = wharf_domain::session::SessionMode::Ephemeral;
        let old = config(&[("plant", plant()), ("eph", ephemeral)]);
        let found = changes(&old, &config(&[]));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0]
            .to_string()
            .contains("mqtt.sessions.plant would be removed"));
        let added = config(&[
            ("plant", plant()),
            ("new", SessionConfig::new("mqtt://b", "n")),
        ]);
        assert_eq!(changes(&old, &added), Vec::new(), "adding a session passes");
    }

    #[test]
    fn restart_only_keys_are_named_without_their_values() {
        let old = Config::default();
        let mut new = Config::default();
        new.store.url = "postgres://u:pw@db/wharf".to_owned();
        new.http.listen = "127.0.0.1:9999".parse().expect("address");
        new.mqtt.ingest_batch = 3;
        assert_eq!(
            restart_only_changes(&old, &new),
            vec!["http.listen".to_owned(), "store.url".to_owned()]
        );
    }
}
