//! The generated protocols: CSI (`csi::v1`) and the agent protocol.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod agent {
    pub mod v1 {
        tonic::include_proto!("ballast.agent.v1");
    }
}
