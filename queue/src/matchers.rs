//! A per-process cache of compiled binding matchers, keyed by the group and the install that
//! declared the set (its ledger position), so a swap is picked up by the next routing step and
//! the sets of earlier installs, which a routing step consults after a swap, are compiled once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wharf_domain::{BindingMatcher, BindingSet, GroupName};
use wharf_store::StoreError;

use crate::error::QueueError;

/// Compiled matchers are small; past this many the cache starts over rather than grow.
const CAPACITY: usize = 4096;

/// Compiled matchers by group and install.
#[derive(Default)]
pub(crate) struct Matchers {
    cache: Mutex<HashMap<(String, i64), Arc<BindingMatcher>>>,
}

impl Matchers {
    /// The cached matcher for `group`'s set installed at `install`, if compiled already.
    pub(crate) fn cached(&self, group: &GroupName, install: i64) -> Option<Arc<BindingMatcher>> {
        self.lock().get(&(group.to_string(), install)).cloned()
    }

    /// The matcher for `group`'s set installed at `install`, compiling `patterns` when it is
    /// not cached yet.
    pub(crate) fn get(
        &self,
        group: &GroupName,
        install: i64,
        patterns: impl Iterator<Item = String>,
    ) -> Result<Arc<BindingMatcher>, QueueError> {
        if let Some(matcher) = self.cached(group, install) {
            return Ok(matcher);
        }
        let patterns: Vec<String> = patterns.collect();
        let set = BindingSet::parse(&patterns).map_err(|e| StoreError::decode(install, e))?;
        let matcher = Arc::new(BindingMatcher::new(&set));
        let mut cache = self.lock();
        if cache.len() >= CAPACITY {
            cache.clear();
        }
        cache.insert((group.to_string(), install), matcher.clone());
        Ok(matcher)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i64), Arc<BindingMatcher>>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
