//! One planning pass over large healthy clusters: 1k volumes on 100 nodes,
//! 10k on 1k and 100k on 3k, each volume with 3 replicas spread over 3
//! zones. Prints the median time of several passes and the cost per
//! volume. Run: `cargo bench -p ballast-controller --bench plan`.

use std::time::{Duration, Instant};

use ballast::model::ReplicaMode;
use ballast::settings::Settings;
use ballast_controller::planner::{self, ClusterView, DiskView, NodeView, ReplicaView, VolumeView};
use chrono::{TimeZone, Utc};

const GIB: u64 = 1 << 30;

fn cluster(volumes: usize, nodes: usize) -> ClusterView {
    let zones = 3;
    let t0 = Utc
        .timestamp_opt(1_700_000_000, 0)
        .single()
        .unwrap_or_default();
    let mut view = ClusterView::default();
    for n in 0..nodes {
        let mut node = NodeView::healthy(&format!("node-{n:05}"), &format!("zone-{}", n % zones));
        node.disks = (0..2)
            .map(|d| DiskView::healthy(&format!("d{d}"), 100_000 * GIB, 60_000 * GIB))
            .collect();
        view.nodes.push(node);
    }
    for v in 0..volumes {
        let name = format!("vol-{v:06}");
        let mut volume = VolumeView::plain(&name, 10 * GIB, 3);
        volume.actual_size = 5 * GIB;
        volume.attached_node = Some(format!("node-{:05}", v % nodes));
        view.volumes.push(volume);
        // Three replicas on a group of three consecutive nodes: one per zone.
        let group = v % (nodes / zones);
        for k in 0..3 {
            let node = group * zones + k;
            view.replicas.push(ReplicaView::placed(
                (&format!("{name}-r{k}"), &name),
                (&format!("node-{node:05}"), &format!("d{}", v % 2)),
                ReplicaMode::Rw,
                t0,
            ));
        }
    }
    view.replicas.sort_by(|a, b| a.name.cmp(&b.name));
    view
}

fn main() {
    let settings = Settings::from_overrides([
        ("replica-auto-balance", "best-effort"),
        ("replica-soft-anti-affinity", "true"),
    ]);
    let now = Utc
        .timestamp_opt(1_700_000_100, 0)
        .single()
        .unwrap_or_default();
    println!(
        "planner: one pass over a healthy cluster, 3 replicas per volume, best-effort balance"
    );
    for (volumes, nodes, runs) in [(1_000, 100, 9), (10_000, 1_000, 7), (100_000, 3_000, 3)] {
        let view = cluster(volumes, nodes);
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| {
                let start = Instant::now();
                let plan = planner::plan(&view, &settings, now);
                let took = start.elapsed();
                if let Some(a) = plan.changes().next() {
                    panic!("a healthy cluster needs nothing, but: {a:?}");
                }
                took
            })
            .collect();
        times.sort();
        let median = times[times.len() / 2];
        println!(
            "{volumes:>7} volumes on {nodes:>5} nodes: {:>9.2} ms per pass, {:>6.2} us per volume",
            median.as_secs_f64() * 1e3,
            median.as_secs_f64() * 1e6 / volumes as f64
        );
    }
}
