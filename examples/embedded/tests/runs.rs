//! The example application builds and runs: on a fresh SQLite file it handles exactly the
//! paid orders its group's bindings route to it, and a bad store URL fails naming the field.

use std::process::Command;

#[test]
fn the_example_handles_the_paid_orders_and_only_those() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("orders.db").display());
    let output = Command::new(env!("CARGO_BIN_EXE_orders-worker"))
        .arg(&url)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let handled: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("billing "))
        .collect();
    assert_eq!(handled.len(), 2, "{stdout}");
    assert!(
        handled.iter().any(|l| l.contains("orders/eu/paid")),
        "{stdout}"
    );
    assert!(
        handled.iter().any(|l| l.contains("orders/us/paid")),
        "{stdout}"
    );
    assert!(!stdout.contains("orders/eu/created"), "{stdout}");
    assert_eq!(
        stdout.lines().last(),
        Some("handled 2 paid orders"),
        "{stdout}"
    );
}

#[test]
fn a_bad_store_url_is_refused_by_name() {
    let output = Command::new(env!("CARGO_BIN_EXE_orders-worker"))
        .arg("mysql://nowhere/db")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("store.url") && stderr.contains("mysql"),
        "{stderr}"
    );
}
