//! `ballastctl`'s commands: the command line (clap), each command's call
//! to the REST API, and how its answer is printed.

use ballast::api::{List, ReplicaSummary, SettingView, VolumeDetail};
use ballast::model::{Event, Node, Replica, ReplicaMode, Snapshot, Volume};
use ballast::quantity::parse_size;
use ballast_controller::api::PlanView;
use clap::{Parser, Subcommand, ValueEnum};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::client::{Client, CtlError};
use super::render::{self, Row};

#[derive(Debug, Parser)]
#[command(
    name = "ballastctl",
    version,
    about = "Talk to a Ballast controller's REST API"
)]
pub struct Cli {
    /// The controller's REST API.
    #[arg(
        long,
        env = "BALLAST_API",
        default_value = "http://127.0.0.1:9500",
        global = true
    )]
    pub api: String,
    /// The API's bearer token, sent with every change (see the
    /// controller's --api-token-file).
    #[arg(long, env = "BALLAST_API_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Volumes.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Replicas.
    #[command(subcommand)]
    Replica(ReplicaCmd),
    /// Snapshots of volumes.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Nodes and their disks.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Settings.
    #[command(subcommand)]
    Setting(SettingCmd),
    /// What the controller would do next, and why, without doing it.
    Plan {
        /// Only what concerns this volume.
        #[arg(long)]
        volume: Option<String>,
    },
    /// A completion script for `shell`, e.g.
    /// `ballastctl completion bash > /etc/bash_completion.d/ballastctl`.
    Completion { shell: clap_complete::Shell },
    /// Events, newest last.
    Events {
        /// Only events of KIND/NAME, e.g. node/node-1.
        #[arg(long)]
        object: Option<String>,
        /// Keep printing new events until interrupted.
        #[arg(long)]
        watch: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    List,
    Get {
        name: String,
    },
    Create {
        name: String,
        /// Size, e.g. 1Gi.
        #[arg(long)]
        size: String,
        /// Start with the data of this snapshot (a restore).
        #[arg(long, conflicts_with = "clone_of")]
        from_snapshot: Option<String>,
        /// Start with the data this volume holds now (a clone).
        #[arg(long)]
        clone_of: Option<String>,
        #[command(flatten)]
        options: VolumeOptions,
    },
    Update {
        name: String,
        #[command(flatten)]
        options: VolumeOptions,
        /// Wait until the volume has all its replicas rw, showing each
        /// rebuild's progress.
        #[arg(long)]
        wait: bool,
    },
    Delete {
        name: String,
    },
    /// Start the volume's engine on a node; prints its NBD endpoint.
    Attach {
        name: String,
        #[arg(long)]
        node: String,
    },
    /// Stop the volume's engine.
    Detach {
        name: String,
    },
    /// Follow the volume until every replica is rw, with a progress bar for
    /// each rebuild.
    Watch {
        name: String,
    },
    /// Grow a volume, attached (online) or not: every replica grows; volumes
    /// never shrink.
    Expand {
        name: String,
        /// The new size, e.g. 2Gi.
        #[arg(long)]
        size: String,
    },
    /// Accept data loss: make REPLICA the only one holding the detached
    /// volume's data, when no replica with its latest data can be reached.
    /// What only the others held is lost. Recorded as an event.
    Salvage {
        name: String,
        #[arg(long)]
        replica: String,
        /// Even when a replica that holds the latest data seems reachable
        /// (its data may be gone).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    List {
        /// Only the snapshots of this volume.
        #[arg(long)]
        volume: Option<String>,
    },
    Get {
        name: String,
    },
    /// Take a snapshot of a volume now: every replica frozen at one point.
    Create {
        name: String,
        #[arg(long)]
        volume: String,
    },
    Delete {
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReplicaCmd {
    List {
        #[arg(long)]
        volume: Option<String>,
        #[arg(long)]
        node: Option<String>,
    },
    Delete {
        name: String,
    },
    /// Check every block of the replica's frozen layers against its
    /// checksums now; a corrupt replica is failed and rebuilt.
    Scrub {
        name: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    fn yes(self) -> bool {
        self == OnOff::On
    }
}

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    List,
    Get {
        id: String,
    },
    /// Mark the node unschedulable (as kubectl cordon does).
    Cordon {
        id: String,
    },
    Uncordon {
        id: String,
    },
    /// Allow or forbid new replicas on the node.
    Schedule {
        id: String,
        state: OnOff,
    },
    /// Request or cancel eviction of every replica on the node.
    Evict {
        id: String,
        state: OnOff,
    },
    /// Set the node's zone.
    Zone {
        id: String,
        zone: String,
    },
    /// Change one disk.
    Disk {
        id: String,
        disk: String,
        #[arg(long)]
        schedule: Option<OnOff>,
        #[arg(long)]
        evict: Option<OnOff>,
        /// Bytes kept free, e.g. 10Gi.
        #[arg(long)]
        reserved: Option<String>,
        /// Disk tags, comma separated.
        #[arg(long)]
        tags: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SettingCmd {
    List,
    Get { name: String },
    Set { name: String, value: String },
}

/// How answers are shown: the API's JSON as it came, or tables.
#[derive(Clone, Copy)]
struct Out {
    format: Output,
}

impl Out {
    /// Whether the answer is printed as it is (JSON or YAML), not as a
    /// table.
    fn raw(self) -> bool {
        self.format != Output::Table
    }

    /// Prints `v` as it is, when that is the format: then true.
    fn printed(self, v: &Value) -> bool {
        match self.format {
            Output::Table => return false,
            Output::Json => print_json(v),
            Output::Yaml => print!("{}", yaml(v)),
        }
        true
    }

    /// One object of kind `T`.
    fn one<T: Row + DeserializeOwned>(self, v: &Value) -> Result<(), CtlError> {
        if !self.printed(v) {
            render::table(&[typed::<T>(v)?]);
        }
        Ok(())
    }

    /// A list (`{"items": [...]}`) of kind `T`.
    fn list<T: Row + DeserializeOwned>(self, v: &Value) -> Result<(), CtlError> {
        if !self.printed(v) {
            render::table(&typed::<List<T>>(v)?.items);
        }
        Ok(())
    }
}

/// `v` as a YAML document.
fn yaml(v: &Value) -> String {
    serde_yaml_ng::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// The API's answer as the model type it is.
fn typed<T: DeserializeOwned>(v: &Value) -> Result<T, CtlError> {
    serde_json::from_value(v.clone()).map_err(unreadable)
}

fn unreadable(e: serde_json::Error) -> CtlError {
    CtlError::Api {
        status: 200,
        message: format!("the API answered with something this ballastctl cannot read: {e}"),
    }
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

fn size_arg(flag: &str, value: &str) -> Result<u64, CtlError> {
    parse_size(value).map_err(|e| CtlError::Usage(format!("--{flag}: {e}")))
}

// The volume fields `create` and `update` both take. (A plain comment:
// a doc comment here would become both commands' help text.)
#[derive(Debug, clap::Args)]
pub struct VolumeOptions {
    #[arg(long)]
    replicas: Option<u32>,
    /// disabled, best-effort or strict-local.
    #[arg(long)]
    data_locality: Option<String>,
    /// ignored, disabled, least-effort or best-effort.
    #[arg(long)]
    auto_balance: Option<String>,
    /// MiB/s each copy rebuilding a replica may take, over the network or
    /// within a node; 0 follows the settings replica-rebuild-rate and
    /// offline-copy-rate.
    #[arg(long, value_name = "MIB_PER_S")]
    rebuild_rate: Option<u64>,
}

impl VolumeOptions {
    /// Adds the fields given on the command line to `body`.
    fn add_to(self, body: &mut Value) {
        if let Some(r) = self.replicas {
            body["numberOfReplicas"] = json!(r);
        }
        if let Some(d) = self.data_locality {
            body["dataLocality"] = json!(d);
        }
        if let Some(a) = self.auto_balance {
            body["replicaAutoBalance"] = json!(a);
        }
        if let Some(r) = self.rebuild_rate {
            body["replicaRebuildRate"] = json!(r);
        }
    }
}

/// Runs one command; the caller prints the error and exits non-zero.
pub async fn run(cli: Cli) -> Result<(), CtlError> {
    if let Command::Completion { shell } = cli.command {
        use clap::CommandFactory;
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "ballastctl",
            &mut std::io::stdout(),
        );
        return Ok(());
    }
    let c = Client::new(&cli.api, cli.token.clone());
    let out = Out { format: cli.output };
    match cli.command {
        Command::Volume(cmd) => volume(&c, out, cmd).await,
        Command::Replica(cmd) => replica(&c, out, cmd).await,
        Command::Snapshot(cmd) => snapshot(&c, out, cmd).await,
        Command::Node(cmd) => node(&c, out, cmd).await,
        Command::Setting(cmd) => setting(&c, out, cmd).await,
        Command::Plan { volume } => plan(&c, out, volume).await,
        Command::Events { object, watch } => events(&c, out, object, watch).await,
        Command::Completion { .. } => Ok(()),
    }
}

async fn volume(c: &Client, out: Out, cmd: VolumeCmd) -> Result<(), CtlError> {
    let path = |name: &str, what: &str| format!("/v1/volumes/{name}{what}");
    match cmd {
        VolumeCmd::List => out.list::<Volume>(&c.get("/v1/volumes").await?),
        VolumeCmd::Get { name } => {
            let v = c.get(&path(&name, "")).await?;
            if out.printed(&v) {
                return Ok(());
            }
            let detail = VolumeDetail::from_json(&v).map_err(unreadable)?;
            render::table(std::slice::from_ref(&detail.volume));
            if !detail.replicas.is_empty() {
                println!();
                render::table(&detail.replicas);
            }
            if !detail.volume.status.conditions.is_empty() {
                println!();
                render::table(&detail.volume.status.conditions);
            }
            // What the planner would do for it now (what it waits for, or
            // why it cannot, is its Scheduled condition, above).
            let p: PlanView = typed(&c.get(&format!("/v1/plan?volume={name}")).await?)?;
            if !p.actions.is_empty() {
                println!();
                render::table(&p.actions);
            }
            Ok(())
        }
        VolumeCmd::Create {
            name,
            size,
            from_snapshot,
            clone_of,
            options,
        } => {
            let mut body = json!({ "name": name, "size": size_arg("size", &size)? });
            if let Some(s) = from_snapshot {
                body["source"] = json!({ "snapshot": s });
            }
            if let Some(v) = clone_of {
                body["source"] = json!({ "volume": v });
            }
            options.add_to(&mut body);
            out.one::<Volume>(&c.call(Method::POST, "/v1/volumes", Some(body)).await?)
        }
        VolumeCmd::Update {
            name,
            options,
            wait,
        } => {
            let mut body = json!({});
            options.add_to(&mut body);
            if body.as_object().is_some_and(Map::is_empty) {
                return Err(CtlError::Usage(
                    "nothing to update: give --replicas, --data-locality, --auto-balance or --rebuild-rate".into(),
                ));
            }
            let v = c.call(Method::PATCH, &path(&name, ""), Some(body)).await?;
            out.one::<Volume>(&v)?;
            if wait {
                wait_replicas(c, &name).await?;
            }
            Ok(())
        }
        VolumeCmd::Delete { name } => {
            c.call(Method::DELETE, &path(&name, ""), None).await?;
            println!("volume {name} deleted");
            Ok(())
        }
        VolumeCmd::Attach { name, node } => {
            let body = json!({"nodeId": node});
            let v = c
                .call(Method::POST, &path(&name, "/attach"), Some(body))
                .await?;
            if !out.printed(&v) {
                let vol: Volume = typed(&v)?;
                println!("{}", vol.status.frontend_endpoint.unwrap_or_default());
            }
            Ok(())
        }
        VolumeCmd::Watch { name } => wait_replicas(c, &name).await,
        VolumeCmd::Detach { name } => {
            out.one::<Volume>(&c.call(Method::POST, &path(&name, "/detach"), None).await?)
        }
        VolumeCmd::Expand { name, size } => {
            let body = json!({"size": size_arg("size", &size)?});
            out.one::<Volume>(
                &c.call(Method::POST, &path(&name, "/expand"), Some(body))
                    .await?,
            )
        }
        VolumeCmd::Salvage {
            name,
            replica,
            force,
        } => {
            let body = json!({"replica": replica, "force": force});
            let v = c
                .call(Method::POST, &path(&name, "/salvage"), Some(body))
                .await?;
            if !out.raw() {
                eprintln!(
                    "{name} salvaged from {replica}: writes only other replicas held are lost"
                );
            }
            out.one::<Volume>(&v)
        }
    }
}

async fn snapshot(c: &Client, out: Out, cmd: SnapshotCmd) -> Result<(), CtlError> {
    match cmd {
        SnapshotCmd::List { volume } => {
            let path = match volume {
                Some(v) => format!("/v1/snapshots?volume={v}"),
                None => "/v1/snapshots".to_string(),
            };
            out.list::<Snapshot>(&c.get(&path).await?)
        }
        SnapshotCmd::Get { name } => {
            out.one::<Snapshot>(&c.get(&format!("/v1/snapshots/{name}")).await?)
        }
        SnapshotCmd::Create { name, volume } => {
            let body = json!({ "name": name, "volume": volume });
            out.one::<Snapshot>(&c.call(Method::POST, "/v1/snapshots", Some(body)).await?)
        }
        SnapshotCmd::Delete { name } => {
            c.call(Method::DELETE, &format!("/v1/snapshots/{name}"), None)
                .await?;
            println!("snapshot {name} deleted");
            Ok(())
        }
    }
}

async fn replica(c: &Client, out: Out, cmd: ReplicaCmd) -> Result<(), CtlError> {
    match cmd {
        ReplicaCmd::List { volume, node } => {
            let q: Vec<String> = [("volume", volume), ("node", node)]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
                .collect();
            let path = if q.is_empty() {
                "/v1/replicas".to_string()
            } else {
                format!("/v1/replicas?{}", q.join("&"))
            };
            out.list::<Replica>(&c.get(&path).await?)
        }
        ReplicaCmd::Delete { name } => {
            c.call(Method::DELETE, &format!("/v1/replicas/{name}"), None)
                .await?;
            println!("replica {name} deleted");
            Ok(())
        }
        ReplicaCmd::Scrub { name } => {
            let v = c
                .call(Method::POST, &format!("/v1/replicas/{name}/scrub"), None)
                .await?;
            if out.printed(&v) {
                // Printed as it is.
            } else if v["sound"] == true {
                println!("replica {name}: every block checked, sound");
            } else {
                println!("replica {name}: corrupt; it is failed and will be rebuilt");
            }
            Ok(())
        }
    }
}

/// The body of a change to one disk; at least one change is asked for.
fn disk_patch(
    schedule: Option<OnOff>,
    evict: Option<OnOff>,
    reserved: Option<String>,
    tags: Option<String>,
) -> Result<Value, CtlError> {
    let mut body = json!({});
    if let Some(v) = schedule {
        body["allowScheduling"] = json!(v.yes());
    }
    if let Some(v) = evict {
        body["evictionRequested"] = json!(v.yes());
    }
    if let Some(r) = reserved {
        body["storageReserved"] = json!(size_arg("reserved", &r)?);
    }
    if let Some(t) = tags {
        let list: Vec<&str> = t.split(',').filter(|x| !x.is_empty()).collect();
        body["tags"] = json!(list);
    }
    if body.as_object().is_some_and(Map::is_empty) {
        return Err(CtlError::Usage(
            "nothing to change: give --schedule, --evict, --reserved or --tags".into(),
        ));
    }
    Ok(body)
}

/// A node with its disks.
fn node_detail(out: Out, v: &Value) -> Result<(), CtlError> {
    if out.printed(v) {
        return Ok(());
    }
    let n: Node = typed(v)?;
    render::table(std::slice::from_ref(&n));
    println!();
    render::node_disks(&n);
    Ok(())
}

async fn node(c: &Client, out: Out, cmd: NodeCmd) -> Result<(), CtlError> {
    let (id, body) = match cmd {
        NodeCmd::List => return out.list::<Node>(&c.get("/v1/nodes").await?),
        NodeCmd::Get { id } => return node_detail(out, &c.get(&format!("/v1/nodes/{id}")).await?),
        NodeCmd::Disk {
            id,
            disk,
            schedule,
            evict,
            reserved,
            tags,
        } => {
            let body = disk_patch(schedule, evict, reserved, tags)?;
            let path = format!("/v1/nodes/{id}/disks/{disk}");
            return node_detail(out, &c.call(Method::PATCH, &path, Some(body)).await?);
        }
        NodeCmd::Cordon { id } => (id, json!({"cordoned": true})),
        NodeCmd::Uncordon { id } => (id, json!({"cordoned": false})),
        NodeCmd::Schedule { id, state } => (id, json!({"allowScheduling": state.yes()})),
        NodeCmd::Evict { id, state } => (id, json!({"evictionRequested": state.yes()})),
        NodeCmd::Zone { id, zone } => (id, json!({"zone": zone})),
    };
    let v = c
        .call(Method::PATCH, &format!("/v1/nodes/{id}"), Some(body))
        .await?;
    out.one::<Node>(&v)
}

async fn setting(c: &Client, out: Out, cmd: SettingCmd) -> Result<(), CtlError> {
    match cmd {
        SettingCmd::List => out.list::<SettingView>(&c.get("/v1/settings").await?),
        SettingCmd::Get { name } => {
            let v = c.get(&format!("/v1/settings/{name}")).await?;
            out.one::<SettingView>(&v)?;
            if !out.raw() {
                let s: SettingView = typed(&v)?;
                println!("\n{}\nAccepted: {}", s.description, s.accepted);
            }
            Ok(())
        }
        SettingCmd::Set { name, value } => {
            let body = json!({"value": value});
            let path = format!("/v1/settings/{name}");
            out.one::<SettingView>(&c.call(Method::PUT, &path, Some(body)).await?)
        }
    }
}

async fn plan(c: &Client, out: Out, volume: Option<String>) -> Result<(), CtlError> {
    let path = match &volume {
        Some(v) => format!("/v1/plan?volume={v}"),
        None => "/v1/plan".into(),
    };
    let v = c.get(&path).await?;
    if out.printed(&v) {
        return Ok(());
    }
    let p: PlanView = typed(&v)?;
    if p.actions.is_empty() {
        println!("Nothing to do.");
    } else {
        render::table(&p.actions);
    }
    for w in &p.waits {
        println!(
            "WAIT    volume {} until {}: {}",
            w.volume,
            w.until.to_rfc3339(),
            w.what
        );
    }
    for b in &p.blocked {
        println!("BLOCKED {}: {}", b.object, b.reason);
    }
    Ok(())
}

async fn events(c: &Client, out: Out, object: Option<String>, watch: bool) -> Result<(), CtlError> {
    let path = match &object {
        Some(o) => format!("/v1/events?object={o}"),
        None => "/v1/events".into(),
    };
    let first = c.get(&path).await?;
    out.list::<Event>(&first)?;
    if !watch {
        return Ok(());
    }
    let mut last = typed::<List<Event>>(&first)?
        .items
        .last()
        .map(|e| e.name.clone())
        .unwrap_or_default();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let v = c.get(&path).await?;
        for e in typed::<List<Event>>(&v)?.items {
            if e.name <= last {
                continue;
            }
            if out.format == Output::Json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            } else if out.format == Output::Yaml {
                println!(
                    "---\n{}",
                    yaml(&serde_json::to_value(&e).unwrap_or_default()).trim_end()
                );
            } else {
                let c = e.cells();
                println!("{}", c.join("  "));
            }
            last = e.name;
        }
    }
}

/// Where a volume's replicas stand: `2/3 rw; r-abc 42% (...)`, and whether
/// every wanted replica is rw.
fn replica_progress(d: &VolumeDetail) -> (String, bool) {
    let wanted = d.volume.spec.number_of_replicas as usize;
    // A detached volume's replica that no engine or rebuild reports on
    // (no mode) is as ready as it gets.
    let detached = d.volume.status.state == ballast::model::VolumeState::Detached;
    let is_rw = |r: &&ReplicaSummary| {
        r.mode == Some(ReplicaMode::Rw)
            || (detached && r.mode.is_none() && r.rebuild_progress.is_none())
    };
    let rw = d.replicas.iter().filter(is_rw).count();
    let mut line = format!("{rw}/{wanted} {}", if detached { "ready" } else { "rw" });
    for r in d.replicas.iter().filter(|r| !is_rw(r)) {
        let cell = render::rebuild_cell(r.rebuild_progress.as_ref());
        let state = if cell.is_empty() {
            r.mode.map(|m| m.to_string()).unwrap_or_else(|| "-".into())
        } else {
            cell
        };
        line.push_str(&format!("; {} on {} {state}", r.name, r.node_id));
    }
    (line, rw == wanted && d.replicas.len() == wanted)
}

/// Polls the volume until every wanted replica is rw (detached: until they
/// are all there and none is rebuilt or failed). On a terminal each
/// rebuild is a progress bar under the volume's line; elsewhere each change
/// of the line is printed as a line.
async fn wait_replicas(c: &Client, name: &str) -> Result<(), CtlError> {
    use std::io::IsTerminal;
    let mut bars = std::io::stderr().is_terminal().then(|| Bars::new(name));
    let mut last = String::new();
    loop {
        let v = c.get(&format!("/v1/volumes/{name}")).await?;
        let d = VolumeDetail::from_json(&v).map_err(unreadable)?;
        let (line, done) = replica_progress(&d);
        match &mut bars {
            Some(b) => b.show(&line, &d.replicas),
            None if line != last => eprintln!("{name}: {line}"),
            None => {}
        }
        last = line;
        if done {
            if let Some(b) = bars {
                b.finish();
            }
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// A volume's line and a bar per replica being rebuilt (indicatif).
struct Bars {
    all: indicatif::MultiProgress,
    head: indicatif::ProgressBar,
    rebuilds: std::collections::BTreeMap<String, indicatif::ProgressBar>,
    name: String,
}

impl Bars {
    fn new(name: &str) -> Bars {
        let all =
            indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr());
        let head = all.add(indicatif::ProgressBar::new_spinner());
        Bars {
            all,
            head,
            rebuilds: Default::default(),
            name: name.to_string(),
        }
    }

    fn show(&mut self, line: &str, replicas: &[ReplicaSummary]) {
        self.head.set_message(format!("{}: {line}", self.name));
        self.head.tick();
        let style = indicatif::ProgressStyle::with_template(
            "  {msg:24} [{bar:40}] {percent:>3}% {bytes}/{total_bytes}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        for r in replicas {
            let Some(p) = r.rebuild_progress.as_ref().filter(|p| p.total > 0) else {
                continue;
            };
            let bar = self.rebuilds.entry(r.name.clone()).or_insert_with(|| {
                let b = self.all.add(indicatif::ProgressBar::new(p.total));
                b.set_style(style.clone());
                b.set_message(format!("{} on {}", r.name, r.node_id));
                b
            });
            bar.set_length(p.total);
            bar.set_position(p.done);
        }
        // A replica that turned rw is done.
        for r in replicas.iter().filter(|r| r.mode == Some(ReplicaMode::Rw)) {
            if let Some(b) = self.rebuilds.get(&r.name)
                && !b.is_finished()
            {
                if let Some(len) = b.length() {
                    b.set_position(len);
                }
                b.finish();
            }
        }
    }

    fn finish(self) {
        for b in self.rebuilds.values() {
            b.finish();
        }
        self.head.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast::model::RebuildProgress;

    #[test]
    fn rebuild_progress_shows_percent_and_sizes_only_while_rebuilding() {
        let p = |done, total| RebuildProgress { done, total };
        assert_eq!(
            render::rebuild_cell(Some(&p(1 << 30, 4u64 << 30))),
            "25% (1Gi of 4Gi)"
        );
        assert_eq!(render::rebuild_cell(None), "");
        assert_eq!(render::rebuild_cell(Some(&p(0, 0))), "");
    }

    #[test]
    fn replica_progress_names_what_is_not_rw_yet() {
        let v = json!({"name": "v", "spec": {"size": 1024, "numberOfReplicas": 3}, "status": {
            "state": "detached", "robustness": "degraded", "replicas": [
            {"name": "v-r1", "nodeId": "n1", "diskId": "d", "mode": "rw", "running": true, "rebuildProgress": null},
            {"name": "v-r2", "nodeId": "n2", "diskId": "d", "mode": "rw", "running": true, "rebuildProgress": null},
            {"name": "v-r3", "nodeId": "n3", "diskId": "d", "mode": "wo", "running": true, "rebuildProgress": {"done": 1, "total": 4}},
        ]}});
        let d = VolumeDetail::from_json(&v).unwrap();
        assert_eq!(
            replica_progress(&d),
            ("2/3 ready; v-r3 on n3 25% (1 of 4)".to_string(), false)
        );
        let done = json!({"name": "v", "spec": {"size": 1024, "numberOfReplicas": 1}, "status": {
            "state": "detached", "robustness": "healthy", "replicas": [
            {"name": "v-r1", "nodeId": "n1", "diskId": "d", "mode": "rw", "running": true, "rebuildProgress": null}]}});
        assert!(replica_progress(&VolumeDetail::from_json(&done).unwrap()).1);
    }
}
