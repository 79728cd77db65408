//! Readers: the credentials a node reads another node's replica with. A
//! replica opens only for its volume's engine, its own node, and a reader
//! of its volume; so before a fill (a rebuild's or a restore's) reads its
//! source, the node asks the controller for a reader's certificate naming
//! the source's volume, for a new key of its own (the controller checks
//! that the replica to fill is on this node and takes that data). It
//! holds no certificate between fills, and opens no replica itself.

use std::time::Duration;

use ballast::cluster_token::Authed;
use ballast::proto::agent::v1::IssueReaderRequest;
use ballast::proto::agent::v1::controlplane_client::ControlplaneClient;
use ballast::tls::Enrollment;

/// How long the controller has to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where this node gets its readers' certificates: the controller.
pub struct Readers {
    controller: Authed,
    node_id: String,
    /// The cluster's CA, which the new credentials trust.
    ca_pem: String,
}

impl Readers {
    pub fn new(controller: Authed, node_id: &str, ca_pem: &str) -> Readers {
        Readers {
            controller,
            node_id: node_id.to_string(),
            ca_pem: ca_pem.to_string(),
        }
    }

    /// Credentials (a new key, and the controller's certificate for it)
    /// to read replica `source` for the fill of `target`, a replica of
    /// this node.
    pub async fn credentials(
        &self,
        target: &str,
        source: &str,
    ) -> Result<ballast::tls::Credentials, String> {
        let key = Enrollment::new(&self.node_id).map_err(|e| format!("a reader's key: {e}"))?;
        let mut client = ControlplaneClient::new(self.controller.clone());
        let ask = client.issue_reader(IssueReaderRequest {
            node_id: self.node_id.clone(),
            replica: target.to_string(),
            source: source.to_string(),
            csr_pem: key.csr_pem.clone(),
        });
        let answer = tokio::time::timeout(ASK_TIMEOUT, ask)
            .await
            .map_err(|_| "the controller did not answer for a reader's certificate".to_string())?
            .map_err(|s| {
                format!(
                    "the controller gave no reader's certificate to read {source}: {}",
                    s.message()
                )
            })?
            .into_inner();
        Ok(key.finish(&self.ca_pem, &answer.cert_pem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that cannot reach the controller gets no reader's
    /// certificate, and the fill's error says which source it could not
    /// read and why.
    #[tokio::test]
    async fn without_its_controller_a_fill_gets_no_reader_and_says_why() {
        // A port nothing listens on.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let controller = ballast::tls::Member::default()
            .channel(
                &format!("http://127.0.0.1:{port}"),
                &ballast::tls::Role::Controller,
            )
            .unwrap();
        let readers = Readers::new(controller, "node-1", "");
        let e = readers.credentials("v-r1", "v-r2").await.unwrap_err();
        assert!(
            e.contains("the controller gave no reader's certificate to read v-r2"),
            "{e}"
        );
    }
}
