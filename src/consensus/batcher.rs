//! Gathers the client writes that reach the leader together into one log
//! entry (`Command::Batch`).
//!
//! Every log entry costs the leader an fsync, a pass through the Raft core
//! and its own AppendEntries bookkeeping, whatever it holds; under load
//! those per-entry costs, not the records, bound the write rate. So while
//! earlier entries are being committed, the writes that arrive meanwhile
//! wait and go together: a lone write is proposed at once, exactly as
//! before, and under load a batch grows by itself with the time a commit
//! takes — no timer adds latency. Each command of a batch is applied as if
//! it had its own entry (its own revision, audit entry and outcome), and
//! each caller is answered with its own outcome once the entry is applied.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::{info_span, Instrument};

use super::node::{write_error, WriteError};
use super::{CommandResult, Proposal, Raft};

/// Most commands in one entry.
const MAX_BATCH: usize = 256;
/// Entries of gathered writes being committed at once. One would leave the
/// log idle while its answers are sent; more only make batches smaller.
const IN_FLIGHT: usize = 4;
/// Writes waiting for an entry before callers are told to retry.
const QUEUE: usize = 4 * MAX_BATCH;

type Outcome = Result<CommandResult, WriteError>;

struct Waiting {
    proposal: Proposal,
    reply: oneshot::Sender<Outcome>,
}

/// Proposes client writes, gathered into batch entries under load. Cheap to
/// clone.
#[derive(Clone)]
pub struct Batcher {
    queue: mpsc::Sender<Waiting>,
    /// Entries that may be in flight, shared with the gathering task.
    slots: Arc<Semaphore>,
    raft: Raft,
}

impl Batcher {
    /// Starts the gathering task; it ends when the last `Batcher` is
    /// dropped. A batch's encoding stays under `max_bytes` (a single larger
    /// write still goes, alone).
    pub fn start(raft: Raft, max_bytes: usize) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        let limits = Limits {
            items: MAX_BATCH,
            bytes: max_bytes,
        };
        let direct = raft.clone();
        // The separator each write adds to a batch's encoding.
        let size = |w: &Waiting| w.proposal.encoded_len() + 1;
        let propose = move |batch: Vec<Waiting>| {
            let raft = raft.clone();
            let span = info_span!("write_entry", writes = batch.len());
            async move { commit(&raft, batch).await }.instrument(span)
        };
        tokio::spawn(
            gather(rx, slots.clone(), limits, size, propose)
                .instrument(info_span!("write_batcher")),
        );
        Self {
            queue,
            slots,
            raft: direct,
        }
    }

    /// Proposes `proposal` and waits for its outcome.
    pub async fn write(&self, proposal: Proposal) -> Outcome {
        // Nothing waiting and an entry free: the write would go alone
        // anyway, so it is proposed from the caller's task. Handing it to
        // the gathering task and back costs two task switches, a sixth of
        // a lone write's on the leader.
        if self.queue.capacity() == self.queue.max_capacity() {
            if let Ok(_slot) = self.slots.clone().try_acquire_owned() {
                crate::metrics::observe_write_batch(1);
                return propose_alone(&self.raft, proposal).await;
            }
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .try_send(Waiting { proposal, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => WriteError::Unavailable(
                    "too many writes are waiting to be committed; retry shortly".into(),
                ),
                mpsc::error::TrySendError::Closed(_) => {
                    WriteError::Fatal("the write batcher has stopped".into())
                }
            })?;
        answer.await.unwrap_or_else(|_| {
            // The entry's task ended without answering: the Raft core
            // stopped under it, so whether it committed is unknown.
            Err(WriteError::Indeterminate(
                "the write batcher dropped the write; its outcome is unknown".into(),
            ))
        })
    }
}

/// Bounds on what one gathered batch holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most items in one batch.
    pub items: usize,
    /// Most bytes in one batch, by the caller's measure (a single larger
    /// item still goes, alone).
    pub bytes: usize,
}

/// Takes whatever is queued on `rx`, within `limits`, whenever one of
/// `slots` is free (a slot per batch being committed), and hands each
/// batch to `commit` in a task of its own. Ends when every sender is
/// dropped. Shared by the write batcher and the refresh batcher
/// (`service::leases`).
pub(crate) async fn gather<T, F, Fut>(
    mut rx: mpsc::Receiver<T>,
    slots: Arc<Semaphore>,
    limits: Limits,
    size: impl Fn(&T) -> usize,
    commit: F,
) where
    T: Send + 'static,
    F: Fn(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // An item that did not fit the last batch opens the next.
    let mut held: Option<T> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match held.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let mut bytes = size(&first);
        let mut batch = vec![first];
        while batch.len() < limits.items {
            let Ok(next) = rx.try_recv() else { break };
            bytes += size(&next);
            if bytes > limits.bytes {
                held = Some(next);
                break;
            }
            batch.push(next);
        }
        let committed = commit(batch);
        tokio::spawn(async move {
            committed.await;
            drop(slot);
        });
    }
}

/// A write in an entry of its own, as a write always was.
async fn propose_alone(raft: &Raft, proposal: Proposal) -> Outcome {
    raft.client_write(proposal)
        .await
        .map(|r| r.data)
        .map_err(write_error)
}

async fn commit(raft: &Raft, mut batch: Vec<Waiting>) {
    crate::metrics::observe_write_batch(batch.len());
    if batch.len() == 1 {
        let Some(w) = batch.pop() else { return };
        let outcome = propose_alone(raft, w.proposal).await;
        // A caller that went away needs no answer.
        let _ = w.reply.send(outcome);
        return;
    }
    let (proposals, replies): (Vec<Proposal>, Vec<_>) =
        batch.into_iter().map(|w| (w.proposal, w.reply)).unzip();
    let outcomes: Vec<Outcome> = match raft.client_write(Proposal::batch(&proposals)).await {
        Ok(r) => match r.data {
            CommandResult::Batch(results) if results.len() == replies.len() => {
                results.into_iter().map(Ok).collect()
            }
            other => {
                let message = format!(
                    "a batch entry of {} writes produced {other:?}",
                    replies.len()
                );
                replies
                    .iter()
                    .map(|_| Err(WriteError::Fatal(message.clone())))
                    .collect()
            }
        },
        Err(e) => {
            let e = write_error(e);
            replies.iter().map(|_| Err(e.clone())).collect()
        }
    };
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        let _ = reply.send(outcome);
    }
}
