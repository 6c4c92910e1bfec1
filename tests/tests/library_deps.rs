//! The embeddable library stays light: no command-line, configuration-file, progress-bar,
//! allocator or logging-subscriber crate anywhere in `wharf`'s normal dependency tree, and none
//! of the server's or the sessions' crates (ADR 0074). Asked of cargo itself, as
//! `cargo tree -p wharf -e normal` answers it.

use std::path::Path;
use std::process::Command;

/// What an application that embeds Wharf must not be made to compile.
const FORBIDDEN: [&str; 7] = [
    "clap",
    "figment",
    "indicatif",
    "mimalloc",
    "tracing-subscriber",
    "wharf-server",
    "wharf-sessions",
];

fn normal_tree(package: &str) -> Vec<String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "--offline"])
        .current_dir(&workspace)
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_library_compiles_no_server_crate() {
    let tree = normal_tree("wharf");
    assert!(tree.iter().any(|name| name == "wharf-store"), "{tree:?}");
    let found: Vec<&str> = FORBIDDEN
        .iter()
        .copied()
        .filter(|forbidden| tree.iter().any(|name| name == forbidden))
        .collect();
    assert!(found.is_empty(), "wharf depends on {found:?}");
}

#[test]
fn the_check_sees_the_server_crates_where_they_are() {
    // The same question of the server must find them, or the check above proves nothing.
    let tree = normal_tree("wharf-server");
    for expected in ["clap", "figment", "mimalloc", "wharf-sessions", "wharf"] {
        assert!(
            tree.iter().any(|name| name == expected),
            "{expected} in {tree:?}"
        );
    }
}
