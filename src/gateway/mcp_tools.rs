//! `tools/list` on an MCP server the directory holds, for the registry's
//! own MCP server (`api::mcp_server`, the `list_agent_tools` tool): a
//! client sees what a server in the directory offers before it calls one
//! of those tools through the gateway.
//!
//! It is the same rmcp client over the same guarded reqwest client as the
//! gateway's `mcp` transport (`transport::call_mcp`): the address is
//! checked by the outbound policy before and while connecting, the whole
//! exchange runs under the policy's timeout, and the answer under its size
//! limit. Kept apart from `transport` because listing is not a call (there
//! is no envelope, operation or output to classify).

use rmcp::model::Tool;
use url::Url;

use super::outbound::{redacted, OutboundError};
use super::transport::{GatewayError, Outbound};

/// Every tool the MCP server at `endpoint` (Streamable HTTP) lists, all
/// pages of them. `bearer` is the caller's credential for that server, if
/// it needs one (rmcp sends it as `Authorization: Bearer`).
pub async fn list_tools(
    out: &Outbound,
    endpoint: &str,
    bearer: Option<String>,
) -> Result<Vec<Tool>, GatewayError> {
    use rmcp::transport::streamable_http_client::{
        StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
    };
    use rmcp::ServiceExt;

    let url = Url::parse(endpoint).map_err(|e| {
        GatewayError::Unsupported(format!("the MCP endpoint {endpoint} is not a URL: {e}"))
    })?;
    out.preflight(&url).await?;
    let target = redacted(&url);
    let timeout = out.policy.timeout;
    let run = async {
        let transport = StreamableHttpClientTransport::with_client(
            out.client.clone(),
            StreamableHttpClientTransportConfig {
                uri: url.as_str().into(),
                auth_header: bearer,
                ..Default::default()
            },
        );
        let client =
            ().serve(transport)
                .await
                .map_err(|e| OutboundError::Unreachable {
                    target: target.clone(),
                    reason: format!("the MCP session did not start: {e}"),
                })?;
        let tools = client.list_all_tools().await;
        if let Err(e) = client.cancel().await {
            tracing::debug!(error = %e, "closing the MCP session failed");
        }
        tools.map_err(|e| {
            GatewayError::BadAnswer(format!(
                "the MCP server at {target} refused tools/list: {e}"
            ))
        })
    };
    let tools =
        tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| OutboundError::Timeout {
                target: target.clone(),
                ms: timeout.as_millis(),
            })??;
    // The answer was read whole by rmcp; hold it to the same limit as any
    // agent's answer before it is passed on.
    let size = serde_json::to_vec(&tools).map_or(usize::MAX, |b| b.len());
    let limit = out.policy.max_response_bytes;
    if size > limit {
        return Err(OutboundError::TooLarge { target, limit }.into());
    }
    Ok(tools)
}
