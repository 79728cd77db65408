//! Auto-balance (BEHAVIOR.md "Auto-balance", seed 000), zone then node.
//!
//! Runs on a healthy volume (every replica rw, none being rebuilt) whose
//! effective mode is not disabled. It computes the whole target layout in
//! one pass (lesson: one dimension per pass caused several rebuild
//! cycles) and creates the replicas that layout lacks; cleanup deletes the
//! duplicates once the new ones are rw.
//!
//! - least-effort: as many distinct zones as possible (up to the replica
//!   count), then as many distinct nodes: min(unused eligible, replicas -
//!   used) replicas move.
//! - best-effort: an even layout: while the most loaded zone (then node)
//!   holds at least two more replicas than the least loaded eligible one,
//!   one moves. A node move never unbalances zones.
//!
//! Hard anti-affinity is respected; a replica kept by data locality never
//! moves.

use std::collections::BTreeMap;

use ballast::model::{AutoBalance, DataLocality};

use super::action::{Plan, Rule};
use super::disk_pressure;
use super::pass::{Eligible, Pass};
use super::replenish::new_replica;
use super::schedule::{self, Peer, Request};
use super::volume_state::VolumeState;

/// Where balance wants one more replica: a zone (any eligible node of it)
/// or a node, and the rule that wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub rule: Rule,
    pub zone: Option<String>,
    pub node: Option<String>,
}

impl Target {
    fn zone(z: &str) -> Self {
        Target {
            rule: Rule::ZoneBalance,
            zone: Some(z.to_string()),
            node: None,
        }
    }

    fn node(rule: Rule, n: &str) -> Self {
        Target {
            rule,
            zone: None,
            node: Some(n.to_string()),
        }
    }
}

/// The replicas balance would add to `layout` (the nodes of the volume's
/// rw replicas, one entry per replica); empty when balanced. `freed` names
/// nodes whose replicas of this volume are about to be deleted: they count
/// as able to take one back, whatever their disks' usage says now.
pub fn moves(pass: &Pass, vs: &VolumeState, layout: &[&str], freed: &[&str]) -> Vec<Target> {
    if vs.balance == AutoBalance::Disabled
        || vs.locality == DataLocality::StrictLocal
        || layout.is_empty()
    {
        return Vec::new();
    }
    let wanted = vs.wanted();
    // Fast path, before any map is built: every replica in its own zone,
    // as many zones as wanted (the same test as below, on the layout).
    if layout.len() >= wanted && layout.len() <= 8 {
        let mut zones = [""; 8];
        for (k, n) in layout.iter().enumerate() {
            zones[k] = pass.zone_of(n);
        }
        let zones = &mut zones[..layout.len()];
        zones.sort_unstable();
        if zones.windows(2).all(|w| w[0] != w[1]) {
            return Vec::new();
        }
    }
    let mut node_count: BTreeMap<&str, usize> = BTreeMap::new();
    let mut zone_count: BTreeMap<&str, usize> = BTreeMap::new();
    for n in layout {
        *node_count.entry(n).or_default() += 1;
        *zone_count.entry(pass.zone_of(n)).or_default() += 1;
    }
    // Fast path: every replica in its own zone, as many zones as wanted.
    if zone_count.len() == layout.len() && zone_count.len() >= wanted {
        return Vec::new();
    }
    let cached = super::schedule::eligible(pass, vs.volume, disk_pressure::threshold(pass, vs));
    let mut eligible = Eligible {
        nodes: cached.nodes.clone(),
        zones: cached.zones.clone(),
    };
    for n in freed {
        if let Some(node) = pass.node(n)
            && !eligible.nodes.iter().any(|e| e == n)
            && schedule::node_refusal(pass, node, vs.volume).is_none()
        {
            eligible.nodes.push((*n).to_string());
            eligible.zones.insert(node.zone.clone());
        }
    }
    eligible.nodes.sort();
    let s = pass.settings;
    let zone_soft = s.replica_zone_soft_anti_affinity();
    let node_soft = s.replica_soft_anti_affinity();

    // Least effort: cover unused zones, then unused nodes.
    let used_zones = zone_count.len();
    if used_zones < wanted {
        let free: Vec<&String> = eligible
            .zones
            .iter()
            .filter(|z| !zone_count.contains_key(z.as_str()))
            .collect();
        let k = free.len().min(wanted - used_zones);
        if k > 0 && vs.balance == AutoBalance::LeastEffort {
            return free.into_iter().take(k).map(|z| Target::zone(z)).collect();
        }
    }
    let used_nodes = node_count.len();
    if used_nodes < wanted && vs.balance == AutoBalance::LeastEffort {
        let mut free: Vec<&String> = eligible
            .nodes
            .iter()
            .filter(|n| !node_count.contains_key(n.as_str()))
            .filter(|n| zone_soft || !zone_count.contains_key(pass.zone_of(n)))
            .collect();
        free.sort_by_key(|n| {
            (
                zone_count.get(pass.zone_of(n)).copied().unwrap_or(0),
                n.as_str(),
            )
        });
        let k = free.len().min(wanted - used_nodes);
        return free
            .into_iter()
            .take(k)
            .map(|n| Target::node(Rule::NodeBalance, n))
            .collect();
    }
    if vs.balance == AutoBalance::LeastEffort {
        return Vec::new();
    }
    best_effort(pass, vs, &eligible.nodes, node_count, zone_soft, node_soft)
}

