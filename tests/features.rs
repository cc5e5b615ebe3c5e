//! What a crate sees with the runtime's default features (no `actix`, no
//! `axum`). The UI tests build with every feature on, so this one builds a
//! crate of its own, `tests/ui/no-http-feature/handlers.rs`, against
//! `ratelimit-runtime` as a newcomer adds it, and compares the compiler's
//! errors with `handlers.stderr` (`TRYBUILD=overwrite` rewrites it, as for
//! the UI tests).

use std::path::{Path, PathBuf};

const CASE: &str = "tests/ui/no-http-feature/handlers";

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Writes the crate under the test's scratch directory and runs `cargo
/// check` on it (offline: the workspace's lock file pins every version);
/// returns the compiler's errors, with the source's path as in the tree.
fn check_errors() -> String {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-http-feature");
    std::fs::create_dir_all(root.join("src")).unwrap();
    let runtime = workspace().join("ratelimit-runtime");
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            "[package]\nname = \"no-http-feature\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
             publish = false\n\n[dependencies]\nratelimit-runtime = {{ path = {:?} }}\n\n\
             [workspace]\n",
            runtime.display().to_string()
        ),
    )
    .unwrap();
    std::fs::copy(
        workspace().join(format!("{CASE}.rs")),
        root.join("src/main.rs"),
    )
    .unwrap();
    std::fs::copy(workspace().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    let output = ratelimit_test_support::cargo(env!("CARGO"))
        .args(["check", "--offline", "--quiet", "--color=never"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the crate built:\n{stderr}");
    let mut errors = String::new();
    for line in stderr.lines() {
        if line.starts_with("error: could not compile") {
            break;
        }
        errors.push_str(&line.replace("src/main.rs", &format!("{CASE}.rs")));
        errors.push('\n');
    }
    errors.trim_end().to_owned() + "\n"
}

/// `by = ip` without the `actix` or `axum` feature: one error per handler,
/// at its `by`, that names the features to turn on; nothing else (the fns
/// stay as written, and the plain one needs no feature).
#[test]
fn a_handler_without_an_http_feature_is_told_which_features_to_enable() {
    let errors = check_errors();
    let expected_path = workspace().join(format!("{CASE}.stderr"));
    if std::env::var_os("TRYBUILD").is_some_and(|v| v == "overwrite") {
        std::fs::write(&expected_path, &errors).unwrap();
    }
    let first = errors.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: `by = ip` makes `by_ip` an HTTP handler, which needs the `actix` or `axum` feature of `ratelimit-runtime`: add `features = [\"axum\"]`"),
        "{errors}"
    );
    assert!(
        errors.contains(&format!("--> {CASE}.rs:8:45\n")),
        "at `ip`:\n{errors}"
    );
    assert_eq!(errors.matches("\nerror").count() + 1, 2, "{errors}");
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    assert_eq!(
        errors, expected,
        "the errors differ from {CASE}.stderr (TRYBUILD=overwrite rewrites it)"
    );
}
