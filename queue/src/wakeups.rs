//! Publish wake-ups: how an idle consumer learns that its topic has something new without
//! waiting out its poll interval.
//!
//! Each topic has a counter that every publish through this queue bumps after its commit;
//! consumers watch the counters of their topics. On Postgres every publish also sends
//! `NOTIFY wharf_publish, '<schema>:<topic>'` at commit, which the library's listener turns
//! into the same bump in other processes. A wake-up is only a hint: consumers keep polling
//! as a fallback, and a missed wake-up costs at most one poll interval.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// The Postgres channel publishes notify on.
pub const PUBLISH_CHANNEL: &str = "wharf_publish";

/// Per-topic publish counters.
#[derive(Debug, Default)]
pub struct Wakeups {
    topics: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Wakeups {
    /// A receiver that changes after every later publish to `topic`.
    pub fn subscribe(&self, topic: &str) -> watch::Receiver<u64> {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics
            .entry(topic.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Wakes the consumers of `topic`.
    pub fn wake(&self, topic: &str) {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counter) = topics.get(topic) {
            counter.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes the consumers of every topic (after wake-ups may have been missed).
    pub fn wake_all(&self) {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        for counter in topics.values() {
            counter.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}
