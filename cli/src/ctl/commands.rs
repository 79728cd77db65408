//! `ballastctl`'s commands: the command line (clap), each command's call
//! to the REST API, and how its answer is printed.

use ballast::quantity::{format_size, parse_size};
use clap::{Parser, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{Map, Value, json};

use super::client::{Client, CtlError};
use super::table;

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
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Volumes.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Replicas.
    #[command(subcommand)]
    Replica(ReplicaCmd),
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
        #[arg(long)]
        replicas: Option<u32>,
        /// disabled, best-effort or strict-local.
        #[arg(long)]
        data_locality: Option<String>,
        /// ignored, disabled, least-effort or best-effort.
        #[arg(long)]
        auto_balance: Option<String>,
    },
    Update {
        name: String,
        #[arg(long)]
        replicas: Option<u32>,
        #[arg(long)]
        data_locality: Option<String>,
        #[arg(long)]
        auto_balance: Option<String>,
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
    /// Grow a detached volume (every replica grows; volumes never shrink).
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

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn size(v: &Value) -> String {
    v.as_u64().map(format_size).unwrap_or_else(|| "-".into())
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

fn volume_rows(list: &[Value]) -> Vec<Vec<String>> {
    list.iter()
        .map(|v| {
            vec![
                s(&v["name"]),
                size(&v["spec"]["size"]),
                s(&v["spec"]["numberOfReplicas"]),
                s(&v["status"]["state"]),
                s(&v["status"]["robustness"]),
                s(&v["status"]["attachedNode"]),
                s(&v["spec"]["csiName"]),
            ]
        })
        .collect()
}

/// CSI NAME: the CO's name of a volume created through CSI (NAME is its id).
const VOLUME_HEADER: [&str; 7] = [
    "NAME",
    "SIZE",
    "REPLICAS",
    "STATE",
    "ROBUSTNESS",
    "NODE",
    "CSI NAME",
];

fn node_rows(list: &[Value]) -> Vec<Vec<String>> {
    list.iter()
        .map(|n| {
            let disks: Vec<String> = n["status"]["disks"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(id, d)| {
                            format!(
                                "{id}: {} free of {}",
                                size(&d["storageAvailable"]),
                                size(&d["storageMaximum"])
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            vec![
                s(&n["id"]),
                if n["status"]["ready"] == true {
                    "Ready"
                } else {
                    "NotReady"
                }
                .into(),
                s(&n["spec"]["zone"]),
                s(&n["spec"]["allowScheduling"]),
                s(&n["status"]["cordoned"]),
                if disks.is_empty() {
                    "-".into()
                } else {
                    disks.join(", ")
                },
            ]
        })
        .collect()
}

const NODE_HEADER: [&str; 6] = ["ID", "STATUS", "ZONE", "SCHEDULABLE", "CORDONED", "DISKS"];

fn print_node_detail(n: &Value) {
    table::print(&NODE_HEADER, node_rows(std::slice::from_ref(n)));
    println!();
    let empty = Map::new();
    let specs = n["spec"]["disks"].as_object().unwrap_or(&empty);
    let rows = specs
        .iter()
        .map(|(id, spec)| {
            let st = &n["status"]["disks"][id];
            vec![
                id.clone(),
                s(&spec["path"]),
                if st["ready"] == true {
                    "Ready".into()
                } else {
                    format!("NotReady {}", s(&st["message"]))
                },
                size(&st["storageMaximum"]),
                size(&st["storageAvailable"]),
                size(&spec["storageReserved"]),
                s(&spec["allowScheduling"]),
                s(&spec["evictionRequested"]),
                spec["tags"]
                    .as_array()
                    .map(|t| t.iter().map(s).collect::<Vec<_>>().join(","))
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table::print(
        &[
            "DISK",
            "PATH",
            "STATUS",
            "MAXIMUM",
            "AVAILABLE",
            "RESERVED",
            "SCHEDULABLE",
            "EVICTING",
            "TAGS",
        ],
        rows,
    );
}

fn event_rows(list: &[Value]) -> Vec<Vec<String>> {
    list.iter()
        .map(|e| {
            vec![
                s(&e["time"]),
                s(&e["object"]),
                s(&e["reason"]),
                s(&e["message"]),
            ]
        })
        .collect()
}

const EVENT_HEADER: [&str; 4] = ["TIME", "OBJECT", "REASON", "MESSAGE"];

/// Adds the optional volume fields given on the command line to `body`.
fn volume_options(
    body: &mut Value,
    replicas: Option<u32>,
    data_locality: Option<String>,
    auto_balance: Option<String>,
) {
    if let Some(r) = replicas {
        body["numberOfReplicas"] = json!(r);
    }
    if let Some(d) = data_locality {
        body["dataLocality"] = json!(d);
    }
    if let Some(a) = auto_balance {
        body["replicaAutoBalance"] = json!(a);
    }
}

fn on_off_patch(field: &str, state: OnOff) -> Value {
    json!({ field: state.yes() })
}

/// Runs one command; the caller prints the error and exits non-zero.
pub async fn run(cli: Cli) -> Result<(), CtlError> {
    let c = Client::new(&cli.api);
    let json_out = cli.output == Output::Json;
    let show = |v: &Value, header: &[&str], rows: fn(&[Value]) -> Vec<Vec<String>>, many: bool| {
        if json_out {
            print_json(v);
        } else if many {
            table::print(header, rows(&items(v)));
        } else {
            table::print(header, rows(std::slice::from_ref(v)));
        }
    };
    match cli.command {
        Command::Volume(cmd) => match cmd {
            VolumeCmd::List => show(
                &c.get("/v1/volumes").await?,
                &VOLUME_HEADER,
                volume_rows,
                true,
            ),
            VolumeCmd::Get { name } => {
                let v = c.get(&format!("/v1/volumes/{name}")).await?;
                show(&v, &VOLUME_HEADER, volume_rows, false);
                if !json_out {
                    let reps = v["status"]["replicas"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if !reps.is_empty() {
                        println!();
                        let rows = reps
                            .iter()
                            .map(|r| {
                                vec![
                                    s(&r["name"]),
                                    s(&r["nodeId"]),
                                    s(&r["diskId"]),
                                    s(&r["mode"]),
                                    rebuild_cell(&r["rebuildProgress"]),
                                ]
                            })
                            .collect();
                        table::print(&["REPLICA", "NODE", "DISK", "MODE", "REBUILD"], rows);
                    }
                }
            }
            VolumeCmd::Create {
                name,
                size: sz,
                replicas,
                data_locality,
                auto_balance,
            } => {
                let bytes = parse_size(&sz).map_err(|e| CtlError::Usage(format!("--size: {e}")))?;
                let mut body = json!({ "name": name, "size": bytes });
                volume_options(&mut body, replicas, data_locality, auto_balance);
                let v = c.call(Method::POST, "/v1/volumes", Some(body)).await?;
                show(&v, &VOLUME_HEADER, volume_rows, false);
            }
            VolumeCmd::Update {
                name,
                replicas,
                data_locality,
                auto_balance,
                wait,
            } => {
                let mut body = json!({});
                volume_options(&mut body, replicas, data_locality, auto_balance);
                if body.as_object().is_some_and(Map::is_empty) {
                    return Err(CtlError::Usage(
                        "nothing to update: give --replicas, --data-locality or --auto-balance"
                            .into(),
                    ));
                }
                let v = c
                    .call(Method::PATCH, &format!("/v1/volumes/{name}"), Some(body))
                    .await?;
                show(&v, &VOLUME_HEADER, volume_rows, false);
                if wait {
                    wait_replicas(&c, &name).await?;
                }
            }
            VolumeCmd::Delete { name } => {
                c.call(Method::DELETE, &format!("/v1/volumes/{name}"), None)
                    .await?;
                println!("volume {name} deleted");
            }
            VolumeCmd::Attach { name, node } => {
                let v = c
                    .call(
                        Method::POST,
                        &format!("/v1/volumes/{name}/attach"),
                        Some(json!({"nodeId": node})),
                    )
                    .await?;
                if json_out {
                    print_json(&v);
                } else {
                    println!("{}", s(&v["status"]["frontendEndpoint"]));
                }
            }
            VolumeCmd::Detach { name } => {
                let v = c
                    .call(Method::POST, &format!("/v1/volumes/{name}/detach"), None)
                    .await?;
                show(&v, &VOLUME_HEADER, volume_rows, false);
            }
            VolumeCmd::Expand { name, size } => {
                let bytes =
                    parse_size(&size).map_err(|e| CtlError::Usage(format!("--size: {e}")))?;
                let v = c
                    .call(
                        Method::POST,
                        &format!("/v1/volumes/{name}/expand"),
                        Some(json!({"size": bytes})),
                    )
                    .await?;
                show(&v, &VOLUME_HEADER, volume_rows, false);
            }
            VolumeCmd::Salvage {
                name,
                replica,
                force,
            } => {
                let v = c
                    .call(
                        Method::POST,
                        &format!("/v1/volumes/{name}/salvage"),
                        Some(json!({"replica": replica, "force": force})),
                    )
                    .await?;
                if !json_out {
                    eprintln!(
                        "{name} salvaged from {replica}: writes only other replicas held are lost"
                    );
                }
                show(&v, &VOLUME_HEADER, volume_rows, false);
            }
        },
        Command::Replica(cmd) => match cmd {
            ReplicaCmd::List { volume, node } => {
                let mut q = Vec::new();
                if let Some(v) = volume {
                    q.push(format!("volume={v}"));
                }
                if let Some(n) = node {
                    q.push(format!("node={n}"));
                }
                let path = if q.is_empty() {
                    "/v1/replicas".to_string()
                } else {
                    format!("/v1/replicas?{}", q.join("&"))
                };
                let v = c.get(&path).await?;
                let rows = |list: &[Value]| -> Vec<Vec<String>> {
                    list.iter()
                        .map(|r| {
                            vec![
                                s(&r["name"]),
                                s(&r["spec"]["volume"]),
                                s(&r["spec"]["nodeId"]),
                                s(&r["spec"]["diskId"]),
                                s(&r["status"]["mode"]),
                            ]
                        })
                        .collect()
                };
                show(&v, &["NAME", "VOLUME", "NODE", "DISK", "MODE"], rows, true);
            }
            ReplicaCmd::Delete { name } => {
                c.call(Method::DELETE, &format!("/v1/replicas/{name}"), None)
                    .await?;
                println!("replica {name} deleted");
            }
            ReplicaCmd::Scrub { name } => {
                let v = c
                    .call(Method::POST, &format!("/v1/replicas/{name}/scrub"), None)
                    .await?;
                if json_out {
                    print_json(&v);
                } else if v["sound"] == true {
                    println!("replica {name}: every block checked, sound");
                } else {
                    println!("replica {name}: corrupt; it is failed and will be rebuilt");
                }
            }
        },
        Command::Node(cmd) => {
            let (id, body) = match cmd {
                NodeCmd::List => {
                    show(&c.get("/v1/nodes").await?, &NODE_HEADER, node_rows, true);
                    return Ok(());
                }
                NodeCmd::Get { id } => {
                    let v = c.get(&format!("/v1/nodes/{id}")).await?;
                    if json_out {
                        print_json(&v);
                    } else {
                        print_node_detail(&v);
                    }
                    return Ok(());
                }
                NodeCmd::Cordon { id } => (id, json!({"cordoned": true})),
                NodeCmd::Uncordon { id } => (id, json!({"cordoned": false})),
                NodeCmd::Schedule { id, state } => (id, on_off_patch("allowScheduling", state)),
                NodeCmd::Evict { id, state } => (id, on_off_patch("evictionRequested", state)),
                NodeCmd::Zone { id, zone } => (id, json!({"zone": zone})),
                NodeCmd::Disk {
                    id,
                    disk,
                    schedule,
                    evict,
                    reserved,
                    tags,
                } => {
                    let mut body = json!({});
                    if let Some(v) = schedule {
                        body["allowScheduling"] = json!(v.yes());
                    }
                    if let Some(v) = evict {
                        body["evictionRequested"] = json!(v.yes());
                    }
                    if let Some(r) = reserved {
                        let b = parse_size(&r)
                            .map_err(|e| CtlError::Usage(format!("--reserved: {e}")))?;
                        body["storageReserved"] = json!(b);
                    }
                    if let Some(t) = tags {
                        let list: Vec<&str> = t.split(',').filter(|x| !x.is_empty()).collect();
                        body["tags"] = json!(list);
                    }
                    if body.as_object().is_some_and(Map::is_empty) {
                        return Err(CtlError::Usage(
                            "nothing to change: give --schedule, --evict, --reserved or --tags"
                                .into(),
                        ));
                    }
                    let v = c
                        .call(
                            Method::PATCH,
                            &format!("/v1/nodes/{id}/disks/{disk}"),
                            Some(body),
                        )
                        .await?;
                    if json_out {
                        print_json(&v);
                    } else {
                        print_node_detail(&v);
                    }
                    return Ok(());
                }
            };
            let v = c
                .call(Method::PATCH, &format!("/v1/nodes/{id}"), Some(body))
                .await?;
            show(&v, &NODE_HEADER, node_rows, false);
        }
        Command::Setting(cmd) => {
            let rows = |list: &[Value]| -> Vec<Vec<String>> {
                list.iter()
                    .map(|x| vec![s(&x["name"]), s(&x["value"]), s(&x["default"])])
                    .collect()
            };
            let header = ["NAME", "VALUE", "DEFAULT"];
            match cmd {
                SettingCmd::List => show(&c.get("/v1/settings").await?, &header, rows, true),
                SettingCmd::Get { name } => {
                    let v = c.get(&format!("/v1/settings/{name}")).await?;
                    show(&v, &header, rows, false);
                    if !json_out {
                        println!(
                            "\n{}\nAccepted: {}",
                            s(&v["description"]),
                            s(&v["accepted"])
                        );
                    }
                }
                SettingCmd::Set { name, value } => {
                    let v = c
                        .call(
                            Method::PUT,
                            &format!("/v1/settings/{name}"),
                            Some(json!({"value": value})),
                        )
                        .await?;
                    show(&v, &header, rows, false);
                }
            }
        }
        Command::Plan { volume } => {
            let path = match &volume {
                Some(v) => format!("/v1/plan?volume={v}"),
                None => "/v1/plan".into(),
            };
            let v = c.get(&path).await?;
            if json_out {
                print_json(&v);
                return Ok(());
            }
            let describe = |a: &Value| -> String {
                match a["type"].as_str().unwrap_or_default() {
                    "createReplica" => {
                        let how = if !a["reuse"].is_null() {
                            format!(" (reuse {})", s(&a["reuse"]))
                        } else if !a["copyFrom"].is_null() {
                            format!(" (local copy from {})", s(&a["copyFrom"]))
                        } else {
                            String::new()
                        };
                        format!(
                            "create replica of {} on {}/{}{how}",
                            s(&a["volume"]),
                            s(&a["node"]),
                            s(&a["disk"])
                        )
                    }
                    "deleteReplica" => format!("delete replica {}", s(&a["replica"])),
                    "setReplicaEviction" => format!(
                        "set eviction of {} to {}",
                        s(&a["replica"]),
                        s(&a["requested"])
                    ),
                    "setNodeStatus" => format!(
                        "node {}: autoEvicting={} drainBlocked={}",
                        s(&a["node"]),
                        s(&a["autoEvicting"]),
                        s(&a["drainBlocked"])
                    ),
                    "recordEvent" => format!("event {} on {}", s(&a["reason"]), s(&a["object"])),
                    other => other.to_string(),
                }
            };
            let actions = v["actions"].as_array().cloned().unwrap_or_default();
            if actions.is_empty() {
                println!("Nothing to do.");
            } else {
                let rows = actions
                    .iter()
                    .map(|a| vec![s(&a["rule"]), describe(a), s(&a["reason"])])
                    .collect();
                table::print(&["RULE", "ACTION", "WHY"], rows);
            }
            for w in v["waits"].as_array().cloned().unwrap_or_default() {
                println!(
                    "WAIT    volume {} until {}: {}",
                    s(&w["volume"]),
                    s(&w["until"]),
                    s(&w["what"])
                );
            }
            for b in v["blocked"].as_array().cloned().unwrap_or_default() {
                println!("BLOCKED {}: {}", s(&b["object"]), s(&b["reason"]));
            }
        }
        Command::Events { object, watch } => {
            let path = match &object {
                Some(o) => format!("/v1/events?object={o}"),
                None => "/v1/events".into(),
            };
            let first = c.get(&path).await?;
            show(&first, &EVENT_HEADER, event_rows, true);
            if watch {
                let mut last = items(&first)
                    .last()
                    .map(|e| s(&e["name"]))
                    .unwrap_or_default();
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    for e in items(&c.get(&path).await?) {
                        let name = s(&e["name"]);
                        if name > last {
                            if json_out {
                                println!("{e}");
                            } else {
                                println!(
                                    "{}  {}  {}  {}",
                                    s(&e["time"]),
                                    s(&e["object"]),
                                    s(&e["reason"]),
                                    s(&e["message"])
                                );
                            }
                            last = name;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Where a volume's replicas stand: `2/3 rw; r-abc 42% (...)`, and whether
/// every wanted replica is rw.
fn replica_progress(v: &Value) -> (String, bool) {
    let wanted = v["spec"]["numberOfReplicas"].as_u64().unwrap_or(0) as usize;
    let reps = v["status"]["replicas"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let rw = reps.iter().filter(|r| r["mode"] == "rw").count();
    let mut line = format!("{rw}/{wanted} rw");
    for r in reps.iter().filter(|r| r["mode"] != "rw") {
        let cell = rebuild_cell(&r["rebuildProgress"]);
        line.push_str(&format!(
            "; {} on {} {}",
            s(&r["name"]),
            s(&r["nodeId"]),
            if cell.is_empty() { s(&r["mode"]) } else { cell }
        ));
    }
    (line, rw == wanted && reps.len() == wanted)
}

/// Polls the volume until every wanted replica is rw; on a terminal the
/// progress line is rewritten in place, elsewhere each change is a line.
async fn wait_replicas(c: &Client, name: &str) -> Result<(), CtlError> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stderr().is_terminal();
    let mut last = String::new();
    loop {
        let v = c.get(&format!("/v1/volumes/{name}")).await?;
        let (line, done) = replica_progress(&v);
        if line != last {
            if tty {
                eprint!("\r\x1b[K{name}: {line}");
            } else {
                eprintln!("{name}: {line}");
            }
            let _ = std::io::stderr().flush();
            last = line;
        }
        if done {
            if tty {
                eprintln!();
            }
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// `42% (1.2Gi of 2.9Gi)` while a replica is being rebuilt; empty otherwise.
fn rebuild_cell(p: &Value) -> String {
    match (p["done"].as_u64(), p["total"].as_u64()) {
        (Some(done), Some(total)) if total > 0 => format!(
            "{}% ({} of {})",
            done.saturating_mul(100) / total,
            ballast::quantity::format_size(done),
            ballast::quantity::format_size(total)
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuild_progress_shows_percent_and_sizes_only_while_rebuilding() {
        assert_eq!(
            rebuild_cell(&json!({"done": 1 << 30, "total": 4u64 << 30})),
            "25% (1Gi of 4Gi)"
        );
        assert_eq!(rebuild_cell(&Value::Null), "");
        assert_eq!(rebuild_cell(&json!({"done": 0, "total": 0})), "");
    }

    #[test]
    fn replica_progress_names_what_is_not_rw_yet() {
        let v = json!({"spec": {"numberOfReplicas": 3}, "status": {"replicas": [
            {"name": "v-r1", "nodeId": "n1", "mode": "rw"},
            {"name": "v-r2", "nodeId": "n2", "mode": "rw"},
            {"name": "v-r3", "nodeId": "n3", "mode": "wo", "rebuildProgress": {"done": 1, "total": 4}},
        ]}});
        assert_eq!(
            replica_progress(&v),
            ("2/3 rw; v-r3 on n3 25% (1 of 4)".to_string(), false)
        );
        let done = json!({"spec": {"numberOfReplicas": 1}, "status": {"replicas": [
            {"name": "v-r1", "nodeId": "n1", "mode": "rw"}]}});
        assert!(replica_progress(&done).1);
    }
}