/// Moves one replica at a time from the most to the least loaded zone, then
/// node, on a simulated layout, and returns the creates of the final one.
fn best_effort(
    pass: &Pass,
    vs: &VolumeState,
    eligible: &[String],
    start: BTreeMap<&str, usize>,
    zone_soft: bool,
    node_soft: bool,
) -> Vec<Target> {
    let b = Balancer {
        pass,
        // The local replica stays, unless it is being evicted.
        pinned: vs.local_node().filter(|n| {
            vs.rw
                .iter()
                .any(|r| r.node == *n && !pass.evicting.contains(&r.name))
        }),
        eligible: eligible.iter().map(String::as_str).collect(),
        zone_soft,
        node_soft,
    };
    let mut count: BTreeMap<&str, usize> = start.clone();
    for n in eligible {
        count.entry(n.as_str()).or_default();
    }
    for _ in 0..(vs.wanted() * vs.wanted() + 1) {
        if !b.zone_move(&mut count) && !b.node_move(&mut count) {
            break;
        }
    }
    b.targets(&start, &count)
}

/// One best-effort balancing of a volume's replicas over nodes and zones,
/// one replica moved at a time on a count per node.
struct Balancer<'a> {
    pass: &'a Pass<'a>,
    /// The node whose (local) replica stays.
    pinned: Option<&'a str>,
    eligible: std::collections::BTreeSet<&'a str>,
    zone_soft: bool,
    node_soft: bool,
}

impl<'a> Balancer<'a> {
    /// Replicas per zone (zones of eligible nodes, and of nodes holding
    /// some).
    fn zone_totals(&self, count: &BTreeMap<&'a str, usize>) -> BTreeMap<&'a str, usize> {
        let mut z: BTreeMap<&str, usize> = BTreeMap::new();
        for (n, c) in count {
            if *c > 0 || self.eligible.contains(n) {
                *z.entry(self.pass.zone_of(n)).or_default() += c;
            }
        }
        z
    }

    fn can_give(&self, n: &str, c: usize) -> bool {
        c > 0 && !(self.pinned == Some(n) && c <= 1)
    }

    fn can_take(
        &self,
        n: &str,
        count: &BTreeMap<&str, usize>,
        zones: &BTreeMap<&str, usize>,
    ) -> bool {
        self.eligible.contains(n)
            && (self.node_soft || count.get(n).copied().unwrap_or(0) == 0)
            && (self.zone_soft || zones.get(self.pass.zone_of(n)).copied().unwrap_or(0) == 0)
    }

    /// Moves one replica from the fullest zone to the emptiest when they
    /// differ by two or more.
    fn zone_move(&self, count: &mut BTreeMap<&'a str, usize>) -> bool {
        let pass = self.pass;
        let zones = self.zone_totals(count);
        let donor_zone = zones
            .iter()
            .filter(|(z, _)| {
                count
                    .iter()
                    .any(|(n, c)| pass.zone_of(n) == **z && self.can_give(n, *c))
            })
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(z, c)| (*z, *c));
        let taker_zone = zones
            .iter()
            .filter(|(z, _)| {
                count
                    .keys()
                    .any(|n| pass.zone_of(n) == **z && self.can_take(n, count, &zones))
            })
            .min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))
            .map(|(z, c)| (*z, *c));
        let (Some((dz, dc)), Some((tz, tc))) = (donor_zone, taker_zone) else {
            return false;
        };
        if dc < tc + 2 {
            return false;
        }
        let donor = most_loaded(count, |n, c| pass.zone_of(n) == dz && self.can_give(n, c));
        let taker = least_loaded(count, |n| {
            pass.zone_of(n) == tz && self.can_take(n, count, &zones)
        });
        let (Some(d), Some(t)) = (donor, taker) else {
            return false;
        };
        *count.entry(d).or_default() -= 1;
        *count.entry(t).or_default() += 1;
        true
    }

    /// Moves one replica from the fullest node to a node with two fewer,
    /// only when zones stay as balanced as they were.
    fn node_move(&self, count: &mut BTreeMap<&'a str, usize>) -> bool {
        let pass = self.pass;
        let spread = |c: &BTreeMap<&'a str, usize>| {
            let z = self.zone_totals(c);
            z.values().max().copied().unwrap_or(0) - z.values().min().copied().unwrap_or(0)
        };
        let before = spread(count);
        let zones = self.zone_totals(count);
        let Some(d) = most_loaded(count, |n, c| self.can_give(n, c)) else {
            return false;
        };
        let dc = count[d];
        let mut takers: Vec<(&str, usize)> = count
            .iter()
            .filter(|(n, _)| self.can_take(n, count, &zones))
            .map(|(n, c)| (*n, *c))
            .collect();
        takers.sort_by_key(|(n, c)| (*c, pass.zone_of(n) != pass.zone_of(d), *n));
        for (t, tc) in takers {
            if t == d || dc < tc + 2 {
                continue;
            }
            let mut trial = count.clone();
            *trial.entry(d).or_default() -= 1;
            *trial.entry(t).or_default() += 1;
            if spread(&trial) <= before.max(1) {
                *count = trial;
                return true;
            }
        }
        false
    }

    /// The creates: nodes that end with more than they started with; a
    /// zone move when the node's zone gained too.
    fn targets(
        &self,
        start: &BTreeMap<&'a str, usize>,
        count: &BTreeMap<&'a str, usize>,
    ) -> Vec<Target> {
        let mut start_zones: BTreeMap<&str, usize> = BTreeMap::new();
        for (n, c) in start {
            *start_zones.entry(self.pass.zone_of(n)).or_default() += c;
        }
        let end_zones = self.zone_totals(count);
        let mut out = Vec::new();
        for (n, c) in count {
            let had = start.get(n).copied().unwrap_or(0);
            let zone = self.pass.zone_of(n);
            let zone_gained = end_zones.get(zone).copied().unwrap_or(0)
                > start_zones.get(zone).copied().unwrap_or(0);
            let rule = if zone_gained {
                Rule::ZoneBalance
            } else {
                Rule::NodeBalance
            };
            for _ in had..*c {
                out.push(Target::node(rule, n));
            }
        }
        out
    }
}

