//! The Lua the server runs, assembled from the algorithm registry: the batch
//! script (any checks and releases in one call), by `EVALSHA`, and a function
//! library (`FCALL`, Redis 7 and later) whose prelude and algorithms run
//! once, at load, with two functions: the batch, and `one`, a call that goes
//! alone. Where there is no library, a batch of one algorithm's calls (every
//! lone call among them) goes by `EVALSHA` of that algorithm's own copy of
//! the script, which defines only it: a script defines its Lua functions anew
//! at every call.

use redis::Script;

use super::codec::{Call, Op};
use crate::algorithm::{REGISTRY, Spec};

/// The library functions the scripts use, bound to locals.
pub(super) const BIND: &str = include_str!("lua/bind.lua");
/// Helpers every algorithm uses.
const PRELUDE: &str = include_str!("lua/prelude.lua");
/// The driver of a batch (after `local run = {<algorithms>}`).
const BATCH_DRIVER: &str = include_str!("lua/batch.lua");
/// The driver of a call that goes alone (the library's second function).
const ONE_DRIVER: &str = include_str!("lua/one.lua");
/// What a cluster master's batch runs before the batch driver (the
/// library's third function).
const NODE_PROLOGUE: &str = include_str!("lua/node.lua");

/// The prelude and these algorithms' functions: what a script and the
/// library define before the driver.
fn body<'a>(specs: impl Iterator<Item = &'a Spec>) -> String {
    let mut body = String::from(PRELUDE);
    for spec in specs {
        body.push_str(spec.lua);
    }
    body
}

/// The driver's tables of these algorithms by op id (see [`Op::id`]):
/// `run`, each op's check (a peek's, a refund's and a reset's too: they
/// answer what it would answer next), and `before`, what a look runs first
/// (a peek nothing: `true`); and `RELEASE`, a release's op id.
fn run_table<'a>(specs: impl Iterator<Item = &'a Spec> + Clone) -> String {
    // One constructor each, so the tables are made at their sizes at once.
    let mut run = Vec::new();
    let mut before = Vec::new();
    for spec in specs {
        let algorithm = spec.algorithm;
        for op in [
            Op::Check(algorithm),
            Op::Peek(algorithm),
            Op::Reset(algorithm),
        ] {
            run.push(format!("[{}] = {}", op.id(), spec.name));
        }
        before.push(format!("[{}] = true", Op::Peek(algorithm).id()));
        before.push(format!("[{}] = reset", Op::Reset(algorithm).id()));
        if spec.wait.is_some() {
            run.push(format!(
                "[{}] = {}_reserve",
                Op::Reserve(algorithm).id(),
                spec.name
            ));
            run.push(format!("[{}] = {}", Op::Cancel(algorithm).id(), spec.name));
            before.push(format!(
                "[{}] = {}_cancel",
                Op::Cancel(algorithm).id(),
                spec.name
            ));
        }
        if spec.refund.is_some() {
            run.push(format!("[{}] = {}", Op::Refund(algorithm).id(), spec.name));
            before.push(format!(
                "[{}] = {}_refund",
                Op::Refund(algorithm).id(),
                spec.name
            ));
        }
    }
    format!(
        "local run = {{{}}}\nlocal before = {{{}}}\nlocal RELEASE = {}\n",
        run.join(", "),
        before.join(", "),
        Op::Release.id()
    )
}

/// What a call under several rules (all or nothing) runs before the batch
/// driver.
const WHOLE_PROLOGUE: &str = "whole = true\n";

/// A batch script of these algorithms.
fn script<'a>(specs: impl Iterator<Item = &'a Spec> + Clone) -> Script {
    Script::new(&[BIND, &body(specs.clone()), &run_table(specs), BATCH_DRIVER].concat())
}

/// The script of a call under several rules: a batch of every algorithm,
/// all or nothing.
fn whole_script() -> Script {
    let specs = REGISTRY.iter();
    Script::new(
        &[
            BIND,
            &body(specs.clone()),
            &run_table(specs),
            WHOLE_PROLOGUE,
            BATCH_DRIVER,
        ]
        .concat(),
    )
}

pub(super) struct Scripts {
    /// Any checks and releases in one call.
    pub(super) batch: Script,
    /// The same for one algorithm's calls, indexed like the registry.
    by_algorithm: Vec<Script>,
    /// A call under several rules, all or nothing.
    pub(super) whole: Script,
    /// The same as a function library.
    pub(super) library: Library,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            batch: script(REGISTRY.iter()),
            by_algorithm: REGISTRY
                .iter()
                .map(std::slice::from_ref)
                .map(|one| script(one.iter()))
                .collect(),
            whole: whole_script(),
            library: Library::new(),
        }
    }

    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        std::iter::once(&self.batch)
            .chain(&self.by_algorithm)
            .chain(std::iter::once(&self.whole))
    }

    /// The script for these calls: their algorithm's own, when they share
    /// one, else the batch script of every algorithm.
    pub(super) fn for_calls<'a>(&self, mut calls: impl Iterator<Item = &'a Call>) -> &Script {
        let Some(first) = calls.next() else {
            return &self.batch;
        };
        if calls.all(|call| call.algorithm == first.algorithm) {
            &self.by_algorithm[first.algorithm as usize]
        } else {
            &self.batch
        }
    }
}

