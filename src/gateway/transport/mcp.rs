//! MCP (`mcp`): a WoA envelope becomes a `tools/call` over Streamable
//! HTTP (WoA 5.3), in a session kept per server and credential
//! (`mcp_session`) on the guarded client.

use axum::body::Bytes;
use serde_json::{json, Value};

use super::mcp_session::in_session;
use super::{endpoint, redacted, Answer, CallSpec, GatewayError, Outbound, OutboundError};

/// The MCP tool a call goes to, read from the binding as the domain reads
/// it (`domain::invoke::mcp_tool`), so a call that passed operation
/// selection names its tool here.
fn mcp_tool<'a>(spec: &CallSpec<'a>) -> Result<&'a str, GatewayError> {
    crate::domain::invoke::mcp_tool(spec.binding, spec.operation).ok_or_else(|| {
        GatewayError::Unsupported(format!(
            "the mcp binding to {} names no tool, and the call names no operation",
            spec.binding.endpoint
        ))
    })
}

/// The rmcp client of one session.
pub(crate) type Session = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// A handle on a session's client for one request (the request's future
/// owns it, so it can be sent again in another session).
pub(crate) type Peer = rmcp::Peer<rmcp::RoleClient>;

/// What a kept MCP session sends on every request, from a call's
/// `headers`: the credential, in the header the agent expects (an API key
/// in `X-API-Key` or the header its record names, a token in
/// `Authorization`). A session's requests share their headers, so an
/// `Idempotency-Key`, which belongs to one call, stays behind. A bare
/// token in `Authorization` is sent as `Bearer <token>`, the form MCP's
/// authorization requires.
pub(crate) fn session_headers(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(h, _)| !h.eq_ignore_ascii_case("idempotency-key"))
        .map(|(h, v)| {
            let bare = !v.trim().contains(' ');
            if h.eq_ignore_ascii_case("authorization") && bare {
                (h.clone(), format!("Bearer {}", v.trim()))
            } else {
                (h.clone(), v.clone())
            }
        })
        .collect()
}

/// A WoA envelope as an MCP `tools/call`.
pub(super) async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    use rmcp::model::CallToolRequestParams;

    let url = endpoint(spec.binding)?;
    let tool = mcp_tool(spec)?;
    let arguments = match spec.input {
        Value::Object(m) => Some(m.clone()),
        _ => None,
    };
    let what = format!("tools/call '{tool}'");
    let tool = tool.to_string();
    let called = in_session(
        out,
        &url,
        session_headers(&spec.headers),
        &what,
        |peer: Peer| {
            let params = CallToolRequestParams {
                meta: None,
                name: tool.clone().into(),
                arguments: arguments.clone(),
                task: None,
            };
            async move { peer.call_tool(params).await }
        },
    )
    .await;
    match called {
        Ok(result) => mcp_answer(result, &redacted(&url), out.policy.max_response_bytes),
        // The server's refusal goes to the caller as a REST agent's 401 or
        // 403 would (and a token of the gateway's own is dropped).
        Err(GatewayError::Refused {
            status,
            message,
            challenge,
        }) => {
            let json = json!({"error": message});
            Ok(Answer {
                status,
                body: Bytes::from(json.to_string()),
                json,
                content_type: "application/json".into(),
                retry_after: None,
                challenge,
            })
        }
        Err(e) => Err(e),
    }
}

/// The tool's result as the agent's JSON output: its structured content,
/// else a single text item that is JSON, else the content list itself.
fn mcp_answer(
    result: rmcp::model::CallToolResult,
    target: &str,
    limit: usize,
) -> Result<Answer, GatewayError> {
    let text = |r: &rmcp::model::CallToolResult| -> Vec<String> {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    };
    if result.is_error == Some(true) {
        let mut why = text(&result).join(" ");
        why.truncate(300);
        return Err(GatewayError::BadAnswer(format!(
            "the MCP tool at {target} reported an error: {why}"
        )));
    }
    let json = match (&result.structured_content, text(&result).as_slice()) {
        (Some(v), _) => v.clone(),
        (None, [one]) => serde_json::from_str::<Value>(one)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({"content": result.content})),
        _ => json!({"content": result.content}),
    };
    let body = serde_json::to_vec(&json).map_err(|e| GatewayError::BadAnswer(e.to_string()))?;
    if body.len() > limit {
        return Err(OutboundError::TooLarge {
            target: target.into(),
            limit,
        }
        .into());
    }
    Ok(Answer {
        status: 200,
        body: Bytes::from(body),
        json,
        content_type: "application/json".into(),
        retry_after: None,
        challenge: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{binding, spec};
    use super::*;

    #[test]
    fn a_session_carries_the_credential_in_its_header_and_no_idempotency_key() {
        let call = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        };
        // An API key in the header the agent reads, as it is.
        assert_eq!(
            session_headers(&call(&[("X-API-Key", "k 1"), ("Idempotency-Key", "r")])),
            call(&[("X-API-Key", "k 1")])
        );
        // A bare token in Authorization is MCP's bearer; a value with its
        // scheme is sent as it is.
        assert_eq!(
            session_headers(&call(&[("Authorization", "tok")])),
            call(&[("Authorization", "Bearer tok")])
        );
        assert_eq!(
            session_headers(&call(&[("authorization", "Basic dTpw")])),
            call(&[("authorization", "Basic dTpw")])
        );
    }

    #[test]
    fn the_tool_is_named_by_the_field_the_binding_says() {
        let input = json!({"text": "hi"});
        let mcp = binding("mcp", json!({"woa_agent": "echo", "tool_field": "agent"}));
        assert_eq!(mcp_tool(&spec(&mcp, &input, None, false)).unwrap(), "echo");
        let by_op = binding("mcp", json!({"tool_field": "operation"}));
        assert_eq!(
            mcp_tool(&spec(&by_op, &input, Some("sum"), false)).unwrap(),
            "sum"
        );
        // A binding that fixes no tool (a published MCP server's remote)
        // calls the tool the operation names, and without one, none.
        let remote = binding("mcp", json!({}));
        assert_eq!(
            mcp_tool(&spec(&remote, &input, Some("forecast"), false)).unwrap(),
            "forecast"
        );
        assert!(mcp_tool(&spec(&remote, &input, None, false)).is_err());
    }
}
