//! The audit trail's use cases: every write and admin request runs inside an
//! audit scope (opened by the gate, on both transports). A command the
//! request proposes (`propose`) carries the scope's context, and `apply` records its
//! outcome in the replicated trail; a request that ends without proposing
//! anything (refused, or an admin action outside the state machine) is
//! recorded here, on this node.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use super::ServiceError;
use crate::consensus::{Command, CommandResult, RaftNode, WriteError};
use crate::domain::audit::{AuditContext, AuditEntry, AuditQuery, Outcome};
use crate::domain::{Principal, Role};
use crate::storage::{AuditCursor, AuditSink, AuditStore, Retention, Rotation};

type Result<T> = std::result::Result<T, ServiceError>;

/// `[audit]`: retention and the optional JSON-lines copy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Entries kept in the committed trail, and in each node's refusals.
    pub max_entries: u64,
    /// Entries older than this many days are dropped.
    pub max_age_days: u64,
    /// Append every entry this node records (committed and refused) to
    /// this file as one JSON object per line.
    pub file: Option<PathBuf>,
    /// The file is rotated before a line would take it past this size;
    /// 0: never (another tool rotates it).
    pub file_max_bytes: u64,
    /// Rotated files kept; 0: all.
    pub file_max_files: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        let r = Retention::default();
        Self {
            max_entries: r.max_entries,
            max_age_days: r.max_age_secs / 86_400,
            file: None,
            // With the default trail of a million entries of a few hundred
            // bytes, the files hold at least what the trail does.
            file_max_bytes: 100 * 1024 * 1024,
            file_max_files: 10,
        }
    }
}

impl AuditConfig {
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.max_entries < 1000 || self.max_age_days == 0 {
            return Err(
                "audit: max_entries must be at least 1000 and max_age_days at least 1".into(),
            );
        }
        if self.file_max_bytes != 0 && self.file_max_bytes < 4096 {
            return Err("audit: file_max_bytes must be 0 (never rotated) or at least 4096".into());
        }
        Ok(())
    }

    pub fn retention(&self) -> Retention {
        Retention {
            max_entries: self.max_entries,
            max_age_secs: self.max_age_days.saturating_mul(86_400),
        }
    }

    /// Opens `file`, if one is set, and starts its writer.
    pub fn sink(&self) -> std::io::Result<Option<AuditSink>> {
        let Some(path) = &self.file else {
            return Ok(None);
        };
        let rotation = Rotation {
            max_bytes: self.file_max_bytes,
            max_files: self.file_max_files,
        };
        crate::storage::audit_file_sink(path.clone(), rotation).map(Some)
    }

    /// What [`Self::sink`] would open, checked without creating it.
    pub fn check_sink(&self) -> std::io::Result<()> {
        match &self.file {
            Some(path) => crate::storage::check_audit_file(path),
            None => Ok(()),
        }
    }
}

tokio::task_local! {
    static SCOPE: Arc<Scope>;
}

/// One audited request: who asked, from where, and what it became.
pub struct Scope {
    principal: Option<Principal>,
    address: Option<String>,
    correlation_id: String,
    state: Mutex<ScopeState>,
}

struct ScopeState {
    operation: String,
    target: Option<String>,
    proposed: bool,
    error: Option<(String, String)>,
}

