//! No panic from input: property-based fuzzing at every boundary that parses what a user types
//! (issue 11, item 2). Each property runs a bounded number of cases (`PROPTEST_CASES`, default
//! below), so it is part of the ordinary test run with a known cost.
//!
//! Inputs mix arbitrary Unicode (control characters, NUL, surrogate-free astral planes), the
//! characters the grammars care about (`/ + # $ : @ = , [ ] "`), and very long strings. Every
//! parser must return `Ok` or a clear error naming its field; an `Ok` must round-trip to the
//! exact input where the type promises it (filters and names keep their bytes).

use proptest::prelude::*;
use wharf::config::parse_retention;
use wharf::domain::session::{CanonicalBroker, ExactFilter};
use wharf::domain::{BindingSet, GroupName, Subject, TopicFilter, TopicName};
use wharf::store::StoreLocation;
use wharf_server::config::Config;
use wharf_sessions::parse_seed_spec;

const CASES: u32 = 2_000;

/// Strings biased towards the grammars' special characters, with some very long ones.
fn input() -> impl Strategy<Value = String> {
    let special = prop::sample::select(vec![
        "/",
        "+",
        "#",
        "$",
        ":",
        "@",
        "=",
        ",",
        "[",
        "]",
        "\"",
        "'",
        "\\",
        "\0",
        "\n",
        " ",
        "%",
        "$share/",
        "sqlite://",
        "postgres://",
        "mqtt://",
        "mqtts://",
        "..",
        "é",
        "\u{1F600}",
        "\u{7f}",
        "\u{200b}",
    ]);
    let piece = prop_oneof![
        4 => special.prop_map(str::to_owned),
        3 => "[a-z0-9]{1,8}",
        2 => any::<String>(),
    ];
    prop_oneof![
        20 => prop::collection::vec(piece, 0..12).prop_map(|parts| parts.concat()),
        1 => (1usize..70_000).prop_map(|n| "a/".repeat(n / 2)),
    ]
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn names_filters_and_subjects_never_panic(text in input()) {
        if let Ok(name) = GroupName::parse("group", &text) {
            prop_assert_eq!(name.as_str(), text.as_str());
        }
        if let Ok(name) = TopicName::parse("topic", &text) {
            prop_assert_eq!(name.as_str(), text.as_str());
        }
        if let Ok(filter) = TopicFilter::parse("pattern", &text) {
            prop_assert_eq!(filter.as_str(), text.as_str());
        }
        if let Ok(subject) = Subject::parse("subject", &text) {
            prop_assert_eq!(subject.as_str(), text.as_str());
        }
        if let Ok(filter) = ExactFilter::parse(&text) {
            prop_assert_eq!(filter.as_str(), text.as_str());
            // Matching any topic is total too.
            let _ = filter.matches(&text);
        }
        let _ = BindingSet::parse(&[text.as_str(), "a/#"]);
    }

    #[test]
    fn store_urls_broker_urls_and_seed_specs_never_panic(text in input()) {
        let _ = StoreLocation::parse(&text);
        if let Err(e) = CanonicalBroker::parse("brokers", &text) {
            // A refused URL never echoes a password given in it.
            if let Some((_, rest)) = text.split_once("://") {
                // The authority ends at the first '/', '?' or '#' (RFC 3986).
                let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
                if let Some((userinfo, _)) = authority.rsplit_once('@') {
                    if let Some((_, password)) = userinfo.split_once(':') {
                        if password.len() > 3 {
                            prop_assert!(!e.to_string().contains(password), "{e}");
                        }
                    }
                }
            }
        }
        let _ = parse_seed_spec(&text);
        let _ = parse_retention(&text);
    }

    #[test]
    fn configuration_files_and_variables_never_panic(
        key in prop::sample::select(vec![
            "store.url", "store.schema", "store.max_connections", "declarations.instance_ttl",
            "http.listen", "http.max_body_bytes", "prune.retention", "queue.concurrency",
            "queue.retention", "log.filter", "mqtt.unmatched_grace", "mqtt.ingest_batch", "mqtt.ingest_batch_bytes",
            "nope.key", "store.nope",
        ]),
        value in input(),
        quoted in any::<bool>(),
    ) {
        let (section, field) = key.split_once('.').unwrap_or(("store", "url"));
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let literal = if quoted { format!("\"{escaped}\"") } else { value.clone() };
        let text = format!("[{section}]\n{field} = {literal}\n");
        let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let _ = Config::load(Some(&path), std::iter::empty());
        let variable = format!(
            "WHARF_{}__{}",
            section.to_ascii_uppercase(),
            field.to_ascii_uppercase()
        );
        let _ = Config::load(None, [(variable, value)]);
    }

    #[test]
    fn mqtt_session_sections_never_panic(
        broker in input(),
        client in input(),
        filter in input(),
        qos in any::<u8>(),
        topic in input(),
        mode in prop::sample::select(vec!["ephemeral", "persistent", "exclusive", "x"]),
    ) {
        let quote = |s: &str| {
            format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
        };
        let text = format!(
            "[mqtt.sessions.s]\nbrokers = [{}]\nclient_id = {}\nmode = {}\n\
             subscriptions = [{{ filter = {}, qos = {qos}, topic = {} }}]\n",
            quote(&broker), quote(&client), quote(mode), quote(&filter), quote(&topic)
        );
        let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let path = dir.path().join("wharf.toml");
        std::fs::write(&path, text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Ok(config) = Config::load(Some(&path), std::iter::empty()) {
            let sessions = config.mqtt.resolve();
            prop_assert!(sessions.is_ok(), "a loaded config resolves: {:?}", sessions.err());
        }
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn api_query_parameters_never_panic(
        pairs in prop::collection::vec(
            (
                prop::sample::select(vec![
                    "since", "until", "declarer", "after", "limit", "x", "LIMIT", "",
                ])
                .prop_map(str::to_owned),
                input(),
            ),
            0..4,
        ),
    ) {
        let group = GroupName::parse("group", "g").map_err(|e| TestCaseError::fail(e.to_string()))?;
        let _ = wharf_api::params::history_query(group, &pairs);
        let _ = wharf_api::params::dead_letter_query(&pairs);
        let _ = wharf_api::params::swaps_limit(&pairs);
    }
}
