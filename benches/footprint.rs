//! Memory per key, next to governor's keyed limiter: the live heap bytes
//! (counted by dhat's allocator) that one check of each of 100,000
//! `String` keys leaves, the limiter's own copies of the keys included.
//! The keys are `limiter:user:<i>`, or with `--shapes` each shape of
//! `common::SHAPES` in turn (short keys, IPv4, IPv6 /64 and header-digest
//! keys as the HTTP adapters make them). Each side runs in a process of its
//! own (this bench starts itself again per side and shape). One JSON line
//! per side: `{"bench": "footprint", "limiter", "algorithm", "keys",
//! "bytes_per_key", "shape"}`.
//!
//! `cargo bench -p ratelimit-benches --bench footprint [-- --shapes]`

mod common;

use common::{KEYS, LASTING, SHAPES, governor, keys_of, ours, ours_for, rule};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// The heap's live bytes.
fn live() -> f64 {
    dhat::HeapStats::get().curr_bytes as f64
}

/// Measures one side in this process: the keys are made first, so only
/// what the limiter keeps (its copies of them too) is counted.
fn measure(side: &str, shape: &str) {
    let _profiler = dhat::Profiler::builder().testing().build();
    let keys = keys_of(shape);
    let before = live();
    let held: Box<dyn std::any::Any> = if side == "governor" {
        let limiter = governor();
        for key in &keys {
            assert!(limiter.check_key(key).is_ok());
        }
        Box::new(limiter)
    } else {
        let algorithm = *LASTING
            .iter()
            .find(|a| a.name() == side)
            .unwrap_or_else(|| panic!("unknown side {side}"));
        let rule = rule(algorithm, true);
        let (store, limiter) = ours_for("footprint", algorithm);
        for key in &keys {
            ours(&store, &limiter, &rule, key);
        }
        Box::new((store, limiter))
    };
    let bytes = (live() - before) / KEYS as f64;
    drop(held);
    let (limiter, algorithm) = match side {
        "governor" => ("governor", "gcra"),
        algorithm => ("ratelimit", algorithm),
    };
    println!(
        "{{\"bench\":\"footprint\",\"limiter\":\"{limiter}\",\"algorithm\":\"{algorithm}\",\
         \"keys\":{KEYS},\"bytes_per_key\":{bytes:.1},\"shape\":\"{shape}\"}}"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--side") {
        measure(&args[at + 1], &args[at + 2]);
        return;
    }
    let shapes: &[&str] = if args.iter().any(|a| a == "--shapes") {
        &SHAPES
    } else {
        &SHAPES[..1]
    };
    let me = std::env::current_exe().expect("this bench's path");
    for shape in shapes {
        let sides = std::iter::once("governor").chain(LASTING.iter().map(|a| a.name()));
        for side in sides {
            let status = std::process::Command::new(&me)
                .args(["--side", side, shape])
                .status()
                .expect("running a side");
            assert!(status.success(), "the side {side} failed");
        }
    }
}
