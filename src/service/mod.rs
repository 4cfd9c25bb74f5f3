//! Use cases of the registry: register, update, delete, set status, get,
//! list and watch, cluster administration, and invocation through the
//! gateway. Meaning-level validation and
//! entitlement checks live here; the transport layers only translate.

mod agent_protocol;
mod ard;
pub mod audit;
mod cluster;
pub mod consistency;
mod crawl;
mod discovery;
mod error;
mod federated;
mod identity;
mod import;
mod invocation;
mod leases;
mod mcp;
mod mcp_mirror;
mod publishers;
mod registry;
mod tenancy;
mod woa_host;

pub use agent_protocol::{ApEvents, ApReply};
pub use ard::{
    ArdService, CatalogDocument, HitEntry, ListPage as ArdListPage, SearchHit, SearchPage,
};
pub use audit::{AuditConfig, AuditLog};
pub use cluster::{BackupPart, ClusterService, ClusterView, MemberView};
pub use consistency::{CheckReport, MemberState};
pub use crawl::crawl;
pub use discovery::RankedPage;
pub use error::ServiceError;
pub use federated::{FeedEvent, FeedStream, PeerAnswer};
pub use identity::{IdentitySettings, KeyChange};
pub use import::{document_url, ImportFormat, ImportReport};
pub use invocation::{
    ConfiguredCredentials, Invocation, InvocationService, InvokeRequest, Invoked, Outcome,
    OutputCheck,
};
pub use mcp::{McpService, ServerPage};
pub use mcp_mirror::{mirror as mcp_mirror, McpRegistryConfig, McpUpstreamConfig};
pub use registry::{
    Consistency, ListPage, ListQuery, RegistryService, MAX_PAGE_BYTES, MAX_PAGE_SIZE,
};
pub use tenancy::{QuotaConfig, Tenancy, TenantConfig};
pub use woa_host::{http_date, none_match_fails, not_modified, WoaDocument, WoaHost};
