//! What a crate sees with the runtime's default features (no `actix`, no
//! `axum`): the UI tests build with every feature on, so this one builds a
//! small crate of its own against `ratelimit-runtime` as a newcomer adds it
//! (`ratelimit-runtime = "0.1"`) and reads the compiler's errors.

use std::path::{Path, PathBuf};

/// The crate: a plain fn, which needs no feature, and two handlers.
const MAIN: &str = r#"use ratelimit_runtime::{rate_limit, RateLimited};

#[rate_limit(key = "plain", count = 3)]
async fn plain(x: u32) -> Result<u32, RateLimited> { Ok(x) }

#[rate_limit(key = "by_ip", count = 3, by = ip)]
async fn by_ip() -> String { "ip".into() }

#[rate_limit(key = "by_header", count = 3, by = header("x-api-key"))]
async fn by_header() -> String { "header".into() }

fn main() {
    let _ = plain(1);
    let _ = by_ip();
    let _ = by_header();
}
"#;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Writes the crate under the test's scratch directory and runs `cargo
/// check` on it (offline: the workspace's lock file pins every version),
/// returning the error lines (`src/main.rs:LINE:COL: error...`).
fn check_errors() -> Vec<String> {
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
    std::fs::write(root.join("src/main.rs"), MAIN).unwrap();
    std::fs::copy(workspace().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    let output = ratelimit_test_support::cargo(env!("CARGO"))
        .args(["check", "--offline", "--quiet", "--message-format=short"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "the crate built:\n{stderr}");
    let errors: Vec<String> = stderr
        .lines()
        .filter(|line| line.starts_with("src/") && line.contains(": error"))
        .map(str::to_owned)
        .collect();
    assert!(
        !errors.is_empty(),
        "no error in the crate's code:\n{stderr}"
    );
    errors
}

/// `by = ip` without the `actix` or `axum` feature: one error per handler,
/// at its `by`, that names the features to turn on; nothing else (the fns
/// stay as written, and the plain one needs no feature).
#[test]
fn a_handler_without_an_http_feature_is_told_which_features_to_enable() {
    let errors = check_errors();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].starts_with("src/main.rs:6:45: error: `by = ip` makes `by_ip` an HTTP handler"),
        "{errors:#?}"
    );
    assert!(
        errors[1].starts_with(
            "src/main.rs:9:49: error: `by = header(\"x-api-key\")` makes `by_header` an HTTP handler"
        ),
        "{errors:#?}"
    );
    for error in &errors {
        assert!(
            error.contains("needs the `actix` or `axum` feature of `ratelimit-runtime`")
                && error.contains(r#"features = ["axum"]"#),
            "{error}"
        );
    }
}
