//! Tenants and quotas: which agent ids a publisher may register (its
//! tenant's namespaces), and how many records an owner or a tenant may hold.
//!
//! Namespaces are checked here, on the node that took the request, before a
//! write is proposed. Record counts are checked inside `apply` (the quota
//! travels in the command), so two nodes racing to register the last record
//! a tenant may hold cannot both win.

use std::collections::HashMap;

use serde::Deserialize;

use super::ServiceError;
use crate::domain::write::Quota;
use crate::domain::{Principal, Role};

/// One tenant: an organisation whose principals share namespaces and a
/// record quota.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Agent id prefixes the tenant's publishers may register.
    pub namespaces: Vec<String>,
    /// Live records the tenant may hold (default: `quotas.max_records_per_tenant`).
    #[serde(default)]
    pub max_records: Option<u64>,
}

/// Record quotas. Admins are exempt: they are the operator.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaConfig {
    /// Live records one principal may own.
    pub max_records_per_owner: u64,
    /// Live records the principals of one tenant may own together.
    pub max_records_per_tenant: u64,
    /// ADP examples one record may hold (at most 256).
    pub max_examples_per_record: usize,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            max_records_per_owner: 10_000,
            max_records_per_tenant: 100_000,
            max_examples_per_record: crate::domain::validate::MAX_EXAMPLES,
        }
    }
}

/// The tenants of this registry and its quotas.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    tenants: HashMap<String, TenantConfig>,
    quotas: QuotaConfig,
}

type Result<T> = std::result::Result<T, ServiceError>;

impl Tenancy {
    pub fn new(tenants: &[TenantConfig], quotas: QuotaConfig) -> Self {
        Self {
            tenants: tenants
                .iter()
                .map(|t| (t.name.clone(), t.clone()))
                .collect(),
            quotas,
        }
    }

    /// Checks the tenants and quotas of a config file.
    pub fn validate(
        tenants: &[TenantConfig],
        quotas: &QuotaConfig,
    ) -> std::result::Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for t in tenants {
            if t.name.is_empty()
                || t.name.contains(['/', ':'])
                || t.name.chars().any(char::is_control)
            {
                return Err(format!(
                    "tenants: name '{}' must be non-empty without '/', ':' or control characters",
                    t.name
                ));
            }
            if !seen.insert(&t.name) {
                return Err(format!("tenants: '{}' is listed twice", t.name));
            }
            if t.namespaces.iter().any(String::is_empty) {
                return Err(format!(
                    "tenants: '{}' has an empty namespace (it would grant every id)",
                    t.name
                ));
            }
        }
        if quotas.max_records_per_owner == 0 || quotas.max_records_per_tenant == 0 {
            return Err("quotas: limits must be at least 1".into());
        }
        let cap = crate::domain::validate::MAX_EXAMPLES;
        if quotas.max_examples_per_record > cap {
            return Err(format!(
                "quotas.max_examples_per_record must be at most {cap}"
            ));
        }
        Ok(())
    }

    /// Whether tenants are configured: then every publisher that is not an
    /// admin must belong to one.
    pub fn enabled(&self) -> bool {
        !self.tenants.is_empty()
    }

    /// Refuses (403 naming `/id`) an id outside the namespaces granted to
    /// the writer's tenant. Without tenants configured every id is open.
    pub fn check_namespace(&self, principal: &Principal, id: &str) -> Result<()> {
        if !self.enabled() || principal.role == Role::Admin {
            return Ok(());
        }
        let refuse = |why: String| {
            Err(ServiceError::Denied {
                field: Some("/id".into()),
                message: format!("/id: {why}"),
            })
        };
        let Some(tenant) = principal.tenant.as_deref() else {
            return refuse(format!(
                "principal '{}' belongs to no tenant, so it may register no id",
                principal.name
            ));
        };
        match self.tenants.get(tenant) {
            Some(t) if t.namespaces.iter().any(|n| id.starts_with(n.as_str())) => Ok(()),
            Some(t) => refuse(format!(
                "'{id}' is outside the namespaces of tenant '{tenant}' ({})",
                t.namespaces.join(", ")
            )),
            None => refuse(format!("tenant '{tenant}' is granted no namespaces")),
        }
    }

    /// The quota a registration by `principal` is held to (none for admins).
    pub fn quota_for(&self, principal: &Principal) -> Option<Quota> {
        if principal.role == Role::Admin {
            return None;
        }
        let per_tenant = principal.tenant.as_ref().map(|t| {
            self.tenants
                .get(t)
                .and_then(|t| t.max_records)
                .unwrap_or(self.quotas.max_records_per_tenant)
        });
        Some(Quota {
            per_owner: self.quotas.max_records_per_owner,
            per_tenant,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenancy() -> Tenancy {
        Tenancy::new(
            &[TenantConfig {
                name: "acme".into(),
                namespaces: vec!["urn:acme:".into()],
                max_records: Some(5),
            }],
            QuotaConfig::default(),
        )
    }

    fn publisher(tenant: Option<&str>) -> Principal {
        Principal::new("pub", Role::Publisher).in_tenant(tenant.map(String::from))
    }

    #[test]
    fn namespaces_bind_publishers_of_a_tenant() {
        let t = tenancy();
        assert!(t
            .check_namespace(&publisher(Some("acme")), "urn:acme:x")
            .is_ok());
        let e = t
            .check_namespace(&publisher(Some("acme")), "urn:other:x")
            .unwrap_err();
        assert!(matches!(e, ServiceError::Denied { field: Some(f), .. } if f == "/id"));
        assert!(t
            .check_namespace(&publisher(Some("nobody")), "urn:acme:x")
            .is_err());
        assert!(t.check_namespace(&publisher(None), "urn:acme:x").is_err());
        let admin = Principal::new("root", Role::Admin);
        assert!(t.check_namespace(&admin, "anything").is_ok());
        // Without tenants, a single organisation's registry stays open.
        assert!(Tenancy::default()
            .check_namespace(&publisher(None), "x")
            .is_ok());
    }

    #[test]
    fn quotas_come_from_the_tenant_or_the_defaults() {
        let t = tenancy();
        let q = t.quota_for(&publisher(Some("acme"))).unwrap();
        assert_eq!((q.per_owner, q.per_tenant), (10_000, Some(5)));
        let q = t.quota_for(&publisher(Some("other"))).unwrap();
        assert_eq!(q.per_tenant, Some(100_000));
        assert_eq!(t.quota_for(&publisher(None)).unwrap().per_tenant, None);
        assert!(t.quota_for(&Principal::new("root", Role::Admin)).is_none());
    }
}
