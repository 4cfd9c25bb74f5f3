//! The one mapping from service errors to the wire. Every error carries an
//! `ErrorDetail` (ADP code, message, field, HTTP status, correlation id) in
//! the gRPC status details, wrapped in gRPC's `google.rpc.Status`; the HTTP
//! facade turns that same detail into the
//! problem+json body of SPECS.md, so gRPC and JSON clients can never disagree.

use prost::Message;
use serde_json::{json, Value};
use tonic::{Code, Status};

use crate::pb;
use crate::service::ServiceError;

/// Metadata key carrying the leader's address when a node cannot commit.
pub const LEADER_METADATA: &str = "x-agentry-leader";

/// Metadata key of an error's own challenge, which the HTTP facade answers
/// in `WWW-Authenticate` instead of the registry's (`agent_challenge`).
pub const CHALLENGE_METADATA: &str = "www-authenticate";

/// The challenge of a 401 that is about the call's credential for an
/// agent, not the caller's registry key: a scheme no registry client
/// answers with its own token (so an OAuth client does not drop a good
/// one), naming the agent and the header its credential goes in. The
/// agent's own challenge, when it sent one, travels beside it
/// (`Agent-Authenticate`, `InvokeResult.agent_challenge`).
pub fn agent_challenge(agent: &str) -> String {
    let mut realm = String::new();
    for c in agent
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(300)
    {
        if matches!(c, '"' | '\\') {
            realm.push('\\');
        }
        realm.push(c);
    }
    format!("Agent realm=\"{realm}\", header=\"Agent-Authorization\"")
}

/// ADP code, gRPC code and HTTP status of each error kind.
fn classify(e: &ServiceError) -> (&'static str, Code, u16) {
    match e {
        ServiceError::InvalidRequest { .. } => ("invalid_request", Code::InvalidArgument, 400),
        ServiceError::Unauthorized(_) | ServiceError::AgentCredentialRequired { .. } => {
            ("unauthorized", Code::Unauthenticated, 401)
        }
        ServiceError::Forbidden(_) | ServiceError::Denied { .. } => {
            ("forbidden", Code::PermissionDenied, 403)
        }
        ServiceError::NotFound(_) => ("not_found", Code::NotFound, 404),
        ServiceError::Gone(_) => ("not_found", Code::NotFound, 410),
        ServiceError::Conflict(_) => ("conflict", Code::AlreadyExists, 409),
        ServiceError::PreconditionFailed(_) => ("conflict", Code::FailedPrecondition, 412),
        ServiceError::Stale(_) => ("stale_metadata", Code::FailedPrecondition, 409),
        ServiceError::RevisionCompacted { .. } => ("not_found", Code::OutOfRange, 410),
        ServiceError::Unavailable { .. } => ("unavailable", Code::Unavailable, 503),
        ServiceError::InsufficientStorage(_) => {
            ("insufficient_storage", Code::ResourceExhausted, 507)
        }
        ServiceError::Timeout(_) => ("timeout", Code::DeadlineExceeded, 504),
        // An upstream answer from another address space: grpc's Unknown.
        ServiceError::BadUpstream(_) => ("bad_gateway", Code::Unknown, 502),
        ServiceError::Overloaded { .. } => ("unavailable", Code::Unavailable, 503),
        ServiceError::RateLimited { .. } => ("rate_limited", Code::ResourceExhausted, 429),
        ServiceError::Unsupported(_) => ("unsupported", Code::Unimplemented, 501),
        ServiceError::Internal(_) => ("internal", Code::Internal, 500),
    }
}

/// Converts a service error to a gRPC status with its `ErrorDetail`.
pub fn to_status(e: &ServiceError) -> Status {
    let (code, grpc, http_status) = classify(e);
    let correlation_id =
        crate::service::audit::correlation_id().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    crate::service::audit::note_error(code, &e.to_string());
    let field = match e {
        ServiceError::InvalidRequest { field, .. } | ServiceError::Denied { field, .. } => {
            field.clone()
        }
        _ => None,
    };
    let retry_after = match e {
        ServiceError::Unavailable { .. } => Some(1),
        // Space is freed by a person or a compaction: not within a second.
        ServiceError::InsufficientStorage(_) => Some(10),
        ServiceError::Overloaded { retry_after, .. } => Some(retry_after.map_or(1, u64::from)),
        ServiceError::RateLimited { retry_after, .. } => Some(u64::from(*retry_after)),
        _ => None,
    };
    if http_status >= 500 {
        tracing::warn!(%correlation_id, error = %e, "request failed");
    } else {
        tracing::debug!(%correlation_id, error = %e, "request refused");
    }
    let detail = pb::ErrorDetail {
        code: code.to_string(),
        message: e.to_string(),
        field,
        http_status: u32::from(http_status),
        correlation_id,
        retry_after,
    };
    let mut status = detail_status(grpc, detail);
    if let ServiceError::Unavailable {
        leader: Some(l), ..
    } = e
    {
        if let Ok(v) = l.parse() {
            status.metadata_mut().insert(LEADER_METADATA, v);
        }
    }
    if let ServiceError::AgentCredentialRequired { agent, .. } = e {
        if let Ok(v) = agent_challenge(agent).parse() {
            status.metadata_mut().insert(CHALLENGE_METADATA, v);
        }
    }
    status
}

