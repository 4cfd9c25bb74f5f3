//! `agentry.v1.Ard` handlers: the ARD registry API over gRPC. The HTTP
//! facade's `/ard/...` routes call these same handlers; requests become
//! validated plans here (`domain::catalog`), once for both transports.

use tonic::{Request, Response, Status};

use super::grpc::principal;
use crate::convert::{map_to_struct, struct_from_client};
use crate::domain::catalog::{ExplorePlan, ListPlan, SearchPlan};
use crate::domain::FieldError;
use crate::pb::{self, ard_server::Ard};
use crate::service::{ArdService, ServiceError};

/// The `agentry.v1.Ard` service.
#[derive(Clone)]
pub struct ArdApi {
    service: ArdService,
}

impl ArdApi {
    pub fn new(service: ArdService) -> Self {
        Self { service }
    }

    pub fn service(&self) -> &ArdService {
        &self.service
    }
}

fn invalid(e: FieldError) -> Status {
    ServiceError::from(e).into()
}

fn filter_of(
    s: Option<&prost_types::Struct>,
) -> Result<serde_json::Map<String, serde_json::Value>, Status> {
    s.map(|s| struct_from_client(s, "/filter"))
        .transpose()
        .map(Option::unwrap_or_default)
        .map_err(invalid)
}

#[tonic::async_trait]
impl Ard for ArdApi {
    async fn search(
        &self,
        req: Request<pb::ArdSearchRequest>,
    ) -> Result<Response<pb::ArdSearchResponse>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let plan = SearchPlan::new(
            &r.text,
            &filter_of(r.filter.as_ref())?,
            &r.federation,
            r.page_size,
            &r.page_token,
        )
        .map_err(invalid)?;
        let page = self.service.search(who.as_ref(), plan).await?;
        Ok(Response::new(pb::ArdSearchResponse {
            results: page
                .results
                .iter()
                .map(|h| map_to_struct(&h.to_map()))
                .collect(),
            referrals: page.referrals.iter().map(map_to_struct).collect(),
            page_token: page.page_token,
        }))
    }

    async fn explore(
        &self,
        req: Request<pb::ArdExploreRequest>,
    ) -> Result<Response<pb::ArdExploreResponse>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let facets = r
            .facets
            .into_iter()
            .map(|f| (f.field, f.limit, f.min_count))
            .collect();
        let plan =
            ExplorePlan::new(&r.text, &filter_of(r.filter.as_ref())?, facets).map_err(invalid)?;
        let facets = self.service.explore(who.as_ref(), plan).await?;
        Ok(Response::new(pb::ArdExploreResponse {
            facets: facets
                .into_iter()
                .map(|f| pb::ArdFacet {
                    field: f.field,
                    buckets: f
                        .buckets
                        .into_iter()
                        .map(|(value, count)| pb::ArdBucket { value, count })
                        .collect(),
                    other_count: f.other_count,
                })
                .collect(),
        }))
    }

    async fn list_agents(
        &self,
        req: Request<pb::ArdListRequest>,
    ) -> Result<Response<pb::ArdListResponse>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let plan =
            ListPlan::new(&r.filter, &r.order_by, r.page_size, &r.page_token).map_err(invalid)?;
        let page = self.service.list(who.as_ref(), plan).await?;
        Ok(Response::new(pb::ArdListResponse {
            items: page.items.iter().map(map_to_struct).collect(),
            total: page.total,
            page_token: page.page_token,
        }))
    }

    async fn get_agent(
        &self,
        req: Request<pb::ArdGetRequest>,
    ) -> Result<Response<pb::ArdEntry>, Status> {
        let who = principal(&req);
        let r = req.into_inner();
        let (entry, etag) = self.service.get(who.as_ref(), &r.identifier).await?;
        Ok(Response::new(pb::ArdEntry {
            entry: Some(map_to_struct(&entry)),
            etag,
        }))
    }
}
