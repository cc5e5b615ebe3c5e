//! The limiter's view of its backend: [`Backend`] made object-safe, so one
//! limiter type holds any store behind one `Arc`, and every operation takes
//! one path.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::RuleCheck;
use crate::backend::hook::{Answered, BackendCall, LeaseRef, Reserved, Sealed, Ticket};
use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, Failover};
use crate::decision::{Charge, Decision};
use crate::error::{Error, OnError};
use crate::rule::{Rule, SubjectLimit};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// A [`Backend`] behind `dyn`. A store that answers in process does so in
/// [`answer_now`](Store::answer_now), with no future to box: the in-memory
/// default's checks allocate nothing here.
pub(super) trait Store: Send + Sync + fmt::Debug + 'static {
    fn answer_now(&self, call: &BackendCall<'_>) -> Option<Answered>;
    fn answer<'a>(&'a self, call: BackendCall<'a>) -> Boxed<'a, Answered>;
    fn release_now(&self, lease: &LeaseRef<'_>) -> bool;
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> Boxed<'a, ()>;
    fn peek<'a>(&'a self, rule: &'a Rule, key: &'a str) -> Boxed<'a, Decision>;
    fn refund<'a>(&'a self, rule: &'a Rule, key: &'a str, charge: Charge) -> Boxed<'a, Decision>;
    fn reset<'a>(&'a self, rule: &'a Rule, key: &'a str) -> Boxed<'a, Decision>;
    fn set_limit<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: Option<SubjectLimit>,
    ) -> Boxed<'a, ()>;
    fn answer_all<'a>(
        &'a self,
        checks: &'a [RuleCheck<'a>],
        on_error: OnError,
    ) -> Boxed<'a, Vec<Answered>>;
    fn name(&self) -> &'static str;
    fn reserve_now(
        &self,
        call: &BackendCall<'_>,
        max_wait: Duration,
    ) -> Option<Result<Reserved, Error>>;
    fn reserve<'a>(&'a self, call: BackendCall<'a>, max_wait: Duration) -> Boxed<'a, Reserved>;
    fn cancel_now(&self, rule: &Rule, key: &str, cost: u64, ticket: Ticket) -> bool;
    fn cancel<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        ticket: Ticket,
    ) -> Boxed<'a, ()>;
}

impl<B: Backend> Store for B {
    fn answer_now(&self, call: &BackendCall<'_>) -> Option<Answered> {
        self.__answer_now(Sealed::NEW, call)
    }

    fn answer<'a>(&'a self, call: BackendCall<'a>) -> Boxed<'a, Answered> {
        Box::pin(self.__answer(Sealed::NEW, call))
    }

    fn release_now(&self, lease: &LeaseRef<'_>) -> bool {
        self.__release_now(Sealed::NEW, lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> Boxed<'a, ()> {
        Box::pin(self.__release(Sealed::NEW, lease))
    }

    fn peek<'a>(&'a self, rule: &'a Rule, key: &'a str) -> Boxed<'a, Decision> {
        Box::pin(Backend::peek(self, rule, key))
    }

    fn refund<'a>(&'a self, rule: &'a Rule, key: &'a str, charge: Charge) -> Boxed<'a, Decision> {
        Box::pin(Backend::refund(self, rule, key, charge))
    }

    fn reset<'a>(&'a self, rule: &'a Rule, key: &'a str) -> Boxed<'a, Decision> {
        Box::pin(Backend::reset(self, rule, key))
    }

    fn set_limit<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        limit: Option<SubjectLimit>,
    ) -> Boxed<'a, ()> {
        Box::pin(Backend::set_limit(self, rule, key, limit))
    }

    fn answer_all<'a>(
        &'a self,
        checks: &'a [RuleCheck<'a>],
        on_error: OnError,
    ) -> Boxed<'a, Vec<Answered>> {
        Box::pin(self.__answer_all(Sealed::NEW, checks, on_error))
    }

    fn name(&self) -> &'static str {
        self.__name(Sealed::NEW)
    }

    fn reserve_now(
        &self,
        call: &BackendCall<'_>,
        max_wait: Duration,
    ) -> Option<Result<Reserved, Error>> {
        self.__reserve_now(Sealed::NEW, call, max_wait)
    }

    fn reserve<'a>(&'a self, call: BackendCall<'a>, max_wait: Duration) -> Boxed<'a, Reserved> {
        Box::pin(self.__reserve(Sealed::NEW, call, max_wait))
    }

    fn cancel_now(&self, rule: &Rule, key: &str, cost: u64, ticket: Ticket) -> bool {
        self.__cancel_now(Sealed::NEW, rule, key, cost, ticket)
    }

    fn cancel<'a>(
        &'a self,
        rule: &'a Rule,
        key: &'a str,
        cost: u64,
        ticket: Ticket,
    ) -> Boxed<'a, ()> {
        Box::pin(self.__cancel(Sealed::NEW, rule, key, cost, ticket))
    }
}

/// A backend of the application's, kept by the builder until it knows the
/// options of the [`Failover`] that will wrap it.
pub(super) trait CustomBackend: Send + Sync + fmt::Debug + 'static {
    fn with_failover(
        self: Box<Self>,
        insurance: MemoryBackend,
        probe_interval: Duration,
        on_error: OnError,
    ) -> Arc<dyn Store>;
}

impl<B: Backend> CustomBackend for B {
    fn with_failover(
        self: Box<Self>,
        insurance: MemoryBackend,
        probe_interval: Duration,
        on_error: OnError,
    ) -> Arc<dyn Store> {
        Arc::new(Failover::new(*self, insurance, probe_interval, on_error))
    }
}
