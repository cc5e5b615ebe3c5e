//! The global limiter that `#[rate_limit]` uses, and limiters installed by
//! name for rules that say `limiter = "name"`.

use std::sync::{PoisonError, RwLock};

use once_cell::sync::OnceCell;

use super::RateLimiter;
use crate::error::Error;

static GLOBAL: OnceCell<RateLimiter> = OnceCell::new();
/// Installed by name; never removed, so each lives as long as the process.
static NAMED: RwLock<Vec<(Box<str>, &'static RateLimiter)>> = RwLock::new(Vec::new());

impl RateLimiter {
    /// Makes this limiter available by `name`, for rules that say
    /// `limiter = "name"`. It stays installed, and so in memory, for the
    /// life of the process, like the global limiter.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyInstalled`] if a limiter already has that name.
    pub fn install_as(self, name: &str) -> Result<(), Error> {
        let mut named = NAMED.write().unwrap_or_else(PoisonError::into_inner);
        if named.iter().any(|(n, _)| &**n == name) {
            return Err(Error::AlreadyInstalled);
        }
        // Kept for the life of the process, as every installed limiter is.
        named.push((name.into(), Box::leak(Box::new(self))));
        Ok(())
    }

    /// The limiter installed under `name`, if any.
    pub fn named(name: &str) -> Option<RateLimiter> {
        let named = NAMED.read().unwrap_or_else(PoisonError::into_inner);
        named
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, l)| (*l).clone())
    }

    /// Makes this the global limiter, the one `#[rate_limit]` uses.
    ///
    /// Call it once at start-up, before any rate-limited call: the first such
    /// call takes the in-memory default if nothing is installed yet.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyInstalled`] if a global limiter is already in place;
    /// the one in place stays.
    pub fn install(self) -> Result<(), Error> {
        GLOBAL.set(self).map_err(|_| Error::AlreadyInstalled)
    }

    /// The global limiter: the installed one, else the in-memory default
    /// (which from then on stays the global limiter).
    pub fn global() -> &'static RateLimiter {
        GLOBAL.get_or_init(RateLimiter::in_memory)
    }

    /// The installed global limiter, if one is (not the in-memory default
    /// taken by a first call).
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn installed() -> Option<&'static RateLimiter> {
        GLOBAL.get()
    }
}