/// The type URL of `ErrorDetail` inside a `google.rpc.Status`.
pub const ERROR_DETAIL_TYPE: &str = "type.googleapis.com/agentry.v1.ErrorDetail";

/// A status whose details are gRPC's rich error model, a `google.rpc.Status`
/// holding the `ErrorDetail`, so stock clients (grpc-status, grpc-go's
/// status package, grpcurl) can read it.
fn detail_status(grpc: Code, mut detail: pb::ErrorDetail) -> Status {
    // Messages quote what was wrong, and a client may send a 70 KB string:
    // echoed whole, it would push the trailers past what gRPC clients
    // accept (grpc-core drops a stream whose metadata passes 16 KiB), and
    // the client would lose the answer.
    detail.message = elide(&detail.message, 700, 300);
    detail.field = detail.field.map(|f| elide(&f, 300, 100));
    let rich = crate::rpc_pb::Status {
        code: grpc as i32,
        message: detail.message.clone(),
        details: vec![prost_types::Any {
            type_url: ERROR_DETAIL_TYPE.into(),
            value: detail.encode_to_vec(),
        }],
    };
    Status::with_details(grpc, detail.message, rich.encode_to_vec().into())
}

/// The `ErrorDetail` in a status's details: inside a `google.rpc.Status`,
/// or bare, as servers before the rich error model sent it.
fn carried_detail(details: &[u8]) -> Option<pb::ErrorDetail> {
    let from_rich = crate::rpc_pb::Status::decode(details)
        .ok()
        .and_then(|rich| {
            rich.details
                .into_iter()
                .find(|any| any.type_url == ERROR_DETAIL_TYPE)
        })
        .and_then(|any| pb::ErrorDetail::decode(any.value.as_slice()).ok());
    from_rich
        .or_else(|| pb::ErrorDetail::decode(details).ok())
        .filter(|d| !d.code.is_empty())
}

/// A request the HTTP facade refuses before any handler sees it (wrong
/// method, media type or body size): `invalid_request` with the HTTP status
/// that names the problem precisely (405, 413, 415).
pub fn transport_refusal(http_status: u16, message: String) -> Status {
    refusal(Code::InvalidArgument, http_status, message)
}

fn refusal(grpc: Code, http_status: u16, message: String) -> Status {
    detail_status(grpc, refusal_detail(http_status, message))
}

/// The detail of a request refused before any service saw it:
/// `invalid_request` with the HTTP status that names the problem. Also the
/// body of answers given outside the gRPC status path (an HTTP/1.1 request
/// on a gRPC listener).
pub fn refusal_detail(http_status: u16, message: String) -> pb::ErrorDetail {
    // Inside an audited request the trail records the refusal (and shares
    // its correlation id), as it does for a service error.
    crate::service::audit::note_error("invalid_request", &message);
    pb::ErrorDetail {
        code: "invalid_request".into(),
        message,
        field: None,
        http_status: u32::from(http_status),
        correlation_id: crate::service::audit::correlation_id()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        retry_after: None,
    }
}

/// `message` cut to about `head` + `tail` bytes: its start (what was
/// wrong) and its end (often the cause), joined by an ellipsis.
fn elide(message: &str, head: usize, tail: usize) -> String {
    if message.len() <= head + tail {
        return message.to_string();
    }
    let boundary = |i: &usize| message.is_char_boundary(*i);
    let head_end = (0..=head).rev().find(boundary).unwrap_or(0);
    let tail_start = (message.len() - tail..message.len())
        .find(boundary)
        .unwrap_or(message.len());
    let (head, tail) = (&message[..head_end], &message[tail_start..]);
    format!("{head} … {tail}")
}

