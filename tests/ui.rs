//! Compile-time checks of `#[rate_limit]`: what compiles, and the error (and
//! its place) for each mistake. Regenerate snapshots with `TRYBUILD=overwrite`
//! and read the diff; the toolchain is pinned in rust-toolchain.toml.

use std::process::Command;

/// Set in the child process that runs trybuild.
const CHILD: &str = "RATELIMIT_UI_CHILD";

/// trybuild runs in a child process (this test again), so that when cases
/// fail, the names and diffs of those cases come last in the output, where
/// a CI log cut in the middle still shows them.
#[test]
fn ui() {
    if std::env::var_os(CHILD).is_some() {
        let cases = trybuild::TestCases::new();
        cases.pass("tests/ui/pass/*.rs");
        cases.compile_fail("tests/ui/fail/*.rs");
        return;
    }
    let output = Command::new(std::env::current_exe().expect("the test's own path"))
        .args(["--exact", "ui", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "0")
        // trybuild's own project takes no `[profile]` from the workspace:
        // without debug info its six linked cases take a third of the disk.
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .output()
        .expect("the UI test runs itself");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    if !output.status.success() {
        eprintln!(
            "\n==== UI cases that failed ====\n{}",
            failures(&format!("{stderr}\n{stdout}"))
        );
        std::process::exit(101);
    }
}

/// The report of each case that did not end in `ok`, from its `test` line
/// to the next case's, without colour codes; then a line per case: its name
/// and the first line where what it printed differs from its snapshot.
fn failures(report: &str) -> String {
    let plain = strip_colour(report);
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    let mut keep = false;
    for line in plain.lines() {
        if line.starts_with("test ") {
            keep = line.starts_with("test tests/") && !line.trim_end().ends_with("... ok");
            if keep {
                blocks.push(Vec::new());
            }
        }
        if keep && let Some(block) = blocks.last_mut() {
            block.push(line);
        }
    }
    let mut out = String::new();
    for block in &blocks {
        out.push_str(&block.join("\n"));
        out.push('\n');
    }
    out.push_str("\n==== in short ====\n");
    for block in &blocks {
        out.push_str(block[0]);
        out.push('\n');
        let fenced = |title: &str| -> Vec<&str> {
            let mut lines = block.iter().skip_while(|l| !l.starts_with(title)).skip(2);
            lines
                .by_ref()
                .take_while(|l| !l.starts_with('\u{2508}'))
                .copied()
                .collect()
        };
        let (expected, actual) = (fenced("EXPECTED"), fenced("ACTUAL OUTPUT"));
        if let Some(at) =
            (0..expected.len().max(actual.len())).find(|&i| expected.get(i) != actual.get(i))
        {
            out.push_str(&format!(
                "  line {}: expected {:?}\n  line {}: got      {:?}\n",
                at + 1,
                expected.get(at).copied().unwrap_or("<end>"),
                at + 1,
                actual.get(at).copied().unwrap_or("<end>"),
            ));
        }
    }
    out
}

fn strip_colour(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence: `ESC [` parameters, then a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
