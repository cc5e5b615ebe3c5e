//! The global limiter that `#[rate_limit]` uses, and limiters installed by
//! name for rules that say `limiter = "name"`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

use once_cell::sync::OnceCell;

use super::RateLimiter;
use crate::error::Error;

static GLOBAL: OnceCell<RateLimiter> = OnceCell::new();
/// The global limiter is the in-memory default a first call took.
static DEFAULTED: AtomicBool = AtomicBool::new(false);
/// An HTTP request brought a limiter of its app's own (app data, an
/// extension).
static APP_LIMITER_SEEN: AtomicBool = AtomicBool::new(false);
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
        GLOBAL.get_or_init(|| {
            DEFAULTED.store(true, Ordering::Relaxed);
            RateLimiter::in_memory()
        })
    }

    /// Notes that an HTTP request brought its app's own limiter.
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn note_app_limiter() {
        if !APP_LIMITER_SEEN.load(Ordering::Relaxed) {
            APP_LIMITER_SEEN.store(true, Ordering::Relaxed);
        }
    }

    /// The global limiter is the in-memory default while apps hand their
    /// requests limiters of their own: what checks on the global limiter
    /// count, they count in this process alone, apart from the apps'.
    pub(crate) fn defaulted_beside_app_limiters() -> bool {
        APP_LIMITER_SEEN.load(Ordering::Relaxed) && DEFAULTED.load(Ordering::Relaxed)
    }

    /// The installed global limiter, if one is (not the in-memory default
    /// taken by a first call).
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn installed() -> Option<&'static RateLimiter> {
        GLOBAL.get()
    }
}
