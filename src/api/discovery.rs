//! The `agentry.v1.Discovery` gRPC service, on the same handle as the
//! registry (one service layer behind both).

use tonic::{Request, Response, Status};

use super::grpc::{principal, RegistryApi};
use crate::convert::discovery::{discovery_result_to_pb, resolution_to_pb};
use crate::domain::discovery::DiscoveryRequest;
use crate::domain::resolve::ResolveRequest;
use crate::pb::{self, discovery_server::Discovery};
use crate::service::ServiceError;

#[tonic::async_trait]
impl Discovery for RegistryApi {
    #[tracing::instrument(name = "grpc.Discover", skip_all)]
    async fn discover(
        &self,
        req: Request<pb::DiscoverRequest>,
    ) -> Result<Response<pb::DiscoverResponse>, Status> {
        let who = principal(&req);
        let request = DiscoveryRequest::try_from(req.into_inner()).map_err(ServiceError::from)?;
        let result = self.service().discover(who.as_ref(), request).await?;
        Ok(Response::new(discovery_result_to_pb(&result)))
    }

    #[tracing::instrument(name = "grpc.Resolve", skip_all)]
    async fn resolve(
        &self,
        req: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        let who = principal(&req);
        let request = ResolveRequest::try_from(req.into_inner()).map_err(ServiceError::from)?;
        let result = self.service().resolve(who.as_ref(), request).await?;
        Ok(Response::new(resolution_to_pb(&result)))
    }
}
