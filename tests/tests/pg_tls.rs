//! Connections to Postgres honour the URL's `sslmode` (ADR 0063): `require` encrypts (the
//! server reports the session as TLS), `disable` does not, and `verify-full` refuses a server
//! whose certificate no trusted root signed, failing the start rather than falling back to
//! plain text. The local server serves TLS with a self-signed certificate (Debian's default),
//! which the built-in roots do not trust.

use wharf::store::Store;
use wharf::{Config, Wharf};
use wharf_tests::{Backend, TestStore};

/// The test store's URL with `param` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

async fn session_is_tls(wharf: &Wharf) -> bool {
    let Store::Postgres(pg) = wharf.store() else {
        panic!("a Postgres store")
    };
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pg.pool())
        .await
        .expect("pg_stat_ssl answers")
}

fn config_with(ts: &TestStore, param: &str) -> Config {
    let mut config = ts.config();
    config.store.url = with_param(&config.store.url, param);
    config
}

/// Whether a Wharf opened on a fresh test store with `param` in its URL talks TLS.
async fn opens_encrypted(param: &str) -> bool {
    let ts = TestStore::new(Backend::Postgres).await;
    let wharf = Wharf::open(&config_with(&ts, param))
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
    let error = match Wharf::open(&config_with(&ts, "sslmode=verify-full")).await {
        Ok(_) => panic!("a self-signed server certificate must not be trusted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("invalid peer certificate"),
        "the error says why: {error}"
    );
}

/// The path of the certificate the server presents, as the server reports it.
async fn server_certificate(wharf: &Wharf) -> String {
    let Store::Postgres(pg) = wharf.store() else {
        panic!("a Postgres store")
    };
    let path: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(pg.pool())
        .await
        .expect("the server names its certificate");
    std::path::Path::new(&path)
        .canonicalize()
        .unwrap_or_else(|e| panic!("the server's certificate {path:?} is readable here: {e}"))
        .display()
        .to_string()
}

#[tokio::test]
async fn sslmode_verify_full_trusts_the_root_the_url_names() {
    let ts = TestStore::new(Backend::Postgres).await;
    let plain = Wharf::open(&ts.config()).await.expect("opens");
    let root = server_certificate(&plain).await;
    // The server's self-signed certificate is issued to `localhost`: verify-full checks the
    // name the URL dials against it.
    let mut config = ts.config();
    assert!(
        config.store.url.contains("127.0.0.1") || config.store.url.contains("localhost"),
        "this test needs the server on this host: {}",
        config.store.url
    );
    config.store.url = with_param(
        &config.store.url.replacen("127.0.0.1", "localhost", 1),
        &format!("sslmode=verify-full&sslrootcert={root}"),
    );
    let wharf = Wharf::open(&config)
        .await
        .expect("opens, verifying the server against the named root");
    assert!(session_is_tls(&wharf).await, "the session is encrypted");
}