fn most_loaded<'n>(
    count: &BTreeMap<&'n str, usize>,
    ok: impl Fn(&str, usize) -> bool,
) -> Option<&'n str> {
    count
        .iter()
        .filter(|(n, c)| ok(n, **c))
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(n, _)| *n)
}

fn least_loaded<'n>(
    count: &BTreeMap<&'n str, usize>,
    ok: impl Fn(&str) -> bool,
) -> Option<&'n str> {
    count
        .iter()
        .filter(|(n, _)| ok(n))
        .min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))
        .map(|(n, _)| *n)
}

/// `moves`' first fast path for a volume of `wanted` rw replicas, read from
/// the replicas' `Facts` (their records are not read): every rw replica in
/// a zone of its own. False when it cannot tell.
fn rw_in_zones_of_their_own(pass: &Pass, vs: &VolumeState) -> bool {
    let Some(i) = vs.place else {
        return false;
    };
    let mut zones = [0u32; 8];
    let mut n = 0;
    for f in pass.facts_at(i).filter(|f| f.rw()) {
        let Some(slot) = zones.get_mut(n) else {
            return false;
        };
        *slot = pass.zone_number(f);
        n += 1;
    }
    let zones = &mut zones[..n];
    zones.sort_unstable();
    n == vs.rw.len() && zones.windows(2).all(|w| w[0] != w[1])
}

/// Issues the creates balance wants for a healthy, settled volume.
pub fn plan(pass: &mut Pass, vs: &VolumeState, plan: &mut Plan) {
    if pass.busy.contains(&vs.volume.name)
        || vs.rw.len() != vs.wanted()
        || !vs.rebuilding.is_empty()
        || vs.rw.iter().any(|r| pass.evicting.contains(&r.name))
    {
        return;
    }
    if rw_in_zones_of_their_own(pass, vs) {
        return;
    }
    let layout: Vec<&str> = vs.rw.iter().map(|r| r.node.as_str()).collect();
    let targets = moves(pass, vs, &layout, &[]);
    if targets.is_empty() {
        return;
    }
    pass.busy.insert(vs.volume.name.clone());
    let name = &vs.volume.name;
    let mut peers = Peer::of(vs.rw.iter().copied());
    for t in targets {
        let mut req = Request::new(vs.volume, peers.clone());
        req.only_zone = t.zone.as_deref();
        req.only_node = t.node.as_deref();
        // A balance move never lands on a disk it would pressure.
        req.below_used_percent = disk_pressure::threshold(pass, vs);
        let label = match (&t.zone, &t.node) {
            (_, Some(n)) => format!("node {n}"),
            (Some(z), None) => format!("zone {z:?}"),
            (None, None) => "any node".to_string(),
        };
        match schedule::choose(pass, &req) {
            Ok(p) if pass.rebuild_slot(&p.node) => {
                pass.reserve(&p.node, &p.disk, vs.volume.size, true);
                plan.act(
                    t.rule,
                    new_replica(vs, &p.node, &p.disk),
                    format!(
                        "{name} is unbalanced ({} mode): adding a replica in {label} on {}/{}; a duplicate is deleted once it is rw",
                        vs.balance, p.node, p.disk
                    ),
                );
                peers.push(Peer {
                    node: p.node,
                    disk: p.disk,
                });
            }
            Ok(p) => {
                plan.block(
                    vs.object(),
                    t.rule,
                    format!("{name}: balance waits for a rebuild slot on {}", p.node),
                );
                break;
            }
            Err(reasons) => {
                plan.block(
                    vs.object(),
                    t.rule,
                    format!(
                        "{name}: balance cannot place a replica in {label}: {}",
                        reasons.join("; ")
                    ),
                );
                break;
            }
        }
    }
}
