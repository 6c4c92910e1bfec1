//! The private Mosquitto of the MQTT benchmarks: the shared test harness's broker
//! (`wharf_tests::broker`: loopback, a free port, no persistence, killed on drop) with no cap on
//! an offline session's queue, so other processes' traffic on the shared broker does not enter
//! the figures. Both sides of every comparison use it. `WHARF_BENCH_MQTT_INFLIGHT` sets its
//! `max_inflight_messages` (Mosquitto's default: 20).

pub use wharf_tests::broker::Broker;
use wharf_tests::broker::BrokerConfig;

/// Starts the bench broker.
pub fn start() -> Broker {
    let inflight = std::env::var("WHARF_BENCH_MQTT_INFLIGHT")
        .map(|n| format!("max_inflight_messages {n}\n"))
        .unwrap_or_default();
    Broker::start(BrokerConfig {
        extra: format!("max_queued_messages 0\nmax_queued_bytes 0\n{inflight}"),
        ..BrokerConfig::default()
    })
}
