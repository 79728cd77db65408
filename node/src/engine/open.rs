//! How a starting engine meets each replica: it connects, asks for its
//! INFO, and takes it `rw` with its revision and suspect blocks, or `err`
//! with why (unreachable, a rebuild not finished, another size, or a claim
//! no replica could hold).

use std::sync::Arc;

use ballast::model::ReplicaMode;

use super::{Link, Member, ReplicaAddr};
use crate::wire::client::{ClientError, ReplicaClient};
use crate::wire::protocol::status;
use crate::wire::tls::WireTls;

/// Connects to a replica for a starting engine: a member in `rw` mode
/// with its revision and its suspect blocks (`Replica::suspect`), or in
/// `err` mode with why (unreachable, a rebuild not finished, another
/// size); and whether it answered at all.
pub(super) async fn open_member(
    tls: &WireTls,
    at: &ReplicaAddr,
    size: u64,
) -> (Member, u64, Vec<u64>, bool) {
    let connected = async {
        let c = ReplicaClient::dial(tls, &at.addr, &at.name).await?;
        let info = c.info().await?;
        Ok::<_, ClientError>((c, info))
    }
    .await;
    let failed = |why: String| {
        let m = Member {
            at: at.clone(),
            link: None,
            mode: ReplicaMode::Err,
            error: Some(why),
            rebuild: None,
            caught_up: false,
        };
        (m, 0, Vec::new())
    };
    // Reached, for the wait on suspect blocks (`settle::SUSPECTS_WAIT`),
    // unless its node may yet come back: no connection, or a server that
    // does not hold it yet (NOT_FOUND) or is busy with it. A replica
    // whose server failed it (its disk full or failing) is not waited
    // for: the wait would only hold the start back.
    let reached = match &connected {
        Ok(_) => true,
        Err(ClientError::Closed { .. }) => false,
        Err(ClientError::Failed { status: s, .. }) => {
            !matches!(*s, status::NOT_FOUND | status::BUSY)
        }
    };
    // What no replica's server holds (its open refuses such files): a
    // server that claims it is not counted on.
    let unsound = connected
        .as_ref()
        .ok()
        .and_then(|(_, info)| claims_unsound(info, size));
    let (m, revision, suspect) = match connected {
        Ok((_, info)) if info["pending"].as_u64().unwrap_or(0) > 0 => {
            failed("its rebuild did not finish".into())
        }
        Ok(_) if unsound.is_some() => failed(unsound.unwrap_or_default()),
        Ok((c, info)) if info["size"].as_u64() == Some(size) => {
            let m = Member {
                at: at.clone(),
                link: Some(Link::Remote(Arc::new(c))),
                mode: ReplicaMode::Rw,
                error: None,
                rebuild: None,
                caught_up: false,
            };
            let suspect = info["suspect"]
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
                .unwrap_or_default();
            (m, info["revision"].as_u64().unwrap_or(0), suspect)
        }
        Ok((_, info)) => failed(format!("size {} is not the volume's {size}", info["size"])),
        Err(e) => failed(e.to_string()),
    };
    (m, revision, suspect, reached)
}

/// What a replica's INFO claims that no replica of `size` bytes holds: a
/// revision past `MAX_REVISION`, or a suspect block past its end.
fn claims_unsound(info: &serde_json::Value, size: u64) -> Option<String> {
    let blocks = size / crate::replica::BLOCK;
    if let Some(r) = info["revision"].as_u64()
        && r > crate::replica::MAX_REVISION
    {
        return Some(format!("its revision {r} is past any a replica reaches"));
    }
    let suspect = info["suspect"].as_array()?;
    let past = suspect
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .find(|b| *b >= blocks)?;
    Some(format!(
        "its suspect block {past} is past any a replica of {blocks} blocks has"
    ))
}
