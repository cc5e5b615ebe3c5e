//! Coalescing on a Redis Cluster: which master serves each slot, as the
//! cluster last said (`CLUSTER SLOTS`), so that checks bound for one master
//! go together in one call of the library's `node` function.
//!
//! A script's declared keys must share a slot, so a node's batch passes its
//! keys as arguments to a function that may touch keys of several slots
//! (flag `allow-cross-slot-keys`). The map may be out of date (a slot
//! moved, a failover): the function reads every key before it writes any,
//! and a key the node does not serve fails that read, so the batch stops
//! with nothing counted and answers so (see `lua/batch.lua`). Its calls then
//! go again one by one, each routed by its own key, and the map is asked
//! for anew. A script runs atomically, so no slot moves between its reads
//! and its writes.

use redis::Value;

/// How many slots a cluster has.
const SLOTS: usize = 16_384;

/// No master known for the slot.
const NONE: u16 = u16::MAX;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the
/// first `{` and the next `}`, when not empty) or of the whole key.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

/// Each slot's master, by a number of the map's own.
pub(super) struct SlotMap {
    masters: Vec<u16>,
}

impl SlotMap {
    /// The map from a `CLUSTER SLOTS` reply: `[start, end, [host, port,
    /// ..], replicas..]` per range. `None` for a reply of another shape.
    pub(super) fn parse(reply: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut masters = vec![NONE; SLOTS];
        let mut nodes: Vec<(Vec<u8>, i64)> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let host = match master.first() {
                Some(Value::BulkString(host)) => host.clone(),
                Some(Value::SimpleString(host)) => host.clone().into_bytes(),
                _ => return None,
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            let node = (host, *port);
            let number = match nodes.iter().position(|known| *known == node) {
                Some(number) => number,
                None => {
                    nodes.push(node);
                    nodes.len() - 1
                }
            };
            let number = u16::try_from(number).ok()?;
            let start = usize::try_from(*start).ok()?;
            let end = usize::try_from(*end).ok()?;
            masters.get_mut(start..=end)?.fill(number);
        }
        Some(SlotMap { masters })
    }

    /// The number of the master that serves `key`, if the map names one.
    pub(super) fn master_of(&self, key: &[u8]) -> Option<u16> {
        let master = self.masters[usize::from(slot(key))];
        (master != NONE).then_some(master)
    }
}

/// `items` in groups bound for one master each (by `key`), in their order;
/// an item whose master is not known goes alone.
pub(super) fn by_master<T>(items: Vec<T>, map: &SlotMap, key: impl Fn(&T) -> &[u8]) -> Vec<Vec<T>> {
    let mut groups: Vec<(Option<u16>, Vec<T>)> = Vec::new();
    for item in items {
        let master = map.master_of(key(&item));
        match groups
            .iter_mut()
            .find(|(m, _)| master.is_some() && *m == master)
        {
            Some((_, group)) => group.push(item),
            None => groups.push((master, vec![item])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    #[test]
    fn slots_are_the_clusters_own() {
        for key in [
            &b"limiter:a"[..],
            b"limiter:user:{42}:x",
            b"{}limiter",
            b"{a}b",
            b"a{b",
            b"",
            "é{ü}".as_bytes(),
        ] {
            assert_eq!(Slot::new(slot(key)), Some(Slot::for_key(key)), "{key:?}");
        }
        // The example the cluster specification gives.
        assert_eq!(slot(b"123456789"), 0x31C3);
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn a_map_names_each_slots_master_and_groups_by_it() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8_000),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(8_001),
                Value::Int(16_000),
                node("127.0.0.1", 7001),
            ]),
            Value::Array(vec![
                Value::Int(16_001),
                Value::Int(16_100),
                node("127.0.0.1", 7000),
            ]),
        ]);
        let map = SlotMap::parse(&reply).expect("a map");
        let keys: Vec<Vec<u8>> = (0..2_000).map(|i| format!("k{i}").into_bytes()).collect();
        let expected = |key: &[u8]| match slot(key) {
            0..=8_000 | 16_001..=16_100 => Some(0),
            8_001..=16_000 => Some(1),
            _ => None,
        };
        for key in &keys {
            assert_eq!(map.master_of(key), expected(key));
        }
        let groups = by_master(keys.clone(), &map, |k| k);
        let unknown = keys.iter().filter(|k| expected(k).is_none()).count();
        assert!(unknown > 0);
        assert_eq!(
            groups.len(),
            2 + unknown,
            "one group per master, the rest alone"
        );
        for group in &groups {
            let first = expected(&group[0]);
            assert!(group.iter().all(|k| expected(k) == first));
            assert!(first.is_some() || group.len() == 1);
        }
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), keys.len());
        assert!(SlotMap::parse(&Value::Nil).is_none());
        assert!(SlotMap::parse(&Value::Array(vec![Value::Int(1)])).is_none());
    }
}
