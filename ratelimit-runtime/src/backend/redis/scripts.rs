//! The Lua the server runs, assembled from the algorithm registry: the batch
//! script (any checks and releases in one call, a lone check being a batch
//! of one), by `EVALSHA`, and the same as a function library (`FCALL`, Redis
//! 7 and later), whose prelude and algorithms run once, at load.

use redis::Script;

use crate::algorithm::REGISTRY;

/// The library functions the scripts use, bound to locals.
pub(super) const BIND: &str = include_str!("lua/bind.lua");
/// Helpers every algorithm uses.
const PRELUDE: &str = include_str!("lua/prelude.lua");
/// The driver of a batch (after `local run = {<algorithms>}`).
const BATCH_DRIVER: &str = include_str!("lua/batch.lua");

/// The prelude and every algorithm's function: what the batch script and
/// the library define before their drivers.
fn body() -> String {
    let mut body = String::from(PRELUDE);
    for spec in &REGISTRY {
        body.push_str(spec.lua);
    }
    body
}

/// The batch driver's table of algorithms by op id (the registry's order).
fn run_table() -> String {
    let names: Vec<&str> = REGISTRY.iter().map(|spec| spec.name).collect();
    format!("local run = {{{}}}\n", names.join(", "))
}

pub(super) struct Scripts {
    /// Any checks and releases in one call.
    pub(super) batch: Script,
    /// The same as a function library.
    pub(super) library: Library,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let batch = [BIND, &body(), &run_table(), BATCH_DRIVER].concat();
        Scripts {
            batch: Script::new(&batch),
            library: Library::new(),
        }
    }

    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        [&self.batch].into_iter()
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
    /// The library's source, for `FUNCTION LOAD REPLACE`.
    pub(super) source: String,
}

impl Library {
    pub(super) fn new() -> Library {
        let body = body();
        let batch_driver = [run_table().as_str(), BATCH_DRIVER].concat();
        // What the library runs, hashed: a change to any of it is a new
        // version, with names of its own.
        let digest = sha1_smol::Sha1::from([body.as_str(), &batch_driver].concat())
            .digest()
            .to_string();
        let version = &digest[..16];
        let function = format!("ratelimit_batch_{version}");
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
        let mut register = |name: &str, driver: &str| {
            source.push_str(&format!(
                "\nredis.register_function('{name}', function(KEYS, ARGV)\n"
            ));
            for (names, values) in &bound {
                source.push_str(&format!("{names} = {values}\n"));
            }
            source.push_str(driver);
            source.push_str("\nend)\n");
        };
        register(&function, &batch_driver);
        Library { function, source }
    }
}