impl Scope {
    /// `operation` is the transport's name for the request until the
    /// service names it (`begin`).
    pub fn new(
        principal: Option<Principal>,
        address: Option<String>,
        correlation_id: Option<&str>,
        operation: String,
    ) -> Self {
        // A client's own request id is kept if it is short and printable.
        let correlation_id = correlation_id
            .filter(|c| !c.is_empty() && c.len() <= 128 && c.chars().all(|c| c.is_ascii_graphic()))
            .map(String::from)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        Self {
            principal,
            address,
            correlation_id,
            state: Mutex::new(ScopeState {
                operation,
                target: None,
                proposed: false,
                error: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ScopeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn context(&self) -> AuditContext {
        let s = self.state();
        AuditContext {
            principal: self.principal.clone(),
            address: self.address.clone(),
            operation: s.operation.clone(),
            target: s.target.clone(),
            correlation_id: self.correlation_id.clone(),
        }
    }
}

/// Names the operation and its target in the current request's scope (a
/// no-op outside one).
pub fn begin(operation: &str, target: Option<&str>) {
    let _ = SCOPE.try_with(|s| {
        let mut st = s.state();
        st.operation = operation.to_string();
        st.target = target.filter(|t| !t.is_empty()).map(String::from);
    });
}

/// Proposes `command`; inside an audited request it carries who asked, and
/// once the cluster has answered the request counts as recorded by `apply`
/// (a write that failed before that — no leader, say — is recorded here).
pub async fn propose(
    node: &RaftNode,
    command: Command,
) -> std::result::Result<CommandResult, WriteError> {
    let command = match SCOPE.try_with(|s| s.context()) {
        Ok(audit) => Command::Audited {
            command: Box::new(command),
            audit,
        },
        Err(_) => command,
    };
    let result = node.write(command).await;
    if result.is_ok() {
        let _ = SCOPE.try_with(|s| s.state().proposed = true);
    }
    result
}

/// Notes the error the caller is answered with.
pub fn note_error(code: &str, message: &str) {
    let _ = SCOPE.try_with(|s| s.state().error = Some((code.into(), message.into())));
}

/// The current request's correlation id, if it is audited.
pub fn correlation_id() -> Option<String> {
    SCOPE.try_with(|s| s.correlation_id.clone()).ok()
}

/// Records a request that was dropped before it answered (its deadline
/// passed, or the client went away, and the server stopped its work), when
/// it had proposed nothing: without this such an attempt left no entry.
/// A change proposed and committed before the drop also has its own
/// entry, written by `apply`.
struct Unanswered<'a> {
    log: &'a AuditLog,
    /// `None` once the request answered.
    scope: Option<Arc<Scope>>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(scope) = self.scope.take() else {
            return;
        };
        if scope.state().proposed {
            return;
        }
        let outcome = Outcome::refused(
            crate::domain::audit::CANCELLED,
            "the request ended before it was answered: its deadline passed or the client went \
             away"
                .into(),
        );
        self.log.record(&scope, outcome);
    }
}

/// The audit trail of this node: runs audited requests, records what they
/// did not propose, lists the trail.
pub struct AuditLog {
    store: AuditStore,
}

impl AuditLog {
    pub fn new(store: AuditStore) -> Self {
        Self { store }
    }

    /// See [`AuditStore::watch_installs`].
    pub fn watch_installs(&self, reader: crate::storage::Reader) {
        self.store.watch_installs(reader);
    }

    /// Runs `fut` as the audited request `scope`; if it proposed nothing,
    /// records its outcome on this node, also when `fut` is dropped before
    /// it answers (`Unanswered`).
    pub async fn run<F: Future>(&self, scope: Scope, fut: F) -> F::Output {
        let scope = Arc::new(scope);
        let mut unanswered = Unanswered {
            log: self,
            scope: Some(scope.clone()),
        };
        let out = SCOPE.scope(scope.clone(), fut).await;
        unanswered.scope = None;
        let (proposed, error) = {
            let s = scope.state();
            (s.proposed, s.error.clone())
        };
        if !proposed {
            let outcome = match error {
                Some((code, message)) => Outcome::refused(&code, message),
                None => Outcome::ok(None),
            };
            self.record(&scope, outcome);
        }
        out
    }

    fn record(&self, scope: &Scope, outcome: Outcome) {
        let entry = scope.context().entry(&crate::domain::time::now(), outcome);
        if let Err(e) = self.store.record_local(entry) {
            tracing::error!(error = %e, "an audit entry could not be stored");
        }
    }

    /// One page of the trail (admins only).
    pub fn list(
        &self,
        principal: Option<&Principal>,
        query: &AuditQuery,
        page_token: &str,
        page_size: usize,
    ) -> Result<(Vec<AuditEntry>, String)> {
        match principal {
            Some(p) if p.role == Role::Admin => {}
            Some(_) => {
                return Err(ServiceError::Forbidden(
                    "the audit trail is for admins".into(),
                ))
            }
            None => {
                return Err(ServiceError::Unauthorized(
                    "the audit trail needs an admin credential".into(),
                ))
            }
        }
        let cursor = decode_cursor(page_token)?;
        let (entries, next) = self.store.list(query, cursor, page_size.clamp(1, 1000))?;
        Ok((entries, next.map(encode_cursor).unwrap_or_default()))
    }
}

fn encode_cursor(c: AuditCursor) -> String {
    format!("{}.{}", c.committed, c.local)
}

fn decode_cursor(token: &str) -> Result<AuditCursor> {
    if token.is_empty() {
        return Ok(AuditCursor::default());
    }
    token
        .split_once('.')
        .and_then(|(c, l)| {
            Some(AuditCursor {
                committed: c.parse().ok()?,
                local: l.parse().ok()?,
            })
        })
        .ok_or_else(|| ServiceError::InvalidRequest {
            field: Some("/page_token".into()),
            message: "page_token is not a token this registry issued".into(),
        })
}
