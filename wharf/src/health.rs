//! What this process runs, for deep health: every consumer a [`crate::Wharf`] started (and
//! its clones), its group, instance identity and state, read without touching the store.
//! A consumer leaves the list once its task ended (shut down, or its handle dropped).

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::consumer::{Consumer, ConsumerState};

/// One consumer of this process.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerHealth {
    /// Its group.
    pub group: String,
    /// Its instance identity (the name of its heartbeat row).
    pub declarer: String,
    /// Its state now.
    pub state: ConsumerState,
}

impl ConsumerHealth {
    /// The state's name: `declaring`, `waiting`, `consuming`, `stalled`, `failed`, `stopped`.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            ConsumerState::Declaring => "declaring",
            ConsumerState::Waiting { .. } => "waiting",
            ConsumerState::Consuming { .. } => "consuming",
            ConsumerState::Stalled { .. } => "stalled",
            ConsumerState::Failed { .. } => "failed",
            ConsumerState::Stopped => "stopped",
        }
    }

    /// Why it is stalled or failed.
    pub fn reason(&self) -> Option<&str> {
        match &self.state {
            ConsumerState::Stalled { reason } | ConsumerState::Failed { reason } => Some(reason),
            _ => None,
        }
    }
}

struct Entry {
    group: String,
    declarer: String,
    state: watch::Receiver<ConsumerState>,
}

/// The consumers started so far, shared by a `Wharf` and its clones.
#[derive(Clone, Default)]
pub(crate) struct Registry(Arc<Mutex<Vec<Entry>>>);

impl Registry {
    pub(crate) fn track(&self, group: &str, consumer: &Consumer) {
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| e.state.has_changed().is_ok());
        entries.push(Entry {
            group: group.to_owned(),
            declarer: consumer.declarer().to_string(),
            state: consumer.watch(),
        });
    }

    pub(crate) fn report(&self) -> Vec<ConsumerHealth> {
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| e.state.has_changed().is_ok());
        entries
            .iter()
            .map(|e| ConsumerHealth {
                group: e.group.clone(),
                declarer: e.declarer.clone(),
                state: e.state.borrow().clone(),
            })
            .collect()
    }
}
