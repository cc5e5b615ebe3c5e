//! The Lua the server runs, assembled from the algorithm registry: each
//! algorithm's own script (one check alone, by `EVALSHA`), the batch script
//! (many checks or releases in one call), and the same as a function
//! library (`FCALL`, Redis 7 and later), whose prelude runs once at load.

use redis::Script;

use crate::Algorithm;
use crate::algorithm::REGISTRY;

/// The library functions the scripts use, bound to locals.
pub(super) const BIND: &str = include_str!("lua/bind.lua");
/// Helpers every algorithm uses.
const PRELUDE: &str = include_str!("lua/prelude.lua");
/// The driver of one check alone (after `local check = <algorithm>`).
const SINGLE: &str = include_str!("lua/single.lua");
/// The driver of a batch (after `local run = {<algorithms>}`).
const BATCH_DRIVER: &str = include_str!("lua/batch.lua");

/// The library's release function: KEYS[1] the key, ARGV the cost and the
/// lease id; it answers as a batch of releases does, with nothing. (`text`,
/// for the members of a lease of several units, needs its table: a
/// library's is kept between calls unless made anew.)
const RELEASE_FUNCTION: &str =
    "texts = {}\nrelease(KEYS[1], tonumber(ARGV[1]), ARGV[2])\nreturn ''";

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

/// The driver of one check of `algorithm` alone.
fn single_driver(algorithm: Algorithm) -> String {
    format!("local check = {}\n{SINGLE}", algorithm.name())
}

/// The Lua source of an algorithm's own script: the shared prelude, the
/// algorithm's function, and the driver that runs it once.
pub fn lua_source(algorithm: Algorithm) -> String {
    let spec = crate::algorithm::spec(algorithm);
    [BIND, PRELUDE, spec.lua, "\n", &single_driver(algorithm)].concat()
}

pub(super) struct Scripts {
    /// Indexed like [`Algorithm::ALL`].
    pub(super) by_algorithm: Vec<Script>,
    /// Many checks of any algorithms, or releases, in one call.
    pub(super) batch: Script,
    /// The same as a function library.
    pub(super) library: Library,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let batch = [BIND, &body(), &run_table(), BATCH_DRIVER].concat();
        Scripts {
            by_algorithm: Algorithm::ALL
                .iter()
                .map(|&algorithm| Script::new(&lua_source(algorithm)))
                .collect(),
            batch: Script::new(&batch),
            library: Library::new(),
        }
    }

    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        self.by_algorithm.iter().chain([&self.batch])
    }
}

/// The batch script as a Redis function library (Redis 7 and later), called
/// with `FCALL`: its prelude and algorithms run once, when it is loaded, not
/// at every call as a script's do. Besides the batch driver it has each
/// algorithm's single-check driver and a release, for the calls that go
/// alone. Its names carry a hash of all it runs, so instances running
/// different versions of this crate each find their own.
pub(super) struct Library {
    /// The batch function.
    pub(super) function: String,
    /// One check alone, per algorithm (indexed like [`Algorithm::ALL`]).
    pub(super) singles: Vec<String>,
    /// One release alone.
    pub(super) release: String,
    /// The library's source, for `FUNCTION LOAD REPLACE`.
    pub(super) source: String,
}

impl Library {
    pub(super) fn new() -> Library {
        let body = body();
        let batch_driver = [run_table().as_str(), BATCH_DRIVER].concat();
        // What the library runs, hashed: a change to any of it is a new
        // version, with names of its own.
        let digest =
            sha1_smol::Sha1::from([&body, &batch_driver, SINGLE, RELEASE_FUNCTION].concat())
                .digest()
                .to_string();
        let version = &digest[..16];
        let function = format!("ratelimit_batch_{version}");
        let singles: Vec<String> = Algorithm::ALL
            .iter()
            .map(|a| format!("ratelimit_{}_{version}", a.name()))
            .collect();
        let release = format!("ratelimit_release_{version}");
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
        for (&algorithm, name) in Algorithm::ALL.iter().zip(&singles) {
            register(name, &single_driver(algorithm));
        }
        register(&release, RELEASE_FUNCTION);
        Library {
            function,
            singles,
            release,
            source,
        }
    }
}
