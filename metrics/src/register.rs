//! Creating and registering the families every area of this crate declares.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// Creates and registers a counter without labels (it shows 0 until counted). See
/// [`counter_vec`].
pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let counter = IntCounter::with_opts(Opts::new(name, help))
        .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
    registry
        .register(Box::new(counter.clone()))
        .unwrap_or_else(|e| panic!("metric {name} could not be registered: {e}"));
    counter
}

/// Creates and registers a counter vector. The names are this crate's constants, checked by
/// its tests, so a refusal is a programming error.
pub(crate) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let family = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
    registry
        .register(Box::new(family.clone()))
        .unwrap_or_else(|e| panic!("metric {name} could not be registered: {e}"));
    family
}
