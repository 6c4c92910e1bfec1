//! Declarer identities: the process's (`hostname:pid:random`, computed once per process) and
//! each consumer instance's (the process's plus `/N`, one number per `consume`).
//!
//! Containers often run as pid 1 under cloned hostnames, so the random part is what makes two
//! processes distinct. Every `consume`/`consume_with` is its own instance with its own identity
//! and heartbeat row, so two consumers of one group in one process behave exactly like two
//! processes (ADR 0015): the registering declarer's own row never counts as a live incumbent,
//! and one consumer's `leave` removes only its own row. `register`, which records no heartbeat,
//! keeps the process identity. The identity is for display and audit only; nothing decides by
//! its content.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rand::Rng;
use wharf_domain::DeclarerId;

static IDENTITY: OnceLock<DeclarerId> = OnceLock::new();
static PROCESS_INSTANCES: OnceLock<Arc<AtomicU64>> = OnceLock::new();

/// The longest declarer identity the domain accepts, in bytes.
const MAX_DECLARER_BYTES: usize = 255;

/// The process's declarer identity.
pub fn process_declarer() -> DeclarerId {
    IDENTITY.get_or_init(compute).clone()
}

/// The counter that numbers the consumer instances of the process identity. Shared by every
/// `Wharf` of the process, so two `Wharf`s opened in one process never hand out one identity
/// twice.
pub(crate) fn process_instances() -> Arc<AtomicU64> {
    PROCESS_INSTANCES.get_or_init(Arc::default).clone()
}

/// Numbers consumer instances of one declarer identity: `base/1`, `base/2`, ...
#[derive(Debug, Clone)]
pub(crate) struct InstanceCounter {
    base: DeclarerId,
    next: Arc<AtomicU64>,
}

impl InstanceCounter {
    /// Instances of `base`, numbered by `next` (shared by everything acting as `base`).
    pub(crate) fn new(base: DeclarerId, next: Arc<AtomicU64>) -> Self {
        Self { base, next }
    }

    /// A fresh instance identity.
    pub(crate) fn next(&self) -> DeclarerId {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        instance_declarer(&self.base, n)
    }
}

/// `base/n`, with `base` shortened (at a character boundary) if the whole would not fit the
/// declarer length limit.
pub fn instance_declarer(base: &DeclarerId, n: u64) -> DeclarerId {
    let suffix = format!("/{n}");
    let room = MAX_DECLARER_BYTES - suffix.len();
    let mut base = base.as_str();
    if base.len() > room {
        let mut cut = room;
        while !base.is_char_boundary(cut) {
            cut -= 1;
        }
        base = &base[..cut];
    }
    DeclarerId::parse("declarer", &format!("{base}{suffix}"))
        .expect("a valid declarer id with a numeric suffix, within the length limit, is valid")
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

    #[test]
    fn each_instance_gets_its_own_identity_derived_from_the_base() {
        let base = DeclarerId::parse("declarer", "web-1:4242:9f3a1c2e").unwrap();
        let counter = InstanceCounter::new(base.clone(), Arc::default());
        let (one, two) = (counter.next(), counter.next());
        assert_eq!(one.as_str(), "web-1:4242:9f3a1c2e/1");
        assert_eq!(two.as_str(), "web-1:4242:9f3a1c2e/2");
        // Clones share the numbering: they act as the same process.
        assert_eq!(counter.clone().next().as_str(), "web-1:4242:9f3a1c2e/3");
        assert_ne!(one, base);
    }

    #[test]
    fn the_process_counter_is_shared_by_every_wharf_of_the_process() {
        let a = InstanceCounter::new(process_declarer(), process_instances());
        let b = InstanceCounter::new(process_declarer(), process_instances());
        assert_ne!(a.next(), b.next());
    }

    #[test]
    fn a_long_base_is_shortened_to_fit_the_limit() {
        let base = DeclarerId::parse("declarer", &"é".repeat(127)).unwrap();
        let id = instance_declarer(&base, 12345);
        assert!(id.as_str().len() <= MAX_DECLARER_BYTES);
        assert!(id.as_str().ends_with("/12345"));
    }
}
