//! Rebuild: a replica joins a running volume. With I/O paused, every `rw`
//! replica takes a snapshot at the same point, and the new replica joins
//! the chain (keeping the frozen layers it already holds with matching
//! checksums) in `wo` mode, so it receives every write from that moment.
//! Then its replica server fills the layers it lacks from a healthy
//! source; once each is checked, the replica turns `rw`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ballast::model::ReplicaMode;

use super::spare::Spare;
use super::{Engine, EngineError, Link, Member, RebuildStatus, ReplicaAddr};
use crate::wire::JoinSpec;
use crate::wire::client::{ClientError, ReplicaClient};

fn replica_err(replica: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Replica {
        replica: replica.to_string(),
        message: e.to_string(),
    }
}

/// Clears the rebuilding flag however the rebuild ends.
struct Rebuilding(Arc<Engine>);

impl Drop for Rebuilding {
    fn drop(&mut self) {
        self.0.rebuilding.store(false, Ordering::SeqCst);
    }
}

impl Engine {
    /// Adds `at` to the volume and starts its rebuild; returns once it has
    /// joined in `wo` mode. `source` names the replica to copy from (the
    /// controller picks one on the target's node for a local copy); any
    /// `rw` replica otherwise. Adding a replica already `rw` or `wo` does
    /// nothing.
    #[tracing::instrument(skip_all, fields(volume = %self.volume, replica = %at.name))]
    pub async fn add_replica(
        self: &Arc<Self>,
        at: ReplicaAddr,
        source: Option<String>,
        bytes_per_second: u64,
    ) -> Result<(), EngineError> {
        {
            let m = self.members.lock().await;
            if m.iter().any(|x| {
                x.at.name == at.name && matches!(x.mode, ReplicaMode::Rw | ReplicaMode::Wo)
            }) {
                return Ok(());
            }
        }
        if self.rebuilding.swap(true, Ordering::SeqCst) {
            return Err(EngineError::Busy(self.volume.clone()));
        }
        let guard = Rebuilding(self.clone());
        let client = ReplicaClient::dial(&self.tls, &at.addr, &at.name)
            .await
            .map_err(|e| EngineError::of_replica(&at.name, e))?;
        let info = self
            .joining_answer((&at.name, &client), client.info())
            .await
            .map_err(|e| EngineError::of_replica(&at.name, e))?;
        if info["size"].as_u64() != Some(self.size()) {
            return Err(replica_err(
                &at.name,
                format!("size {} is not the volume's {}", info["size"], self.size()),
            ));
        }
        // A fill of it still writes (one called off writes its last
        // pieces first): its join would be refused, so nothing is frozen
        // for it (each freeze is one more layer for the merge to fold).
        if info["filling"].as_bool() == Some(true) {
            return Err(EngineError::Filling {
                replica: at.name.clone(),
                message: "a fill of it is still writing; join when it ends".into(),
            });
        }
        let client = Arc::new(client);
        // A member that stopped answering on an idle volume is given up
        // first: choosing the source asks every rw replica for its layers,
        // and the pause below waits for each, with no bound.
        self.give_up_silent().await;
        // A replica merging is no source until its merge ends. Asked before
        // the heads are frozen, so that an attempt that cannot start
        // freezes nothing: each freeze is one more layer for the merge to
        // fold, and attempts a few seconds apart kept it from ending.
        self.pick_source(source.as_deref()).await?;
        self.warm_heads().await;
        let (src, kept) = {
            let _pause = self.io.write().await;
            // A replica that held the volume before may give a block the
            // last rw one holds bad (see `spare`); one whose rebuild did
            // not finish holds no whole copy.
            let spare = info["revision"]
                .as_u64()
                .filter(|_| info["pending"].as_u64() == Some(0))
                .map(|revision| Spare {
                    name: &at.name,
                    client: &client,
                    revision,
                });
            self.snapshot_now(None, spare.as_ref()).await?;
            let (src_name, layers) = self.pick_source(source.as_deref()).await?;
            let spec = JoinSpec::following(&layers, self.revision.load(Ordering::SeqCst))
                .map_err(|e| replica_err(&src_name, e))?;
            let report = self
                .joining_answer((&at.name, &client), client.join(&spec))
                .await
                .map_err(|e| match e {
                    e if e.is_busy() => EngineError::Filling {
                        replica: at.name.clone(),
                        message: e.to_string(),
                    },
                    e => EngineError::of_replica(&at.name, e),
                })?;
            let src_addr = {
                let m = self.members.lock().await;
                m.iter()
                    .find(|x| x.at.name == src_name)
                    .map(|x| x.at.addr.clone())
                    .unwrap_or_default()
            };
            let status = RebuildStatus {
                source: src_name.clone(),
                kept_bytes: report.kept_bytes,
                ..Default::default()
            };
            let mut m = self.members.lock().await;
            m.retain(|x| x.at.name != at.name);
            m.push(Member {
                at: at.clone(),
                link: Some(Link::Remote(client.clone())),
                mode: ReplicaMode::Wo,
                error: None,
                rebuild: Some(status),
                caught_up: false,
            });
            self.members_changed();
            (format!("{src_name}@{src_addr}"), report)
        };
        tracing::info!(source = %src, kept = kept.kept.len(), pending = kept.pending.len(), "replica joined; filling its layers");
        let engine = self.clone();
        let src_name = src.split('@').next().unwrap_or_default().to_string();
        tokio::spawn(async move {
            let _guard = guard;
            let filled = client.fill(&src, bytes_per_second).await;
            engine.finish_rebuild(&at.name, &src_name, filled).await;
        });
        Ok(())
    }

