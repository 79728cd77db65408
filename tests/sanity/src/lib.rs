//! Ballast's own CSI checks, run against a live endpoint: only what
//! csi-sanity (kubernetes-csi/csi-test, run in CI against `ballast local`)
//! does not check. Identity: the exact driver name, the controller service
//! advertised on every socket, Probe's readiness before registration. The
//! Controller service (`controller`): any CO name maps to a volume id,
//! StorageClass parameters are checked by name, capacity is reported, a
//! published volume is not deleted.

mod controller;

pub use controller::controller_checks;

use tonic::Code;
use tonic::transport::Channel;

use ballast::proto::csi::v1::identity_client::IdentityClient;
use ballast::proto::csi::v1::plugin_capability::{self, service::Type as ServiceType};
use ballast::proto::csi::v1::{
    GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest, VolumeCapability,
    volume_capability,
};

/// Which daemon is behind the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Controller,
    Node,
}

/// One check's name and, when it failed, why.
#[derive(Debug)]
pub struct Outcome {
    pub name: &'static str,
    pub failure: Option<String>,
}

/// What a run of checks expects of the endpoint.
#[derive(Clone, Debug)]
pub struct Expectations {
    pub target: Target,
    /// The driver name GetPluginInfo must return.
    pub driver_name: String,
    /// Whether Probe must say ready (None: either is fine).
    pub ready: Option<bool>,
    /// A ready node to publish volumes at (controller checks); without
    /// one the publish checks are left out.
    pub node_id: Option<String>,
}

pub(crate) type CheckResult = Result<(), String>;

pub(crate) fn ensure(cond: bool, msg: impl FnOnce() -> String) -> CheckResult {
    if cond { Ok(()) } else { Err(msg()) }
}

/// A valid plugin name: domain notation, at most 63 characters, starting
/// and ending with an alphanumeric, with '-', '.' and alphanumerics between.
pub fn valid_plugin_name(name: &str) -> bool {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !name.is_empty()
        && name.len() <= 63
        && edge_ok(name.chars().next())
        && edge_ok(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

async fn plugin_info(ch: &Channel, exp: &Expectations) -> CheckResult {
    let mut c = IdentityClient::new(ch.clone());
    let a = c
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .map_err(|s| format!("GetPluginInfo failed: {s}"))?
        .into_inner();
    ensure(valid_plugin_name(&a.name), || {
        format!("name {:?} is not in domain name notation", a.name)
    })?;
    ensure(a.name == exp.driver_name, || {
        format!("name is {:?}, expected {:?}", a.name, exp.driver_name)
    })?;
    ensure(!a.vendor_version.is_empty(), || {
        "vendor_version is empty (REQUIRED)".into()
    })?;
    let b = c
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .map_err(|s| format!("second GetPluginInfo failed: {s}"))?
        .into_inner();
    ensure(a == b, || "two GetPluginInfo calls disagree".into())
}

async fn service_caps(ch: &Channel) -> Result<Vec<ServiceType>, String> {
    let mut c = IdentityClient::new(ch.clone());
    let caps = c
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .map_err(|s| format!("GetPluginCapabilities failed: {s}"))?
        .into_inner()
        .capabilities;
    let mut out = Vec::new();
    for cap in caps {
        match cap.r#type {
            Some(plugin_capability::Type::Service(s)) => {
                let t = ServiceType::try_from(s.r#type)
                    .map_err(|_| format!("unknown service type {}", s.r#type))?;
                ensure(t != ServiceType::Unknown, || {
                    "a capability of type UNKNOWN".into()
                })?;
                ensure(!out.contains(&t), || {
                    format!("{} listed twice", t.as_str_name())
                })?;
                out.push(t);
            }
            Some(plugin_capability::Type::VolumeExpansion(_)) => {}
            None => return Err("a capability with no type set".into()),
        }
    }
    Ok(out)
}

/// Every instance of a plugin reports the same capabilities, whatever it
/// serves: a node socket too advertises the controller service.
async fn capabilities(ch: &Channel, exp: &Expectations) -> CheckResult {
    let caps = service_caps(ch).await?;
    ensure(caps.contains(&ServiceType::ControllerService), || {
        format!(
            "the {:?} socket does not advertise CONTROLLER_SERVICE: {caps:?}",
            exp.target
        )
    })
}

async fn probe(ch: &Channel, exp: &Expectations) -> CheckResult {
    let mut c = IdentityClient::new(ch.clone());
    let r = c
        .probe(ProbeRequest {})
        .await
        .map_err(|s| format!("Probe failed: {s}"))?
        .into_inner();
    if let Some(want) = exp.ready {
        // An absent `ready` means ready.
        let got = r.ready.unwrap_or(true);
        ensure(got == want, || {
            format!("Probe says ready={got}, expected {want}")
        })?;
    }
    Ok(())
}

pub fn single_writer_mount() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

pub(crate) fn expect_code(
    r: Result<impl std::fmt::Debug, tonic::Status>,
    want: Code,
    what: &str,
) -> CheckResult {
    match r {
        Err(s) if s.code() == want => Ok(()),
        Err(s) => Err(format!(
            "{what}: expected {want:?}, got {:?}: {}",
            s.code(),
            s.message()
        )),
        Ok(v) => Err(format!("{what}: expected {want:?}, got success {v:?}")),
    }
}

/// Runs every Identity check against `ch`.
pub async fn identity_checks(ch: &Channel, exp: &Expectations) -> Vec<Outcome> {
    vec![
        Outcome {
            name: "identity: GetPluginInfo returns a valid, stable name and version",
            failure: plugin_info(ch, exp).await.err(),
        },
        Outcome {
            name: "identity: GetPluginCapabilities advertises the controller service on every socket",
            failure: capabilities(ch, exp).await.err(),
        },
        Outcome {
            name: "identity: Probe answers with the expected readiness",
            failure: probe(ch, exp).await.err(),
        },
    ]
}
