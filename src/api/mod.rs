//! The transports: the gRPC core, the JSON/HTTP facade that calls the same
//! gRPC handlers in-process, authentication, and the one error mapping.

pub mod agent_protocol;
pub mod ard;
pub mod auth;
pub mod cluster;
pub mod discovery;
pub mod error;
pub mod federation;
pub mod gate;
pub mod grpc;
pub mod http;
pub mod invocation;
pub mod jwt;
pub mod mcp_origin;
pub mod mcp_server;
pub mod peering;
