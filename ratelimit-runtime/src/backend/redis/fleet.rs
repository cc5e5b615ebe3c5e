//! The read of the fleet's override hash (see
//! [`overrides::fleet`](crate::overrides::fleet)), on the limiter's own
//! connection.

use std::collections::BTreeMap;

use super::{RedisBackend, within};
use crate::error::Error;

impl RedisBackend {
    /// The fields and values of the hash at `key` (none if there is no such
    /// key), connecting first if the limiter is not connected; bounded by
    /// the connect timeout.
    pub(crate) async fn read_hash(&self, key: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, Error> {
        let read = async {
            let mut live = self.conn.get(&self.scripts).await?;
            let mut cmd = redis::cmd("HGETALL");
            cmd.arg(key);
            live.query(&cmd).await.map_err(|error| {
                // A cluster's or a Sentinel master's connection that is gone
                // is made again at the next use.
                self.conn.forget(&error);
                Error::backend(error)
            })
        };
        within(self.conn.connect_timeout, read).await
    }
}
