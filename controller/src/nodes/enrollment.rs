//! Enrollment: a node that starts with TLS on sends a signing request and
//! the cluster token, and gets back its certificate, signed by the
//! cluster's CA. It owns that one call; which calls need which certificate
//! is the agent endpoint's gates' business (daemon.rs).

use std::sync::Arc;

use ballast::proto::agent::v1::enrollment_server::Enrollment;
use ballast::proto::agent::v1::{IssueCertificateRequest, IssueCertificateResponse};
use tonic::{Request, Response, Status};

use crate::context::Context;
use crate::error::Error;

pub struct EnrollmentService {
    ctx: Arc<Context>,
}

impl EnrollmentService {
    pub fn new(ctx: Arc<Context>) -> Self {
        EnrollmentService { ctx }
    }
}

#[tonic::async_trait]
impl Enrollment for EnrollmentService {
    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id))]
    async fn issue_certificate(
        &self,
        request: Request<IssueCertificateRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let req = request.into_inner();
        ballast::model::validate_name(&req.node_id).map_err(|m| Error::invalid("nodeId", m))?;
        let Some(ca) = &self.ctx.ca else {
            return Err(Status::failed_precondition(
                "this controller runs without TLS (no --cluster-ca-dir or --cluster-ca-secret)",
            ));
        };
        let cert_pem = ca
            .sign(&req.node_id, &req.csr_pem)
            .map_err(|e| Error::invalid("csrPem", e.to_string()))?;
        tracing::info!("issued a certificate");
        Ok(Response::new(IssueCertificateResponse {
            cert_pem,
            ca_pem: ca.cert_pem().to_string(),
        }))
    }
}