/// The batch script as a Redis function library (Redis 7 and later), called
/// with `FCALL`: its prelude and algorithms run once, when it is loaded, not
/// at every call as a script's do. Its names carry a hash of all it runs,
/// so instances running different versions of this crate each find their
/// own.
pub(super) struct Library {
    /// The batch function.
    pub(super) function: String,
    /// The function of a call that goes alone (`lua/one.lua`).
    pub(super) one: String,
    /// The batch function of a cluster master, whose keys may be of several
    /// slots (`lua/node.lua`).
    pub(super) node: String,
    /// The function of a call under several rules, all or nothing.
    pub(super) whole: String,
    /// The same, for keys of several slots of one cluster master.
    pub(super) whole_node: String,
    /// The library's source, for `FUNCTION LOAD REPLACE`.
    pub(super) source: String,
}

impl Library {
    pub(super) fn new() -> Library {
        // The table of algorithms is made once, at load, with them.
        let body = [body(REGISTRY.iter()), run_table(REGISTRY.iter())].concat();
        // What the library runs, hashed: a change to any of it is a new
        // version, with names of its own.
        let digest = sha1_smol::Sha1::from(
            [
                body.as_str(),
                BATCH_DRIVER,
                ONE_DRIVER,
                NODE_PROLOGUE,
                WHOLE_PROLOGUE,
            ]
            .concat(),
        )
        .digest()
        .to_string();
        let version = &digest[..16];
        let function = format!("ratelimit_batch_{version}");
        let one = format!("ratelimit_one_{version}");
        let node = format!("ratelimit_node_{version}");
        let whole = format!("ratelimit_whole_{version}");
        let whole_node = format!("ratelimit_whole_node_{version}");
        // bind.lua's lines `local names = values`: the names declared at
        // load, the values given at each call (`redis` and `struct` exist
        // only in a call).
        let bound: Vec<(&str, &str)> = BIND
            .lines()
            .filter_map(|line| line.strip_prefix("local ")?.split_once(" = "))
            .collect();
        let mut source = format!("#!lua name=ratelimit_{version}\n");
        for (names, _) in &bound {
            source.push_str(&format!("local {names}\n"));
        }
        source.push_str(&body);
        // Each function: its name, what it runs first, its driver, and its
        // flags (a function that has some is registered by a table).
        let mut register = |name: &str, prologue: &str, driver: &str, flags: &str| {
            if flags.is_empty() {
                source.push_str(&format!(
                    "\nredis.register_function('{name}', function(KEYS, ARGV)\n"
                ));
            } else {
                source.push_str(&format!(
                    "\nredis.register_function{{function_name = '{name}', \
                     flags = {{{flags}}}, callback = function(KEYS, ARGV)\n"
                ));
            }
            for (names, values) in &bound {
                source.push_str(&format!("{names} = {values}\n"));
            }
            source.push_str(prologue);
            source.push_str(driver);
            source.push_str(if flags.is_empty() {
                "\nend)\n"
            } else {
                "\nend}\n"
            });
        };
        register(
            &function,
            "spread, whole = false, false\n",
            BATCH_DRIVER,
            "",
        );
        register(&one, "", ONE_DRIVER, "");
        let node_prologue = ["whole = false\n", NODE_PROLOGUE].concat();
        register(
            &node,
            &node_prologue,
            BATCH_DRIVER,
            "'allow-cross-slot-keys'",
        );
        let whole_prologue = ["spread = false\n", WHOLE_PROLOGUE].concat();
        register(&whole, &whole_prologue, BATCH_DRIVER, "");
        let whole_node_prologue = [NODE_PROLOGUE, WHOLE_PROLOGUE].concat();
        register(
            &whole_node,
            &whole_node_prologue,
            BATCH_DRIVER,
            "'allow-cross-slot-keys'",
        );
        Library {
            function,
            one,
            node,
            whole,
            whole_node,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library declares at load, and sets at each call, every name
    /// bind.lua binds (a line of another shape would leave a name unset),
    /// and is named after one version of all it runs: its functions'
    /// names carry it too, and every function is registered.
    #[test]
    fn the_library_binds_what_the_scripts_bind() {
        let library = Library::new();
        let version = library
            .source
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("#!lua name=ratelimit_"))
            .expect("a library header");
        assert_eq!(version.len(), 16);
        assert_eq!(library.function, format!("ratelimit_batch_{version}"));
        assert_eq!(library.one, format!("ratelimit_one_{version}"));
        assert_eq!(library.node, format!("ratelimit_node_{version}"));
        for function in [&library.function, &library.one] {
            let registered = format!("redis.register_function('{function}', function(KEYS, ARGV)");
            assert_eq!(library.source.matches(&registered).count(), 1);
        }
        let node = format!(
            "redis.register_function{{function_name = '{}', \
             flags = {{'allow-cross-slot-keys'}}, callback = function(KEYS, ARGV)",
            library.node
        );
        assert_eq!(library.source.matches(&node).count(), 1);
        // Each function sets what bind.lua binds before its body runs.
        assert_eq!(
            library
                .source
                .matches("redis_call, redis_pcall = redis.call, redis.pcall\n")
                .count(),
            5,
            "set in each function"
        );
        for name in [
            "redis_call",
            "redis_pcall",
            "struct_pack",
            "struct_unpack",
            "string_byte",
        ] {
            let declared = library.source.lines().take(3).any(|line| {
                line.strip_prefix("local ")
                    .is_some_and(|names| names.split(", ").any(|n| n == name))
            });
            assert!(declared, "{name} not declared at load");
        }
        let code_lines = BIND.lines().filter(|line| !line.starts_with("--")).count();
        assert_eq!(code_lines, 2, "bind.lua: only `local names = values` lines");
    }
}
