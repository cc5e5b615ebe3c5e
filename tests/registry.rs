//! The algorithm registry is the one source of truth: the macro's table of
//! algorithm names (a proc-macro crate cannot import the runtime's) is held
//! to it here, so an algorithm added to the registry and not to the macro
//! (or named differently) fails this test.

use ratelimit_runtime::Algorithm;

/// The macro's `ALGORITHMS` table, read from its source: `(name, variant, burst)`.
fn macro_table() -> Vec<(String, String, bool)> {
    let source = include_str!("../ratelimit-macros/src/options.rs");
    let start = source
        .find("pub(crate) const ALGORITHMS")
        .expect("the macro's ALGORITHMS table");
    let table = &source[start..];
    let table = &table[table.find("= [").expect("its entries") + 3..table.find("];").unwrap()];
    table
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with('('))
        .map(|line| {
            let fields: Vec<String> = line
                .trim_start_matches('(')
                .trim_end_matches("),")
                .split(',')
                .map(|f| f.trim().trim_matches('"').to_owned())
                .collect();
            (fields[0].clone(), fields[1].clone(), fields[2] == "true")
        })
        .collect()
}

#[test]
fn the_macro_names_every_algorithm_as_the_registry_does() {
    let runtime: Vec<(String, String, bool)> = Algorithm::ALL
        .iter()
        .map(|a| (a.name().to_owned(), format!("{a:?}"), a.has_burst()))
        .collect();
    assert_eq!(macro_table(), runtime);
}
