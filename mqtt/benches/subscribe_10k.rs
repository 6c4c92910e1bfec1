//! Subscribing 10,000 distinct filters: our driver (batched SUBSCRIBEs, pipelined up to the
//! broker's Receive Maximum) against a bare `rumqttc::v5::AsyncClient` (one filter per
//! `subscribe` call, counting its SubAcks), same broker, same run, alternating rounds.
//!
//! `cargo bench -p wharf-mqtt --bench subscribe_10k`; `WHARF_MQTT_BENCH_PORT` (default 1883),
//! `WHARF_MQTT_BENCH_BATCH` (filters per SUBSCRIBE, default 100), `WHARF_MQTT_BENCH_ROUNDS`
//! (default 3).

use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::task::JoinSet;
use wharf_mqtt::{ConnectOptions, DisconnectReason, QoS, Session, SubscribeReason};

const FILTERS: usize = 10_000;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn filters(run: &str) -> Vec<String> {
    (0..FILTERS)
        .map(|i| format!("wharf-bench/{run}/{}/{i}/#", i % 97))
        .collect()
}

async fn ours(port: u16, filters: &[String], batch: usize) -> Duration {
    let mut options = ConnectOptions::new(
        "127.0.0.1",
        port,
        format!("bench-ours-{}", std::process::id()),
    );
    options.operation_timeout = Duration::from_secs(60);
    let (handle, _deliveries) = Session::connect(options).await.expect("connect ours");
    let started = Instant::now();
    let mut requests = JoinSet::new();
    for chunk in filters.chunks(batch) {
        let handle = handle.clone();
        let chunk: Vec<_> = chunk
            .iter()
            .map(|f| (f.clone(), QoS::AtLeastOnce))
            .collect();
        requests.spawn(async move { handle.subscribe(chunk, None).await });
    }
    let mut granted = 0;
    while let Some(result) = requests.join_next().await {
        let reasons = result.expect("task").expect("subscribe");
        granted += reasons
            .iter()
            .filter(|r| **r == SubscribeReason::Granted(QoS::AtLeastOnce))
            .count();
    }
    let elapsed = started.elapsed();
    assert_eq!(granted, filters.len(), "every filter granted");
    handle
        .disconnect(DisconnectReason::Normal)
        .await
        .expect("disconnect");
    elapsed
}

async fn theirs(port: u16, filters: &[String]) -> Duration {
    let mut options = MqttOptions::new(
        format!("bench-rumqttc-{}", std::process::id()),
        "127.0.0.1",
        port,
    );
    options.set_keep_alive(Duration::from_secs(30));
    options.set_clean_start(true);
    let (client, mut eventloop) = AsyncClient::new(options, 1024);
    loop {
        match eventloop.poll().await.expect("rumqttc connect") {
            Event::Incoming(Packet::ConnAck(_)) => break,
            _ => continue,
        }
    }
    let started = Instant::now();
    let expected = filters.len();
    let counter = tokio::spawn(async move {
        let mut subacks = 0;
        while subacks < expected {
            if let Event::Incoming(Packet::SubAck(_)) =
                eventloop.poll().await.expect("rumqttc poll")
            {
                subacks += 1;
            }
        }
        (started.elapsed(), eventloop)
    });
    for filter in filters {
        client
            .subscribe(filter.clone(), rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
            .await
            .expect("rumqttc subscribe");
    }
    let (elapsed, mut eventloop) = counter.await.expect("counter");
    client.disconnect().await.expect("rumqttc disconnect");
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while eventloop.poll().await.is_ok() {}
    })
    .await;
    elapsed
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let port = u16::try_from(env("WHARF_MQTT_BENCH_PORT", 1883)).expect("port");
    let batch = env("WHARF_MQTT_BENCH_BATCH", 100).max(1);
    let rounds = env("WHARF_MQTT_BENCH_ROUNDS", 3).max(1);
    let filters = filters(&format!("{}", std::process::id()));
    let (mut our_times, mut their_times) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let theirs = theirs(port, &filters).await;
        let ours = ours(port, &filters, batch).await;
        println!(
            "round {round}: rumqttc {:.1} ms, wharf-mqtt {:.1} ms",
            theirs.as_secs_f64() * 1e3,
            ours.as_secs_f64() * 1e3
        );
        their_times.push(theirs);
        our_times.push(ours);
    }
    let (ours, theirs) = (median(our_times), median(their_times));
    println!(
        "subscribe {FILTERS} filters (median of {rounds}): rumqttc AsyncClient {:.1} ms (one per call), wharf-mqtt {:.1} ms ({batch} per SUBSCRIBE); ratio ours/theirs {:.2} (goal <= 2.00)",
        theirs.as_secs_f64() * 1e3,
        ours.as_secs_f64() * 1e3,
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
}
