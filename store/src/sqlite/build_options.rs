//! How the SQLite library linked into this process was compiled, and what that means for
//! concurrent readers (ADR 0057).
//!
//! `PRAGMA compile_options` lists the options SQLite was built with. One of them,
//! `ENABLE_MEMORY_MANAGEMENT` (on in rusqlite's bundled build unless `LIBSQLITE3_FLAGS`
//! removes it), makes every connection share one page cache behind one process-wide mutex:
//! readers on several threads queue on it, which doubled the listing's latency at 8
//! connections. The store warns once per process when it finds it.

use std::sync::Once;

use rusqlite::Connection;

use crate::error::StoreError;

/// The compile option that puts every connection's pages behind one mutex.
pub const SHARED_PAGE_CACHE_OPTION: &str = "ENABLE_MEMORY_MANAGEMENT";

/// The options SQLite was compiled with, as `PRAGMA compile_options` names them.
pub fn compile_options(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut statement = conn.prepare("PRAGMA compile_options")?;
    let options = statement.query_map([], |row| row.get::<_, String>(0))?;
    Ok(options.collect::<Result<Vec<_>, _>>()?)
}

/// Why `options` make concurrent readers slow, if they do.
pub fn reader_contention(options: &[String]) -> Option<String> {
    options
        .iter()
        .any(|option| option == SHARED_PAGE_CACHE_OPTION)
        .then(|| {
            format!(
                "SQLite was compiled with SQLITE_{SHARED_PAGE_CACHE_OPTION}: every connection \
                 shares one page cache behind one mutex, so concurrent reads queue on it. \
                 Build with LIBSQLITE3_FLAGS=\"-USQLITE_{SHARED_PAGE_CACHE_OPTION} \
                 -DSQLITE_DEFAULT_MEMSTATUS=0\" (Wharf's .cargo/config.toml sets it)"
            )
        })
}

/// Warns, once per process, when the linked SQLite makes concurrent readers contend.
pub(super) fn warn_once_if_contended(conn: &Connection) {
    static CHECKED: Once = Once::new();
    CHECKED.call_once(|| match compile_options(conn) {
        Ok(options) => {
            if let Some(why) = reader_contention(&options) {
                tracing::warn!("{why}");
            }
        }
        Err(e) => tracing::debug!(error = %e, "could not read SQLite's compile options"),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(list: &[&str]) -> Vec<String> {
        list.iter().map(|o| (*o).to_owned()).collect()
    }

    #[test]
    fn the_shared_page_cache_is_named_with_its_fix() {
        let why = reader_contention(&options(&["THREADSAFE=1", "ENABLE_MEMORY_MANAGEMENT"]))
            .expect("the shared page cache is a contention");
        assert!(why.contains("SQLITE_ENABLE_MEMORY_MANAGEMENT"), "{why}");
        assert!(why.contains("LIBSQLITE3_FLAGS"), "{why}");
    }

    #[test]
    fn separate_page_caches_are_fine() {
        assert_eq!(
            reader_contention(&options(&["THREADSAFE=1", "DEFAULT_MEMSTATUS=0"])),
            None
        );
    }
}
