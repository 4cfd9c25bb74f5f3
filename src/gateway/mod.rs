//! The invocation gateway: AIDIP REST invocation, the Web of Agents host and
//! client, the Agent Protocol surface, and the outbound guard every call to
//! an agent (or a crawl of a host) goes through.

pub mod import;
pub mod mcp_tools;
pub mod outbound;
pub mod tls;
pub mod token;
pub mod transport;
