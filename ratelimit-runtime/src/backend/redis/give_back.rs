//! Give-backs: what Redis allowed a caller that never heard of it (it
//! stopped waiting, went away, or left its answer unread) is given back
//! where it was counted: its lease released, its check's charge refunded.

use std::sync::Arc;
use std::time::Duration;

use super::codec::{Call, Op, Ran};
use super::connection::Conn;
use super::scripts::Scripts;
use crate::algorithm::{self, Outcome, spec};
use crate::backend::StoredKey;

/// What sends give-backs for callers that are gone (the batch module's
/// `give_back`: a give-back is itself a batch).
pub(super) type SendGiveBacks = fn(
    Vec<(StoredKey, Call)>,
    Arc<Conn>,
    Arc<Scripts>,
    Duration,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Whether `call`, allowed, holds what is given back when its caller never
/// hears of it: a lease, or a check of an algorithm with a refund.
pub(super) fn holds(call: &Call) -> bool {
    matches!(call.op, Op::Check(algorithm)
        if call.lease.is_some() || spec(algorithm).refund.is_some())
        || matches!(call.op, Op::Reserve(_))
}

/// What gives back the units an allowed check took for a caller that did
/// not hear of it: the release of its lease, or a refund of its cost naming
/// what counted it (the stamp of its `outcome`, run at `now`), so that it
/// lands there or nowhere; its key and call. `None` for what is not a
/// check, and where the algorithm has no refund. A reservation that waits
/// is cancelled (naming when it was made and its position); one that went
/// at once is refunded as a check.
pub(super) fn give_back_of(
    key: &StoredKey,
    call: &Call,
    outcome: &Outcome,
    now: Option<u64>,
) -> Option<(StoredKey, Call)> {
    let (op, lease, position) = match call.op {
        Op::Check(_) if call.lease.is_some() => (Op::Release, call.lease, None),
        Op::Check(algorithm) if spec(algorithm).refund.is_some() => {
            let stamp = algorithm::stamp(algorithm, call.period_us, now?, outcome);
            (Op::Refund(algorithm), Some(stamp), None)
        }
        Op::Reserve(algorithm) if outcome.retry_after_us == 0 => {
            let stamp = algorithm::stamp(algorithm, call.period_us, now?, outcome);
            (Op::Refund(algorithm), Some(stamp), None)
        }
        Op::Reserve(algorithm) => (Op::Cancel(algorithm), Some(now?), Some(outcome.remaining)),
        _ => return None,
    };
    let call = Call {
        op,
        lease,
        deadline: None,
        position,
        set: 0,
        ..*call
    };
    Some((key.clone(), call))
}

/// A batch that was answered, for the give-backs of the answers its
/// callers leave unread.
pub(super) struct Settled {
    pub(super) wire: Arc<[(StoredKey, Call)]>,
    pub(super) conn: Arc<Conn>,
    pub(super) scripts: Arc<Scripts>,
    pub(super) timeout: Duration,
    pub(super) send: SendGiveBacks,
}

/// A job's answer on its way to its caller. One that holds what Redis
/// allowed (a lease, a counted check) and is dropped unread, its caller
/// gone after it was sent (an outer timeout, a client that left, while the
/// answer waited for its task to run), gives that back.
pub(super) struct Delivered {
    ran: Ran,
    /// The batch and the job's place in it, while what it holds is not
    /// the caller's yet.
    unread: Option<(Arc<Settled>, usize)>,
}

impl Delivered {
    pub(super) fn new(ran: Ran, unread: Option<(Arc<Settled>, usize)>) -> Delivered {
        Delivered { ran, unread }
    }

    /// The answer, read: what it holds is its caller's from now on.
    pub(super) fn read(mut self) -> Ran {
        self.unread = None;
        self.ran
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        let Some((batch, at)) = self.unread.take() else {
            return;
        };
        let (key, call) = &batch.wire[at];
        let (outcome, now) = &self.ran;
        if let Some(gift) = give_back_of(key, call, outcome, *now)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            tracing::debug!(
                "Redis allowed a check whose caller left its answer unread: given back"
            );
            runtime.spawn((batch.send)(
                vec![gift],
                Arc::clone(&batch.conn),
                Arc::clone(&batch.scripts),
                batch.timeout,
            ));
        }
    }
}
