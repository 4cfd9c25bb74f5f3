//! `GET /changes`: the registry's change feed (gRPC `Registry.Watch`) as
//! server-sent events, so a browser's `EventSource`, or `curl -N`, follows
//! it without a gRPC client.

use std::convert::Infallible;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use futures::StreamExt;
use serde_json::json;

use super::{grpc_request, parse_uint, query_params, single, ApiResult, Caller, HttpState};
use crate::convert::record_pb_to_json;
use crate::pb::{self, registry_server::Registry};

/// One `change` event per revision, its `id` the revision, its data
/// `{"revision", "kind", "record"}` (the record as `GET /agents/{id}`
/// serves it; a deletion's is the tombstone). `from_revision` replays
/// history from there (0, the default: from now on). An `EventSource`
/// that lost the connection sends `Last-Event-ID`, and the feed resumes
/// right after that revision, never skipping or repeating one. A revision
/// older than the history kept is refused (410) before the stream starts;
/// a failure later ends it with an `error` event holding the problem body.
pub(super) async fn follow(
    State(s): State<HttpState>,
    caller: Caller,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["from_revision"])?;
    let from_revision = match headers.get("last-event-id") {
        Some(v) => {
            let last = v.to_str().unwrap_or("not text").to_string();
            parse_uint::<u64>(Some(last), "/Last-Event-ID")?.saturating_add(1)
        }
        None => parse_uint(single(&pairs, "from_revision"), "/from_revision")?,
    };
    let req = grpc_request(&caller, pb::WatchRequest { from_revision });
    let changes = s.api.watch(req).await?.into_inner();
    let events = changes.map(|c| {
        Ok::<_, Infallible>(match c {
            Ok(c) => match c.record.as_ref().map(record_pb_to_json).transpose() {
                Ok(record) => {
                    let kind = pb::ChangeKind::try_from(c.kind)
                        .map(|k| {
                            k.as_str_name()
                                .trim_start_matches("CHANGE_KIND_")
                                .to_lowercase()
                        })
                        .unwrap_or_default();
                    let data = json!({"revision": c.revision, "kind": kind, "record": record});
                    Event::default()
                        .event("change")
                        .id(c.revision.to_string())
                        .data(data.to_string())
                }
                Err(e) => super::error_event(&tonic::Status::internal(format!(
                    "revision {} could not be encoded: {e}",
                    c.revision
                ))),
            },
            Err(status) => super::error_event(&status),
        })
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
