//! Connections to Postgres honour the URL's `sslmode` (ADR 0063): `require` encrypts (the
//! server reports the session as TLS), `disable` does not, and `verify-full` refuses a server
//! whose certificate no trusted root signed, failing the start rather than falling back to
//! plain text. The local server serves TLS with a self-signed certificate (Debian's default),
//! which the built-in roots do not trust.

use wharf::store::Store;
use wharf::Wharf;
use wharf_server::Config;
use wharf_tests::{with_url_param, Backend, TestStore};

/// One text value a statement returns on one of `store`'s connections.
async fn ask(store: &Store, statement: &str) -> String {
    let Store::Postgres(pg) = store else {
        panic!("a Postgres store")
    };
    sqlx::query_scalar(statement)
        .fetch_one(pg.pool())
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"))
}

async fn session_is_tls(wharf: &Wharf) -> bool {
    ask(
        wharf.store(),
        "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .await
        == "true"
}

fn config_with(ts: &TestStore, param: &str) -> Config {
    let mut config = ts.config();
    config.store.url = with_url_param(&config.store.url, param);
    config
}

/// Whether a Wharf opened on a fresh test store with `param` in its URL talks TLS.
async fn opens_encrypted(param: &str) -> bool {
    let ts = TestStore::new(Backend::Postgres).await;
    let wharf = Wharf::open(&config_with(&ts, param).settings())
        .await
        .unwrap_or_else(|e| panic!("opens with {param}: {e}"));
    session_is_tls(&wharf).await
}

#[tokio::test]
async fn sslmode_require_encrypts_the_connection() {
    assert!(
        opens_encrypted("sslmode=require").await,
        "the session is encrypted"
    );
}

#[tokio::test]
async fn sslmode_disable_connects_in_plain_text() {
    assert!(
        !opens_encrypted("sslmode=disable").await,
        "the session is plain text"
    );
}

#[tokio::test]
async fn sslmode_verify_full_refuses_an_untrusted_certificate() {
    let ts = TestStore::new(Backend::Postgres).await;
    let error = match Wharf::open(&config_with(&ts, "sslmode=verify-full").settings()).await {
        Ok(_) => panic!("a self-signed server certificate must not be trusted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("invalid peer certificate"),
        "the error says why: {error}"
    );
}

#[tokio::test]
async fn sslmode_verify_full_trusts_the_root_the_url_names() {
    let ts = TestStore::new(Backend::Postgres).await;
    // The certificate the server presents, as the server names it.
    let root = ask(&ts.store, "SHOW ssl_cert_file").await;
    // The server's self-signed certificate is issued to `localhost`: verify-full checks the
    // name the URL dials against it.
    let mut config = ts.config();
    assert!(
        config.store.url.contains("127.0.0.1") || config.store.url.contains("localhost"),
        "this test needs the server on this host: {}",
        config.store.url
    );
    config.store.url = with_url_param(
        &config.store.url.replacen("127.0.0.1", "localhost", 1),
        &format!("sslmode=verify-full&sslrootcert={root}"),
    );
    let wharf = Wharf::open(&config.settings())
        .await
        .expect("opens, verifying the server against the named root");
    assert!(session_is_tls(&wharf).await, "the session is encrypted");
}
