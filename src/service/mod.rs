//! Use cases of the registry: register, update, delete, set status, get,
//! list and watch. Meaning-level validation and entitlement checks live here;
//! the transport layers only translate.

mod error;
mod registry;

pub use error::ServiceError;
pub use registry::{Consistency, ListPage, ListQuery, RegistryService};