/// Gives a status tonic answered with by itself, before any handler ran
/// (the request's bytes did not decode, were over the size limit, or named
/// no method), the `ErrorDetail` every other answer carries, under the code
/// that puts the fault where it is. tonic calls an undecodable request
/// `Internal`, as gRPC's status-code table does; that would count a
/// client's garbage as a server fault on every dashboard and alert, so it
/// is `InvalidArgument` here, as any other request that fails validation.
/// An oversized message is `ResourceExhausted`, as gRPC's table says (tonic
/// says `OutOfRange`). Other statuses pass unchanged.
pub fn with_transport_detail(status: Status) -> Status {
    if status.code() == Code::Ok || carried_detail(status.details()).is_some() {
        return status;
    }
    let message = status.message().to_string();
    match status.code() {
        Code::Internal if message.starts_with("failed to decode Protobuf message") => {
            to_status(&ServiceError::InvalidRequest {
                field: None,
                // A decoding error names every field on its path, which
                // for a deeply nested value is kilobytes of
                // `Value.kind: ListValue.values: …`.
                message: format!(
                    "the request is not a valid message for this method: {}",
                    elide(&message, 160, 120)
                ),
            })
        }
        // The request's own framing: a message flagged compressed with no
        // `grpc-encoding`, or a body that ends inside a message (its length
        // prefix promised more). The client's fault, not the server's.
        Code::Internal
            if message.contains("compressed-flag but no grpc-encoding")
                || message.starts_with("Unexpected EOF decoding stream") =>
        {
            to_status(&ServiceError::InvalidRequest {
                field: None,
                message: format!("the request's gRPC framing is wrong: {message}"),
            })
        }
        // A gzip-compressed request whose bytes do not inflate.
        Code::Internal if message.starts_with("Error decompressing") => {
            to_status(&ServiceError::InvalidRequest {
                field: None,
                message: format!("the request's compressed message does not decompress: {message}"),
            })
        }
        Code::OutOfRange if message.contains("message length too large") => {
            refusal(Code::ResourceExhausted, 413, message)
        }
        // One that inflates past the message limit (a zip bomb among them).
        Code::ResourceExhausted if message.starts_with("Error decompressing: size limit") => {
            refusal(Code::ResourceExhausted, 413, message)
        }
        Code::Unimplemented => to_status(&ServiceError::Unsupported(message)),
        _ => status,
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Self {
        to_status(&e)
    }
}

/// The grpc-gateway table, for statuses that carry no `ErrorDetail` (from
/// tonic itself rather than from Agentry).
fn gateway_mapping(code: Code) -> (&'static str, u16) {
    match code {
        Code::Ok => ("ok", 200),
        Code::InvalidArgument | Code::OutOfRange => ("invalid_request", 400),
        Code::FailedPrecondition => ("invalid_request", 400),
        Code::Unauthenticated => ("unauthorized", 401),
        Code::PermissionDenied => ("forbidden", 403),
        Code::NotFound => ("not_found", 404),
        Code::AlreadyExists | Code::Aborted => ("conflict", 409),
        Code::ResourceExhausted => ("rate_limited", 429),
        Code::Cancelled => ("cancelled", 499),
        Code::Unimplemented => ("not_implemented", 501),
        Code::Unavailable => ("unavailable", 503),
        Code::DeadlineExceeded => ("timeout", 504),
        Code::Unknown | Code::Internal | Code::DataLoss => ("internal", 500),
    }
}

/// Decodes the `ErrorDetail` of a status, synthesising one when absent.
pub fn detail_of(status: &Status) -> pb::ErrorDetail {
    if let Some(d) = carried_detail(status.details()) {
        return d;
    }
    let (code, http) = gateway_mapping(status.code());
    pb::ErrorDetail {
        code: code.into(),
        message: status.message().to_string(),
        field: None,
        http_status: u32::from(http),
        correlation_id: uuid::Uuid::new_v4().to_string(),
        retry_after: None,
    }
}

/// The problem+json body (RFC 9457) carrying ADP's and AIDIP's members too.
pub fn problem_body(d: &pb::ErrorDetail, instance: &str) -> Value {
    let status = u16::try_from(d.http_status).unwrap_or(500);
    let title = axum::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut body = json!({
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": d.message,
        "instance": instance,
        "code": d.code,
        "message": d.message,
        "correlation_id": d.correlation_id,
        "error": {"code": d.code, "message": d.message},
    });
    if let Some(f) = &d.field {
        body["field"] = json!(f);
    }
    if let Some(r) = d.retry_after {
        body["retry_after"] = json!(r);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::audit::OUTCOMES;
    use crate::domain::write::{QuotaScope, Rejection};

    /// The audit trail records the code a caller was answered with, and its
    /// listing refuses an outcome filter outside `OUTCOMES`: every code an
    /// error can be answered with is in that list, and a rejection applied
    /// by the state machine (recorded by its own `code`) reads the same as
    /// the answer its caller got.
    /// An agent's id is the caller's to choose (within the record's
    /// rules): quoted in the challenge, it can neither end the realm early
    /// nor break the header.
    #[test]
    fn an_agent_challenge_quotes_the_agent_and_is_a_header_value() {
        assert_eq!(
            agent_challenge("urn:acme:weather"),
            r#"Agent realm="urn:acme:weather", header="Agent-Authorization""#
        );
        let hostile = agent_challenge("a\"b\\\r\nset-cookie: x");
        assert_eq!(
            hostile,
            r#"Agent realm="a\"b\\set-cookie: x", header="Agent-Authorization""#
        );
        assert!(axum::http::HeaderValue::from_str(&hostile).is_ok());
        let status = to_status(&ServiceError::AgentCredentialRequired {
            agent: "weather".into(),
            message: "agent 'weather' requires bearer authentication".into(),
        });
        assert_eq!(status.code(), Code::Unauthenticated);
        assert_eq!(
            status.metadata().get(CHALLENGE_METADATA).unwrap(),
            &agent_challenge("weather")
        );
    }

    #[test]
    fn every_answered_code_is_a_listed_audit_outcome() {
        let s = || "m".to_string();
        let errors = [
            ServiceError::InvalidRequest {
                field: None,
                message: s(),
            },
            ServiceError::Unauthorized(s()),
            ServiceError::AgentCredentialRequired {
                agent: s(),
                message: s(),
            },
            ServiceError::Forbidden(s()),
            ServiceError::Denied {
                field: None,
                message: s(),
            },
            ServiceError::NotFound(s()),
            ServiceError::Gone(s()),
            ServiceError::Conflict(s()),
            ServiceError::PreconditionFailed(s()),
            ServiceError::Stale(s()),
            ServiceError::RevisionCompacted {
                requested: 1,
                oldest: 2,
            },
            ServiceError::Unavailable {
                message: s(),
                leader: None,
            },
            ServiceError::InsufficientStorage(s()),
            ServiceError::Timeout(s()),
            ServiceError::BadUpstream(s()),
            ServiceError::Overloaded {
                message: s(),
                retry_after: None,
            },
            ServiceError::RateLimited {
                message: s(),
                retry_after: 1,
            },
            ServiceError::Unsupported(s()),
            ServiceError::Internal(s()),
        ];
        for e in &errors {
            // A variant added to the error type fails to compile here
            // until it is listed above.
            match e {
                ServiceError::InvalidRequest { .. }
                | ServiceError::Unauthorized(_)
                | ServiceError::AgentCredentialRequired { .. }
                | ServiceError::Forbidden(_)
                | ServiceError::Denied { .. }
                | ServiceError::NotFound(_)
                | ServiceError::Gone(_)
                | ServiceError::Conflict(_)
                | ServiceError::PreconditionFailed(_)
                | ServiceError::Stale(_)
                | ServiceError::RevisionCompacted { .. }
                | ServiceError::Unavailable { .. }
                | ServiceError::InsufficientStorage(_)
                | ServiceError::Timeout(_)
                | ServiceError::BadUpstream(_)
                | ServiceError::Overloaded { .. }
                | ServiceError::RateLimited { .. }
                | ServiceError::Unsupported(_)
                | ServiceError::Internal(_) => {}
            }
            let code = classify(e).0;
            assert!(OUTCOMES.contains(&code), "{code} is not an audit outcome");
        }
        let rejections = [
            Rejection::NotFound { id: s() },
            Rejection::Deleted {
                id: s(),
                revision: 1,
            },
            Rejection::OwnedByOther { id: s() },
            Rejection::Forbidden {
                id: s(),
                principal: s(),
            },
            Rejection::IncompatibleBindings {
                id: s(),
                stored: s(),
            },
            Rejection::Stale {
                id: s(),
                detail: s(),
            },
            Rejection::KeyNotFound { key_id: s() },
            Rejection::KeyForbidden { key_id: s() },
            Rejection::KeyConflict { key_id: s() },
            Rejection::Unchanged { id: s() },
            Rejection::Federated {
                id: s(),
                authority: s(),
            },
            Rejection::RevisionChanged {
                id: s(),
                expected: 1,
                actual: 2,
            },
            Rejection::LeaseNotFound { lease: s() },
            Rejection::LeaseForbidden {
                lease: s(),
                principal: s(),
            },
            Rejection::QuotaExceeded {
                id: s(),
                scope: QuotaScope::Owner,
                limit: 1,
            },
        ];
        for r in rejections {
            match &r {
                Rejection::NotFound { .. }
                | Rejection::Deleted { .. }
                | Rejection::OwnedByOther { .. }
                | Rejection::Forbidden { .. }
                | Rejection::IncompatibleBindings { .. }
                | Rejection::Stale { .. }
                | Rejection::KeyNotFound { .. }
                | Rejection::KeyForbidden { .. }
                | Rejection::KeyConflict { .. }
                | Rejection::Unchanged { .. }
                | Rejection::Federated { .. }
                | Rejection::RevisionChanged { .. }
                | Rejection::LeaseNotFound { .. }
                | Rejection::LeaseForbidden { .. }
                | Rejection::QuotaExceeded { .. } => {}
            }
            let recorded = r.code();
            let answered = classify(&ServiceError::from(r.clone())).0;
            assert_eq!(recorded, answered, "{r}");
        }
    }

    #[test]
    fn status_and_problem_agree() {
        let e = ServiceError::InvalidRequest {
            field: Some("/name".into()),
            message: "/name: is required".into(),
        };
        let s = to_status(&e);
        assert_eq!(s.code(), Code::InvalidArgument);
        let d = detail_of(&s);
        assert_eq!(
            (d.code.as_str(), d.http_status, d.field.as_deref()),
            ("invalid_request", 400, Some("/name"))
        );
        let body = problem_body(&d, "/agents");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert_eq!(body["status"], 400);
    }

    #[test]
    fn the_detail_travels_in_grpcs_rich_error_model() {
        let s = to_status(&ServiceError::NotFound("agent 'x'".into()));
        let rich = crate::rpc_pb::Status::decode(s.details()).unwrap();
        assert_eq!(rich.code, Code::NotFound as i32);
        assert_eq!(rich.message, s.message());
        assert_eq!(rich.details.len(), 1);
        assert_eq!(rich.details[0].type_url, ERROR_DETAIL_TYPE);
        let inner = pb::ErrorDetail::decode(rich.details[0].value.as_slice()).unwrap();
        assert_eq!(inner, detail_of(&s));
        assert_eq!(inner.code, "not_found");
        // A bare detail, as older servers sent it, still reads.
        let bare = Status::with_details(Code::NotFound, "gone", inner.encode_to_vec().into());
        assert_eq!(detail_of(&bare), inner);
    }

    #[test]
    fn what_tonic_refuses_gets_a_detail_and_a_short_message() {
        let stack = "Value.kind: ListValue.values: ".repeat(60);
        let s = with_transport_detail(Status::internal(format!(
            "failed to decode Protobuf message: {stack}recursion limit reached é"
        )));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().ends_with("recursion limit reached é"), "{s:?}");
        assert!(s.message().len() < 400, "{s:?}");
        assert_eq!(detail_of(&s).code, "invalid_request");
        let wide = "é".repeat(400);
        let cut = elide(&wide, 160, 120);
        assert!(cut.len() <= 160 + 120 + 5, "{cut}");
        let own = to_status(&ServiceError::NotFound("agent 'x'".into()));
        assert_eq!(with_transport_detail(own.clone()).details(), own.details());
        let other = with_transport_detail(Status::internal("the disk is on fire"));
        assert_eq!(other.code(), Code::Internal);
    }

    /// A message quoting a huge value stays small enough for any gRPC
    /// client's metadata limit (grpc-core: 16 KiB), on both transports.
    #[test]
    fn a_message_quoting_a_huge_value_is_cut() {
        let huge = "a".repeat(70_000);
        let s = to_status(&ServiceError::InvalidRequest {
            field: Some(format!("/metadata/{huge}")),
            message: format!("'{huge}' is not a known protocol (expected one of a2a, mcp)"),
        });
        assert!(s.message().len() < 1_100, "{}", s.message().len());
        assert!(s.message().starts_with("'aaa"));
        assert!(s.message().ends_with("(expected one of a2a, mcp)"));
        assert!(s.details().len() < 3_000, "{}", s.details().len());
        let d = detail_of(&s);
        assert_eq!(d.message, s.message());
        assert!(d
            .field
            .is_some_and(|f| f.starts_with("/metadata/aa") && f.len() < 500));
        let short = to_status(&ServiceError::NotFound("agent 'x'".into()));
        assert_eq!(short.message(), "agent 'x'");
    }

    #[test]
    fn tonic_statuses_without_detail_use_the_gateway_table() {
        let d = detail_of(&Status::resource_exhausted("too big"));
        assert_eq!((d.code.as_str(), d.http_status), ("rate_limited", 429));
    }
}
