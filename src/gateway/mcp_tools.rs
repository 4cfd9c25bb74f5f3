//! `tools/list` on an MCP server the directory holds, for the registry's
//! own MCP server (`api::mcp_server`, the `list_agent_tools` tool): a
//! client sees what a server in the directory offers before it calls one
//! of those tools through the gateway.
//!
//! It is the same rmcp client over the same guarded reqwest client as the
//! gateway's `mcp` transport (`transport::in_session`): the address is
//! checked by the outbound policy before and while connecting, the whole
//! exchange runs under the policy's timeout, and the answer under its size
//! limit. Kept apart from `transport` because listing is not a call (there
//! is no envelope, operation or output to classify).

use rmcp::model::Tool;
use url::Url;

use super::outbound::{redacted, OutboundError};
use super::transport::{in_session, session_headers, GatewayError, Outbound, Peer};

/// Every tool the MCP server at `endpoint` (Streamable HTTP) lists, all
/// pages of them, asked with the credential among `headers` (the one a
/// call to that server would carry).
pub async fn list_tools(
    out: &Outbound,
    endpoint: &str,
    headers: &[(String, String)],
) -> Result<Vec<Tool>, GatewayError> {
    let url = Url::parse(endpoint).map_err(|e| {
        GatewayError::Unsupported(format!("the MCP endpoint {endpoint} is not a URL: {e}"))
    })?;
    let target = redacted(&url);
    let tools = in_session(
        out,
        &url,
        session_headers(headers),
        "tools/list",
        |peer: Peer| async move { peer.list_all_tools().await },
    )
    .await?;
    // The answer was read whole by rmcp; hold it to the same limit as any
    // agent's answer before it is passed on.
    let size = serde_json::to_vec(&tools).map_or(usize::MAX, |b| b.len());
    let limit = out.policy.max_response_bytes;
    if size > limit {
        return Err(OutboundError::TooLarge { target, limit }.into());
    }
    Ok(tools)
}
