//! Callbacks used by Storage API

use std::io;

use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    done: Completion<C>,
}

/// Who hears of the completion: a task waiting for it, or (for a leader's own
/// appends, which it does not wait for) the `RaftCore`, as a notification.
enum Completion<C>
where C: RaftTypeConfig
{
    Waiting(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    Core {
        vote: crate::Vote<C::NodeId>,
        last_log_id: LogId<C::NodeId>,
        tx: mpsc::UnboundedSender<Notify<C>>,
    },
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            done: Completion::Waiting(tx),
        }
    }

    /// A completion reported to `RaftCore` as [`Notify::LocalLogFlushed`].
    pub(crate) fn notifying(
        vote: crate::Vote<C::NodeId>,
        last_log_id: LogId<C::NodeId>,
        tx: mpsc::UnboundedSender<Notify<C>>,
    ) -> Self {
        Self {
            log_io_id: LogIOId::new(vote.clone(), Some(last_log_id.clone())),
            done: Completion::Core { vote, last_log_id, tx },
        }
    }

    /// True when a task waits for this completion before it goes on (a
    /// follower's append, which it answers only once flushed); false for a
    /// leader's own appends, which the core does not wait for. A log store
    /// may sync such an append in the caller rather than hand it to another
    /// thread, since nothing runs in the caller's place meanwhile.
    pub fn is_awaited(&self) -> bool {
        matches!(self.done, Completion::Waiting(_))
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        match self.done {
            Completion::Waiting(tx) => {
                let res = match result {
                    Err(e) => tx.send(Err(e)),
                    Ok(()) => tx.send(Ok(self.log_io_id)),
                };
                if let Err(e) = res {
                    tracing::error!("failed to send log io completion event: {:?}", e);
                }
            }
            Completion::Core { vote, last_log_id, tx } => {
                let notify = Notify::LocalLogFlushed {
                    vote,
                    last_log_id,
                    result: result.map_err(|e| e.to_string()),
                };
                if tx.send(notify).is_err() {
                    tracing::debug!("RaftCore is gone; log io completion not reported");
                }
            }
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
