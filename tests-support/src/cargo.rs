//! Cargo run from a test: to build an example, or a small crate of a
//! test's own against the workspace.

use std::process::Command;

/// `cargo` (the one running the tests), without the variables cargo sets for
/// the test process itself (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...): build
/// scripts that watch them would take the workspace's built dependencies
/// for stale and build them again.
pub fn cargo(cargo: &str) -> Command {
    let mut command = Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("CARGO_PKG_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            )
        {
            command.env_remove(name);
        }
    }
    command
}
