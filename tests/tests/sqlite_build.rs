//! ADR 0057: this workspace links a SQLite whose connections keep their own page caches
//! (`.cargo/config.toml` removes `SQLITE_ENABLE_MEMORY_MANAGEMENT` from rusqlite's bundled
//! build) and keep no memory statistics, read from `PRAGMA compile_options` of a real
//! connection: the test fails if that build setting is lost, and the store would then warn at
//! open.

use wharf::store::sqlite::build_options::{compile_options, reader_contention};

#[test]
fn sqlite_is_built_for_concurrent_readers() {
    let conn = rusqlite::Connection::open_in_memory().expect("an in-memory connection");
    let options = compile_options(&conn).expect("PRAGMA compile_options");
    assert_eq!(reader_contention(&options), None, "{options:?}");
    assert!(
        options.iter().any(|option| option == "DEFAULT_MEMSTATUS=0"),
        "memory statistics are off by default: {options:?}"
    );
}
