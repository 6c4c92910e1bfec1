//! `orders-worker`: an application that embeds Wharf as a library.
//!
//! It opens the store its first argument names (`sqlite://orders.db` by default; a
//! `postgres://` URL for cluster mode), declares the `billing` group's bindings on the `orders`
//! topic (paid orders only), publishes a few orders, and handles what the group's set routes to
//! it until it has seen every paid one. It prints one line per message it handles and a last
//! line with the count, then leaves the group.
//!
//! ```text
//! cargo run -p wharf-example-embedded -- sqlite:///tmp/orders.db
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wharf::queue::{Claimed, Headers};
use wharf::{handler_fn, Registration, Settings, Wharf, WharfError};

/// The orders this example publishes: two are paid (and routed to `billing`), one is not.
const ORDERS: [&str; 3] = ["orders/eu/paid", "orders/eu/created", "orders/us/paid"];

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://orders.db".to_owned());
    match run(&url).await {
        Ok(handled) => {
            println!("handled {handled} paid orders");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("orders-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<usize, Failed> {
    let mut settings = Settings::default();
    settings.store.url = url.to_owned();
    settings.declarations.heartbeat_interval = Duration::from_millis(200);
    settings.declarations.retry_interval = Duration::from_millis(200);
    settings.declarations.instance_ttl = Duration::from_secs(2);
    settings.validate()?;
    let wharf = Wharf::open(&settings).await?;

    // Declare first: a group is routed what is published once it exists.
    let registration = Registration::new("billing", "orders", "1.0.0", &["orders/+/paid"])
        .map_err(WharfError::from)?;
    let outcome = wharf.register(&registration).await?;
    println!("declared billing: {outcome:?}");
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let consumer = wharf.consume_with(
        registration,
        handler_fn(move |message: Claimed| {
            let counter = counter.clone();
            async move {
                println!(
                    "billing {} (position {})",
                    message.subject, message.position
                );
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }),
    );

    let mut state = consumer.watch();
    let ready = tokio::time::timeout(Duration::from_secs(30), state.wait_for(|s| s.is_ready()));
    if !matches!(ready.await, Ok(Ok(_))) {
        consumer.shutdown().await;
        return Err(Failed(
            "the consumer did not become ready within 30 s".into(),
        ));
    }

    let batch = ORDERS
        .iter()
        .map(|subject| ((*subject).to_owned(), b"{}".to_vec(), Headers::new()))
        .collect();
    wharf.publish("orders", batch).await?;

    let paid = ORDERS.iter().filter(|s| s.ends_with("/paid")).count();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handled.load(Ordering::SeqCst) < paid && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consumer.shutdown().await;
    let handled = handled.load(Ordering::SeqCst);
    if handled < paid {
        return Err(Failed(format!(
            "handled {handled} of {paid} paid orders within 30 s"
        )));
    }
    Ok(handled)
}

/// Why the example failed: Wharf's error, or what it did not see happen.
#[derive(Debug)]
struct Failed(String);

impl From<WharfError> for Failed {
    fn from(e: WharfError) -> Self {
        Self(e.to_string())
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
