//! The `agentry.v1.Discovery` gRPC service, on the same handle as the
//! registry (one service layer behind both).

use tonic::{Request, Response, Status};

use super::grpc::{principal, RegistryApi};
use crate::convert::discovery::{discovery_result_to_pb, resolution_to_pb};
use crate::domain::discovery::DiscoveryRequest;
use crate::domain::resolve::ResolveRequest;
use crate::pb::{self, discovery_server::Discovery};
use crate::service::{ServiceError, MAX_PAGE_BYTES};

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
        let mut response = discovery_result_to_pb(&result);
        keep_within_page(
            &mut response.candidates,
            &mut response.warnings,
            result.left_out,
            "fewer (limit) or less detail",
        );
        Ok(Response::new(response))
    }

    #[tracing::instrument(name = "grpc.Resolve", skip_all)]
    async fn resolve(
        &self,
        req: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        let who = principal(&req);
        let request = ResolveRequest::try_from(req.into_inner()).map_err(ServiceError::from)?;
        let result = self.service().resolve(who.as_ref(), request).await?;
        let mut response = resolution_to_pb(&result);
        keep_within_page(
            &mut response.candidates,
            &mut response.warnings,
            0,
            "fewer (max_candidates)",
        );
        Ok(Response::new(response))
    }
}

/// Keeps the leading `candidates` whose encoded sizes add up to at most
/// [`MAX_PAGE_BYTES`] (always the first), and warns how many were left out
/// (counting `already`, those the service did not read) and what to `ask`
/// for instead. Large records (full detail, input schemas) would otherwise
/// make answers that stock gRPC clients refuse (over 4 MiB) and that the
/// server builds whole for every such request.
fn keep_within_page<T: prost::Message>(
    candidates: &mut Vec<T>,
    warnings: &mut Vec<String>,
    already: usize,
    ask: &str,
) {
    let dropped = fit(candidates) + already;
    if dropped > 0 {
        warnings.push(format!(
            "{dropped} more candidate(s) were left out: an answer holds about {} MiB of candidates; ask for {ask}",
            MAX_PAGE_BYTES >> 20
        ));
    }
}

/// Drops the items after those that fit [`MAX_PAGE_BYTES`] (the first
/// always does), and says how many.
fn fit<T: prost::Message>(items: &mut Vec<T>) -> usize {
    let mut bytes = 0;
    let kept = items
        .iter()
        .position(|item| {
            bytes += item.encoded_len();
            bytes > MAX_PAGE_BYTES
        })
        .map_or(items.len(), |at| at.max(1));
    let dropped = items.len() - kept;
    items.truncate(kept);
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize) -> pb::MatchedExample {
        pb::MatchedExample {
            text: "x".repeat(bytes),
            ..Default::default()
        }
    }

    #[test]
    fn answers_keep_the_candidates_that_fit_and_always_the_first() {
        let mut small: Vec<_> = (0..200).map(|_| item(2_000)).collect();
        assert_eq!(fit(&mut small), 0);
        assert_eq!(small.len(), 200);

        let mut large: Vec<_> = (0..5).map(|_| item(900 << 10)).collect();
        assert_eq!(fit(&mut large), 3);
        assert_eq!(large.len(), 2);

        let mut huge = vec![item(3 << 20), item(10)];
        assert_eq!(fit(&mut huge), 1);
        assert_eq!(huge.len(), 1, "the best candidate is served however large");

        let mut none: Vec<pb::MatchedExample> = Vec::new();
        assert_eq!(fit(&mut none), 0);
    }
}
