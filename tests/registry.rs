//! The algorithm registry is the one source of truth: the macro's table of
//! algorithm names (a proc-macro crate cannot import the runtime's) is held
//! to it here, so an algorithm added to the registry and not to the macro
//! (or named differently) fails this test. So is the macro's list of the
//! characters a rendered key value keeps.

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

/// The macro's `KEPT_PUNCTUATION`, read from its source.
fn macro_kept_punctuation() -> String {
    let source = include_str!("../ratelimit-macros/src/key.rs");
    let line = source
        .lines()
        .find(|l| l.contains("const KEPT_PUNCTUATION"))
        .expect("the macro's KEPT_PUNCTUATION");
    let start = line.find('"').unwrap() + 1;
    let end = line.rfind('"').unwrap();
    line[start..end].to_owned()
}

/// The macro tells a separator of two placeholders by the characters a
/// rendered value keeps; they must be those the runtime keeps, or a key it
/// accepts could merge two callers' budgets.
#[test]
fn the_macro_knows_which_characters_values_keep() {
    let punctuation = macro_kept_punctuation();
    for byte in 0x20u8..0x7f {
        let c = char::from(byte);
        let rendered = ratelimit_runtime::__private::SafePart(c.to_string()).to_string();
        let kept = rendered == c.to_string();
        let macro_keeps = c.is_ascii_alphanumeric() || punctuation.contains(c);
        assert_eq!(kept, macro_keeps, "{c:?}: the runtime renders {rendered:?}");
    }
}
