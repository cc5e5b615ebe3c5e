//! Compile-time checks of `#[rate_limit]`: what compiles, and the error (and
//! its place) for each mistake. Regenerate snapshots with `TRYBUILD=overwrite`
//! and read the diff; the toolchain is pinned in rust-toolchain.toml.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
