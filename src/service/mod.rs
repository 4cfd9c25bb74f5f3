//! Use cases of the registry: register, update, delete, set status, get,
//! list and watch, and cluster administration. Meaning-level validation and
//! entitlement checks live here; the transport layers only translate.

mod cluster;
mod discovery;
mod error;
mod federated;
mod identity;
mod publishers;
mod registry;

pub use cluster::{ClusterService, ClusterView, MemberView};
pub use discovery::{Candidate, DiscoveryResult, Resolution, Resolved, CONFORMANCE_LEVEL};
pub use error::ServiceError;
pub use federated::{FeedEvent, FeedStream, PeerAnswer};
pub use identity::{IdentitySettings, KeyChange};
pub use registry::{Consistency, ListPage, ListQuery, RegistryService};
