//! Expands the `-- include:` directives of the migration scripts (ADR 0073), so that the binary
//! embeds each script whole, as before, while each Postgres function has one source file.
//!
//! A directive is a line `-- include: functions/<name>.sql fnv1a64=<16 hex digits>`, the path
//! relative to the script's folder and the digits the FNV-1a hash of the file's bytes (line
//! ends as `\n`). The line stays in the expanded script (a comment), followed by the file. The
//! build fails when a directive is malformed, names a missing file, pins another hash than the
//! file's (the file changed under a migration that may already have run: the change belongs in
//! a new migration that includes it, ADR 0073), or when two scripts include the same file.
//!
//! Every `*.sql` of `migrations/<backend>/` is written, expanded, to
//! `$OUT_DIR/migrations/<backend>/`, where `migrate.rs` embeds it from.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const BACKENDS: [&str; 2] = ["postgres", "sqlite"];
const DIRECTIVE: &str = "-- include:";

fn main() {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let migrations = manifest.join("../migrations");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("migrations");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", migrations.display());
    for backend in BACKENDS {
        let dir = migrations.join(backend);
        let target = out.join(backend);
        fs::create_dir_all(&target).unwrap_or_else(|e| fail(&target, &e.to_string()));
        // Which script includes each file, so that no file is included twice.
        let mut included: BTreeMap<PathBuf, String> = BTreeMap::new();
        for script in scripts(&dir) {
            let name = script
                .file_name()
                .expect("a script's name")
                .to_string_lossy()
                .into_owned();
            let text = read(&script);
            let expanded = expand(&dir, &name, &text, &mut included);
            fs::write(target.join(&name), expanded)
                .unwrap_or_else(|e| fail(&target.join(&name), &e.to_string()));
        }
    }
}

/// The `*.sql` files directly in `dir`, by name.
fn scripts(dir: &Path) -> Vec<PathBuf> {
    let mut scripts: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| fail(dir, &e.to_string()))
        .map(|entry| entry.unwrap_or_else(|e| fail(dir, &e.to_string())).path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    scripts.sort();
    scripts
}

/// `text` (the script `name` of `dir`) with each directive followed by the file it names.
fn expand(dir: &Path, name: &str, text: &str, included: &mut BTreeMap<PathBuf, String>) -> String {
    let mut expanded = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        expanded.push_str(line);
        let Some(rest) = line.trim().strip_prefix(DIRECTIVE) else {
            continue;
        };
        let script = dir.join(name);
        let (path, pinned) = match rest.split_whitespace().collect::<Vec<_>>()[..] {
            [path, pin] => match pin.strip_prefix("fnv1a64=") {
                Some(hash) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    (path, hash.to_ascii_lowercase())
                }
                _ => fail(
                    &script,
                    &format!("`{}`: the hash is not fnv1a64=<16 hex digits>", line.trim()),
                ),
            },
            _ => fail(
                &script,
                &format!(
                    "`{}` is not `-- include: <path> fnv1a64=<hash>`",
                    line.trim()
                ),
            ),
        };
        if Path::new(path).is_absolute() || path.split('/').any(|part| part == "..") {
            fail(
                &script,
                &format!("{path}: an include names a file under the script's folder"),
            );
        }
        let file = dir.join(path);
        let body = read(&file).replace("\r\n", "\n");
        let hash = format!("{:016x}", fnv1a64(body.as_bytes()));
        if hash != pinned {
            fail(
                &script,
                &format!(
                    "it includes {path} as fnv1a64={pinned}, but the file is now fnv1a64={hash}. \
                     A migration that has run on some store must create there what it creates on \
                     a fresh one: leave the file as that migration had it, or include it from a \
                     new migration with the new hash and leave `-- Superseded by {path} \
                     (ADR 0073).` where it was included before (ADR 0073)"
                ),
            );
        }
        if let Some(other) = included.insert(file.clone(), name.to_owned()) {
            fail(
                &script,
                &format!(
                    "{path} is included by {other} too: each function is created by one \
                     migration, the newest that changed it (ADR 0073)"
                ),
            );
        }
        if !expanded.ends_with('\n') {
            expanded.push('\n');
        }
        expanded.push_str(&body);
        if !expanded.ends_with('\n') {
            expanded.push('\n');
        }
        println!("cargo:rerun-if-changed={}", file.display());
    }
    expanded
}

/// The FNV-1a hash (64 bits) of `bytes`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| fail(path, &e.to_string()))
}

fn fail(path: &Path, reason: &str) -> ! {
    panic!("migration scripts: {}: {reason}", path.display())
}
