//! Moving a slot of a [`RedisCluster`] from one master to another while
//! clients use it, step by step as `redis-cli --cluster reshard` does: the
//! target importing, the source migrating, the keys moved by `MIGRATE`, then
//! the slot given to the target on every master.

use std::time::{Duration, Instant};

use crate::RedisCluster;

/// A slot on its way from one master to another.
#[derive(Debug)]
pub struct Migration {
    /// The slot.
    pub slot: u16,
    /// The port of the master it leaves.
    pub from: u16,
    /// The port of the master it goes to.
    pub to: u16,
    from_id: String,
    to_id: String,
}

impl RedisCluster {
    /// Starts moving the slot of `key` to the master on `to`: `to` imports
    /// it, its master migrates it (`CLUSTER SETSLOT .. IMPORTING` and
    /// `MIGRATING`). Until [`finish_migration`](Self::finish_migration), a
    /// key of the slot that the source does not hold is answered `ASK`
    /// there.
    ///
    /// # Panics
    ///
    /// If a node refuses a step.
    pub fn begin_migration(&self, key: &str, to: u16) -> Migration {
        let from = self.master_for(key);
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.connection(to))
            .expect("CLUSTER KEYSLOT");
        let migration = Migration {
            slot,
            from,
            to,
            from_id: self.node_id(from),
            to_id: self.node_id(to),
        };
        self.set_slot(to, slot, &["IMPORTING", &migration.from_id]);
        self.set_slot(from, slot, &["MIGRATING", &migration.to_id]);
        migration
    }

    /// Moves up to `count` keys of the migrating slot from its source to its
    /// target (`CLUSTER GETKEYSINSLOT`, then one `MIGRATE .. KEYS`), as the
    /// reshard does a batch at a time. Answers how many it moved.
    ///
    /// # Panics
    ///
    /// If a node refuses a step.
    pub fn migrate_keys(&self, migration: &Migration, count: usize) -> usize {
        let mut source = self.connection(migration.from);
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(migration.slot)
            .arg(count)
            .query(&mut source)
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return 0;
        }
        let _: redis::Value = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(migration.to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut source)
            .unwrap_or_else(|e| panic!("MIGRATE of slot {}: {e}", migration.slot));
        keys.len()
    }

    /// Gives the slot to its target on every master (`CLUSTER SETSLOT ..
    /// NODE`), and waits until every master says so.
    ///
    /// # Panics
    ///
    /// If a node refuses a step, or the masters do not agree within 10 s.
    pub fn finish_migration(&self, migration: &Migration) {
        let (slot, to_id) = (migration.slot, migration.to_id.as_str());
        self.set_slot(migration.to, slot, &["NODE", to_id]);
        self.set_slot(migration.from, slot, &["NODE", to_id]);
        for port in self.masters() {
            if port != migration.to && port != migration.from {
                self.set_slot(port, slot, &["NODE", to_id]);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.masters().into_iter().any(|port| {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut self.connection(port))
                .unwrap_or_default();
            !nodes.lines().any(|line| {
                line.starts_with(to_id)
                    && line.split(' ').skip(8).any(|range| {
                        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                        matches!((lo.parse::<u16>(), hi.parse::<u16>()),
                            (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
                    })
            })
        }) {
            assert!(
                Instant::now() < deadline,
                "the masters did not agree on slot {slot}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Moves the slot of `key`, which must hold no key, to the master on
    /// `to`, as `redis-cli --cluster reshard` would (importing, migrating,
    /// then assigned on every master), and waits until every master says
    /// `to` serves it.
    ///
    /// # Panics
    ///
    /// If a node refuses a step, or the masters do not agree within 10 s.
    pub fn move_empty_slot(&self, key: &str, to: u16) {
        let migration = self.begin_migration(key, to);
        self.finish_migration(&migration);
    }

    fn node_id(&self, port: u16) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.connection(port))
            .expect("CLUSTER MYID")
    }

    fn set_slot(&self, port: u16, slot: u16, args: &[&str]) {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query(&mut self.connection(port))
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {args:?} on {port}: {e}"));
    }
}
