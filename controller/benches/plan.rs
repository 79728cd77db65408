//! Planning passes over healthy clusters of 1k to 100k volumes (3 replicas
//! each, spread over 3 zones; 100 to 3k nodes): the median time of a full
//! pass and of an incremental one (`plan_incremental`, after a first pass
//! filled its memo), the cost per volume of each, the full pass again
//! from a cold cache (128 MiB written before each, as a controller's pass
//! finds the cache after seconds of other work), and the memory: the peak
//! heap a full pass takes, and what the memo keeps, per volume. Beside it,
//! the time to build that view from the same cluster's records
//! (`observe::view_of`, what the controller does before every pass), and
//! the heap the controller's copy of those records keeps (`mirror`).
//! Draws the cost per volume against the volume count into
//! docs/images/planner-cost.png. Run:
//! `cargo bench -p ballast-controller --bench plan`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use ballast::model::{Node, Replica, ReplicaMode, Volume, VolumeSpec};
use ballast::settings::Settings;
use ballast_controller::executor::effects;
use ballast_controller::observe;
use ballast_controller::planner::{
    self, ClusterView, DiskView, Memo, NodeView, ReplicaView, VolumeView,
};
use chrono::{DateTime, TimeZone, Utc};

/// The system allocator, counting the bytes in use and their peak while
/// `COUNTING` is set (off while passes are timed).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static IN_USE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            let size = layout.size() as isize;
            let now = IN_USE.fetch_add(size, Ordering::Relaxed) + size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            IN_USE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The peak heap `f` takes above where it starts, and what it leaves.
fn heap<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    IN_USE.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    let out = f();
    COUNTING.store(false, Ordering::Relaxed);
    let (peak, left) = (PEAK.load(Ordering::Relaxed), IN_USE.load(Ordering::Relaxed));
    (out, peak.max(0) as usize, left.max(0) as usize)
}

#[global_allocator]
static ALLOC: Counting = Counting;

mod common;

use common::GIB;

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

/// The records of the same cluster as `cluster` builds, as the store
/// lists them (each kind sorted by name).
fn records(volumes: usize, nodes: usize) -> (Vec<Node>, Vec<Volume>, Vec<Replica>) {
    let zones = 3;
    let t0 = Utc
        .timestamp_opt(1_700_000_000, 0)
        .single()
        .unwrap_or_default();
    let node_records = (0..nodes)
        .map(|n| common::node(format!("node-{n:05}"), format!("zone-{}", n % zones), None))
        .collect();
    let mut volume_records = Vec::with_capacity(volumes);
    let mut replica_records = Vec::with_capacity(3 * volumes);
    for v in 0..volumes {
        let name = format!("vol-{v:06}");
        let mut volume = Volume {
            name: name.clone(),
            resource_version: 1,
            spec: VolumeSpec::new(10 * GIB, 3),
            status: Default::default(),
        };
        volume.status.attached_node = Some(format!("node-{:05}", v % nodes));
        volume.status.generation = 1;
        let group = v % (nodes / zones);
        for k in 0..3 {
            let replica = format!("{name}-r{k}");
            let mut r = effects::new_replica(
                &replica,
                &name,
                &format!("node-{:05}", group * zones + k),
                &format!("d{}", v % 2),
                Some(ReplicaMode::Rw),
            );
            r.spec.healthy_at = Some(t0);
            volume.status.current_replicas.push(replica);
            replica_records.push(r);
        }
        volume_records.push(volume);
    }
    replica_records.sort_by(|a, b| a.name.cmp(&b.name));
    (node_records, volume_records, replica_records)
}

/// The median of `runs` timings of `f`.
fn median(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..runs).map(|_| f()).collect();
    times.sort();
    times[times.len() / 2]
}

struct Row {
    volumes: usize,
    full_us: f64,
    /// The full pass, each after the cache was flushed.
    cold_us: f64,
    incremental_us: f64,
    /// Building the view from the records, per volume.
    view_us: f64,
}

impl Row {
    /// `us` per volume over the whole cluster, in milliseconds.
    fn ms(&self, us: f64) -> f64 {
        us * self.volumes as f64 / 1e3
    }
}