    /// The replica to rebuild from: of the rw replicas, one whose frozen
    /// layers (names and checksums) agree with most others' — `wanted` when
    /// it does (the controller asks for one on the target's node, for a
    /// local copy), else the first by name. Its layers are verified block
    /// by block as they are copied.
    async fn pick_source(
        &self,
        wanted: Option<&str>,
    ) -> Result<(String, Vec<crate::replica::LayerInfo>), EngineError> {
        let mut candidates = Vec::new();
        for (name, link) in self.rw_links().await {
            match link.layers().await {
                // A replica merging reports no checksum for the layer it
                // merges into: no source until the merge ends.
                Ok(layers)
                    if layers
                        .split_last()
                        .is_some_and(|(_, frozen)| frozen.iter().any(|l| l.checksum.is_none())) => {
                }
                Ok(layers) => candidates.push((name, link, layers)),
                Err(e) => self.fail(&name, &e).await,
            }
        }
        let frozen = |layers: &[crate::replica::LayerInfo]| -> Vec<(String, Option<String>)> {
            layers
                .iter()
                .filter(|l| l.checksum.is_some())
                .map(|l| (l.name.clone(), l.checksum.clone()))
                .collect()
        };
        let agreeing = |layers: &[crate::replica::LayerInfo]| {
            let mine = frozen(layers);
            candidates
                .iter()
                .filter(|(_, _, o)| frozen(o) == mine)
                .count()
        };
        let best = candidates
            .iter()
            .map(|(_, _, l)| agreeing(l))
            .max()
            .ok_or_else(|| EngineError::NoReplica("no rw replica to copy from".into()))?;
        let mut majority: Vec<(String, Vec<crate::replica::LayerInfo>)> = candidates
            .iter()
            .filter(|(_, _, l)| agreeing(l) == best)
            .map(|(n, _, l)| (n.clone(), l.clone()))
            .collect();
        majority.sort_by(|a, b| a.0.cmp(&b.0));
        let i = majority
            .iter()
            .position(|(n, _)| Some(n.as_str()) == wanted)
            .unwrap_or(0);
        Ok(majority.swap_remove(i))
    }

    async fn finish_rebuild(
        &self,
        name: &str,
        source: &str,
        filled: Result<serde_json::Value, ClientError>,
    ) {
        match filled {
            Ok(report) => {
                let mut m = self.members.lock().await;
                if let Some(x) = m
                    .iter_mut()
                    .find(|x| x.at.name == name && x.mode == ReplicaMode::Wo)
                {
                    // It holds every write now; it turns rw once the store
                    // records it among the replicas that do.
                    if self.freshness.keeps_record() {
                        x.caught_up = true;
                    } else {
                        x.mode = ReplicaMode::Rw;
                    }
                    if let Some(r) = x.rebuild.as_mut() {
                        r.copied_bytes = report["bytes"].as_u64().unwrap_or(0);
                        // Its old data found equal to the source's was kept.
                        r.kept_bytes += report["reused"].as_u64().unwrap_or(0);
                        r.path = report["path"].as_str().unwrap_or_default().to_string();
                        r.done = true;
                    }
                    tracing::info!(volume = %self.volume, replica = name, report = %report, "rebuild done");
                    self.members_changed();
                }
            }
            Err(e) => {
                // The source's data failed its checksums: the source is
                // the replica at fault, and goes too, unless it is the last
                // rw one: then it keeps serving what is sound (a bad block
                // fails its reads only) and the volume stays degraded.
                if e.is_corrupt() {
                    if self.others_rw(source).await > 0 {
                        tracing::error!(volume = %self.volume, source, error = %e, "the rebuild's source is corrupt");
                        self.fail(source, &e).await;
                    } else {
                        tracing::error!(volume = %self.volume, source, error = %e,
                            "the rebuild's source is corrupt and no other replica holds the block; it keeps serving the rest");
                        self.lose_in_last(source, &e).await;
                    }
                }
                self.fail(name, &e).await
            }
        }
    }

