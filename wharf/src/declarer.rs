//! This process's declarer identity: `hostname:pid:random`, computed once per process.
//!
//! Containers often run as pid 1 under cloned hostnames, so the random part is what makes two
//! processes distinct. The identity is for display and audit only; nothing decides by it.

use std::sync::OnceLock;

use rand::Rng;
use wharf_domain::DeclarerId;

static IDENTITY: OnceLock<DeclarerId> = OnceLock::new();

/// The process's declarer identity.
pub fn process_declarer() -> DeclarerId {
    IDENTITY.get_or_init(compute).clone()
}

fn compute() -> DeclarerId {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    let host: String = host.chars().filter(|c| !c.is_control()).take(200).collect();
    let random: u32 = rand::thread_rng().gen();
    let text = format!("{host}:{}:{random:08x}", std::process::id());
    DeclarerId::parse("declarer", &text).unwrap_or_else(|_| {
        DeclarerId::parse(
            "declarer",
            &format!("host:{}:{random:08x}", std::process::id()),
        )
        .expect("a plain ASCII declarer id is always valid")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_within_a_process_and_has_three_parts() {
        let first = process_declarer();
        assert_eq!(first, process_declarer());
        let parts: Vec<&str> = first.as_str().rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[0].len(), 8);
    }
}