fn measure(
    volumes: usize,
    nodes: usize,
    runs: usize,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Row {
    let view = cluster(volumes, nodes);
    let full = median(runs, || {
        let start = Instant::now();
        let plan = planner::plan(&view, settings, now);
        let took = start.elapsed();
        if let Some(a) = plan.changes().next() {
            panic!("a healthy cluster needs nothing, but: {a:?}");
        }
        took
    });
    let mut other_work = vec![0u8; 128 << 20];
    let mut round = 0u8;
    let cold = median(runs, || {
        round = round.wrapping_add(1);
        for b in other_work.iter_mut().step_by(64) {
            *b = round;
        }
        std::hint::black_box(&other_work);
        let start = Instant::now();
        let plan = planner::plan(&view, settings, now);
        let took = start.elapsed();
        drop(std::hint::black_box(plan));
        took
    });
    drop(other_work);
    let (_, pass_bytes, _) = heap(|| planner::plan(&view, settings, now));
    let mut memo = Memo::default();
    // What the first incremental pass leaves behind is its memo.
    let (plan, _, memo_bytes) = heap(|| planner::plan_incremental(&view, settings, now, &mut memo));
    drop(plan);
    assert_eq!(
        memo.settled(),
        volumes,
        "every volume of a healthy cluster settles"
    );
    let incremental = median(runs, || {
        let start = Instant::now();
        let plan = planner::plan_incremental(&view, settings, now, &mut memo);
        let took = start.elapsed();
        assert!(plan.is_empty(), "{plan:?}");
        took
    });
    let (n, v, r) = records(volumes, nodes);
    // What the controller's copy of these records keeps (`mirror`: each
    // kind in a map by name).
    let (copy, _, copy_bytes) = heap(|| {
        let (n, v, r) = records(volumes, nodes);
        (
            n.into_iter()
                .map(|x| (x.id.clone(), x))
                .collect::<std::collections::BTreeMap<_, _>>(),
            v.into_iter()
                .map(|x| (x.name.clone(), x))
                .collect::<std::collections::BTreeMap<_, _>>(),
            r.into_iter()
                .map(|x| (x.name.clone(), x))
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
    });
    drop(copy);
    let built = median(runs, || {
        let start = Instant::now();
        let built = observe::view_of(&n, &v, &r);
        let took = start.elapsed();
        assert_eq!(built.replicas.len(), 3 * volumes);
        assert!(
            built.replicas.iter().all(|r| r.is_rw()),
            "a current replica read as stale"
        );
        took
    });
    let per = |d: Duration| d.as_secs_f64() * 1e6 / volumes as f64;
    println!(
        "{volumes:>7} volumes on {nodes:>5} nodes: full pass {:>8.2} ms ({:>5.2} us per volume), from a cold cache {:>8.2} ms ({:>5.2} us per volume), incremental {:>8.2} ms ({:>5.2} us per volume); a pass's peak heap {:>5} B per volume, the memo {:>5} B per volume; the view from the records {:>8.2} ms ({:>5.2} us per volume); the controller's copy of the records {:>5} B per volume",
        full.as_secs_f64() * 1e3,
        per(full),
        cold.as_secs_f64() * 1e3,
        per(cold),
        incremental.as_secs_f64() * 1e3,
        per(incremental),
        pass_bytes / volumes,
        memo_bytes / volumes,
        built.as_secs_f64() * 1e3,
        per(built),
        copy_bytes / volumes,
    );
    Row {
        volumes,
        full_us: per(full),
        cold_us: per(cold),
        incremental_us: per(incremental),
        view_us: per(built),
    }
}

/// Cost per volume against the volume count, full and incremental.
fn draw(rows: &[Row], path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    // The font the labels are drawn with (Debian: fonts-dejavu-core).
    let font = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
    let bytes = std::fs::read(font)
        .map_err(|e| format!("{font}: {e} (apt-get install fonts-dejavu-core)"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into()))
        .map_err(|_| format!("{font}: not a font"))?;
    let root = BitMapBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = rows
        .iter()
        .map(|r| r.full_us.max(r.incremental_us).max(r.cold_us))
        .fold(0.0, f64::max)
        * 1.2;
    let (lo, hi) = (
        rows.first().map_or(1_000, |r| r.volumes),
        rows.last().map_or(100_000, |r| r.volumes),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Planner: cost per volume of one pass (3 replicas per volume)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            ((lo as f64) * 0.8..(hi as f64) * 1.25).log_scale(),
            0.0..top,
        )?;
    chart
        .configure_mesh()
        .x_desc("volumes in the cluster (log scale)")
        .y_desc("microseconds per volume")
        .x_label_formatter(&|v| format!("{:.0}k", v / 1000.0))
        .label_style(("sans-serif", 15))
        .draw()?;
    let series = [
        (
            "full pass",
            RGBColor(0x1f, 0x5f, 0xa8),
            rows.iter()
                .map(|r| (r.volumes as f64, r.full_us))
                .collect::<Vec<_>>(),
        ),
        (
            "full pass, from a cold cache",
            RGBColor(0x2a, 0x8a, 0x3a),
            rows.iter().map(|r| (r.volumes as f64, r.cold_us)).collect(),
        ),
        (
            "incremental pass (nothing changed)",
            RGBColor(0xc0, 0x50, 0x10),
            rows.iter()
                .map(|r| (r.volumes as f64, r.incremental_us))
                .collect(),
        ),
    ];
    for (label, color, points) in series {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 5, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() {
    let settings = common::settings();
    let now = Utc
        .timestamp_opt(1_700_000_100, 0)
        .single()
        .unwrap_or_default();
    println!(
        "planner: one pass over a healthy cluster, 3 replicas per volume, best-effort balance"
    );
    let rows: Vec<Row> = [
        (1_000, 100, 9),
        (3_000, 300, 9),
        (10_000, 1_000, 7),
        (30_000, 1_000, 5),
        (100_000, 3_000, 5),
    ]
    .into_iter()
    .map(|(volumes, nodes, runs)| measure(volumes, nodes, runs, &settings, now))
    .collect();
    // The goals, as ratios: a pass at the largest size against
    // its 100 ms budget, and the cost per volume there against the
    // smallest size's (flat is 1.0x).
    if let (Some(small), Some(large)) = (rows.first(), rows.last()) {
        let (pass, with_view) = (
            large.ms(large.full_us),
            large.ms(large.full_us + large.view_us),
        );
        println!(
            "goal: a full pass over {} volumes under 100 ms: {pass:.2} ms, {:.2}x of the budget ({:.2}x with the view built from the records, {with_view:.2} ms)",
            large.volumes,
            pass / 100.0,
            with_view / 100.0,
        );
        println!(
            "goal: cost per volume flat from {} to {} volumes: {:.2}x (full pass), {:.2}x (from a cold cache), {:.2}x (the view from the records)",
            small.volumes,
            large.volumes,
            large.full_us / small.full_us,
            large.cold_us / small.cold_us,
            large.view_us / small.view_us,
        );
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/images/planner-cost.png");
    match draw(&rows, &path) {
        Ok(()) => println!("plot: {}", path.display()),
        Err(e) => {
            eprintln!("the plot was not drawn: {e}");
            std::process::exit(1);
        }
    }
}
