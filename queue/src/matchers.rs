//! A per-process cache of compiled binding matchers, keyed by the declaration that installed
//! the set (its ledger position), so a swap is picked up by the next routing step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wharf_domain::{BindingMatcher, BindingSet, GroupName};
use wharf_store::StoreError;

use crate::error::QueueError;

/// Compiled matchers by group.
#[derive(Default)]
pub(crate) struct Matchers {
    cache: Mutex<HashMap<String, (i64, Arc<BindingMatcher>)>>,
}

impl Matchers {
    /// The cached matcher for `group`'s set installed at `generation`, if compiled already.
    pub(crate) fn cached(&self, group: &GroupName, generation: i64) -> Option<Arc<BindingMatcher>> {
        let cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache
            .get(group.as_str())
            .filter(|(cached, _)| *cached == generation)
            .map(|(_, matcher)| matcher.clone())
    }

    /// The matcher for `group`'s set installed at `generation`, compiling `patterns` when the
    /// cached one is older.
    pub(crate) fn get(
        &self,
        group: &GroupName,
        generation: i64,
        patterns: impl Iterator<Item = String>,
    ) -> Result<Arc<BindingMatcher>, QueueError> {
        if let Some(matcher) = self.cached(group, generation) {
            return Ok(matcher);
        }
        let patterns: Vec<String> = patterns.collect();
        let set = BindingSet::parse(&patterns).map_err(|e| StoreError::decode(generation, e))?;
        let matcher = Arc::new(BindingMatcher::new(&set));
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(group.to_string(), (generation, matcher.clone()));
        Ok(matcher)
    }
}