    /// The block of a frozen layer that failed a fill from `source`, the
    /// last rw replica, where the joining replica held it sound neither
    /// (its seed would have been kept): no replica the engine has holds it
    /// sound. It is given up as lost in `source`, with any other block of
    /// its layer that fails there (see `Replica::lose_frozen_block`), so
    /// that the next rebuild copies the layer as it is and the rest of the
    /// volume gets its replicas back.
    async fn lose_in_last(&self, source: &str, e: &ClientError) {
        let Some((Some(layer), Some(at))) = e.corruption().map(|c| (c.layer.clone(), c.at)) else {
            return;
        };
        let block = at / crate::replica::BLOCK;
        let link = self.rw_links().await.into_iter().find(|(n, _)| n == source);
        let Some((_, link)) = link else {
            return;
        };
        match link.lose(&layer, block).await {
            Ok(blocks) => {
                super::IoCounters::count(&self.counters.lost_blocks, blocks.len() as u64);
                tracing::error!(volume = %self.volume, replica = source, layer = %layer, ?blocks,
                    "blocks of a frozen layer no replica holds sound are lost: each fails its reads until written again; the next rebuild copies the rest");
            }
            Err(why) => {
                tracing::warn!(volume = %self.volume, replica = source, layer = %layer, block, error = %why,
                    "the block that failed the rebuild was not given up as lost");
            }
        }
    }

    /// Ends the rebuilds copying from `source`, given up for its silence
    /// (`why`): their fills read from it too, over their targets' own
    /// connections, and would wait for it as long (a rebuild holds the
    /// volume's only rebuild slot while it runs). Each target fails, its
    /// connection abandoned so that its node calls the fill off, and the
    /// next rebuild picks another source.
    pub(super) async fn end_rebuilds_from(&self, source: &str, why: &str) {
        let copying: Vec<(String, Arc<ReplicaClient>)> = {
            let m = self.members.lock().await;
            m.iter()
                .filter(|x| x.mode == ReplicaMode::Wo)
                .filter(|x| {
                    x.rebuild
                        .as_ref()
                        .is_some_and(|r| r.source == source && !r.done)
                })
                .filter_map(|x| match &x.link {
                    Some(Link::Remote(c)) => Some((x.at.name.clone(), c.clone())),
                    _ => None,
                })
                .collect()
        };
        for (name, client) in copying {
            let reason = format!("its rebuild's source {source} was given up ({why})");
            client.abandon(&reason);
            let e = ClientError::Closed {
                addr: client.addr().to_string(),
                reason,
            };
            self.fail(&name, &e).await;
        }
    }

    /// How many rw replicas there are besides `name`.
    pub(super) async fn others_rw(&self, name: &str) -> usize {
        let m = self.members.lock().await;
        others_rw(&m, name)
    }

    /// Takes a replica out of the volume (before its data is deleted).
    #[tracing::instrument(skip_all, fields(volume = %self.volume, replica = %name))]
    pub async fn remove_replica(&self, name: &str) -> Result<(), EngineError> {
        let _pause = self.io.write().await;
        let mut m = self.members.lock().await;
        let others_rw = others_rw(&m, name);
        let is_rw = m
            .iter()
            .any(|x| x.at.name == name && x.mode == ReplicaMode::Rw);
        if is_rw && others_rw == 0 {
            return Err(EngineError::Refused {
                replica: name.to_string(),
                message: "it is the last rw replica".into(),
            });
        }
        // A lent replica is given back first: its data is deleted next.
        if let Some(Link::Lent(l)) = m
            .iter()
            .find(|x| x.at.name == name)
            .and_then(|x| x.link.clone())
        {
            l.give_back().await;
        }
        m.retain(|x| x.at.name != name);
        self.members_changed();
        Ok(())
    }
}

fn others_rw(members: &[Member], name: &str) -> usize {
    members
        .iter()
        .filter(|x| x.at.name != name && x.mode == ReplicaMode::Rw)
        .count()
}
