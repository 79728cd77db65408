//! The REST API against a real redb store, through the router in-process.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use ballast::model::{DiskSpec, Node, NodeSpec, NodeStatus, Setting};
use ballast::store::RedbStore;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::context::Context;

struct Api {
    _dir: tempfile::TempDir,
    ctx: Arc<Context>,
}

impl Api {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path().join("s.redb")).unwrap();
        let ctx = Context::new(Arc::new(store), Duration::from_secs(30));
        Api { _dir: dir, ctx }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(match body {
                Some(b) => Body::from(b.to_string()),
                None => Body::empty(),
            })
            .unwrap();
        let resp = super::router(self.ctx.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, v)
    }

    /// A volume record, built as the API builds it, stored without placing it.
    async fn seed_volume(&self, body: Value) -> ballast::model::Volume {
        let req: crate::volumes::CreateVolume = serde_json::from_value(body).unwrap();
        let v = crate::volumes::build(req, &self.ctx.settings().await.unwrap()).unwrap();
        self.ctx.store.create(&v).await.unwrap()
    }

    async fn seed_node(&self, id: &str) {
        let node = Node {
            id: id.into(),
            resource_version: 0,
            spec: NodeSpec {
                zone: "zone-1".into(),
                tags: vec![],
                allow_scheduling: true,
                eviction_requested: false,
                disks: [("disk-1".to_string(), DiskSpec::new("/d1", vec![]))].into(),
            },
            status: NodeStatus::default(),
        };
        self.ctx.store.create(&node).await.unwrap();
    }
}

#[tokio::test]
async fn unknown_setting_is_400_naming_the_known_settings_and_changes_nothing() {
    let api = Api::new();
    let (s, v) = api
        .call(
            "PUT",
            "/v1/settings/replica-count",
            Some(json!({"value": "3"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["code"], "invalid_argument");
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("default-replica-count"), "{msg}");
    assert!(api.ctx.store.list::<Setting>().await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_setting_value_is_400_naming_the_accepted_values_and_changes_nothing() {
    let api = Api::new();
    let (s, v) = api
        .call(
            "PUT",
            "/v1/settings/replica-auto-balance",
            Some(json!({"value": "always"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let msg = v["error"].as_str().unwrap();
    assert!(msg.starts_with("value:"), "{msg}");
    assert!(msg.contains("disabled, least-effort, best-effort"), "{msg}");
    let (_, v) = api
        .call("GET", "/v1/settings/replica-auto-balance", None)
        .await;
    assert_eq!(v["value"], "disabled");
}

#[tokio::test]
async fn settings_put_accepts_strings_booleans_and_numbers() {
    let api = Api::new();
    let (s, _) = api
        .call(
            "PUT",
            "/v1/settings/replica-soft-anti-affinity",
            Some(json!({"value": true})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api
        .call(
            "PUT",
            "/v1/settings/default-replica-count",
            Some(json!({"value": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = api.call("GET", "/v1/settings", None).await;
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), ballast::settings::DEFINITIONS.len());
    let get = |n: &str| items.iter().find(|i| i["name"] == n).unwrap()["value"].clone();
    assert_eq!(get("replica-soft-anti-affinity"), "true");
    assert_eq!(get("default-replica-count"), "2");
    assert_eq!(api.ctx.settings().await.unwrap().default_replica_count(), 2);
    // A later volume follows the new default.
    let v = api.seed_volume(json!({"name": "v1", "size": "1Gi"})).await;
    assert_eq!(v.spec.number_of_replicas, 2);
}

#[tokio::test]
async fn unknown_setting_get_is_404() {
    let api = Api::new();
    let (s, v) = api.call("GET", "/v1/settings/nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], "not_found");
}

#[tokio::test]
async fn patch_of_an_unknown_node_is_404() {
    let api = Api::new();
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/nodes/node-9",
            Some(json!({"allowScheduling": false})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("node-9"));
}

#[tokio::test]
async fn node_patch_changes_spec_and_cordon_and_records_an_event() {
    let api = Api::new();
    api.seed_node("node-1").await;
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/nodes/node-1",
            Some(json!({"allowScheduling": false, "zone": "zone-2", "cordoned": true})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["allowScheduling"], false);
    assert_eq!(v["spec"]["zone"], "zone-2");
    assert_eq!(v["status"]["cordoned"], true);
    let (_, ev) = api.call("GET", "/v1/events?object=node/node-1", None).await;
    let reasons: Vec<&str> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["NodeUpdated"]);
}

#[tokio::test]
async fn node_patch_with_an_unknown_field_is_400_naming_it_and_changes_nothing() {
    let api = Api::new();
    api.seed_node("node-1").await;
    let before: Node = api.ctx.store.fetch("node-1").await.unwrap();
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/nodes/node-1",
            Some(json!({"allowSchedule": false})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["error"].as_str().unwrap().starts_with("allowSchedule:"),
        "{v}"
    );
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/nodes/node-1",
            Some(json!({"allowScheduling": "no"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["error"].as_str().unwrap().starts_with("allowScheduling:"),
        "{v}"
    );
    assert_eq!(api.ctx.store.fetch::<Node>("node-1").await.unwrap(), before);
}

#[tokio::test]
async fn disk_patch_takes_quantities_and_404s_unknown_disks() {
    let api = Api::new();
    api.seed_node("node-1").await;
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/nodes/node-1/disks/disk-1",
            Some(json!({"storageReserved": "1Gi", "tags": ["ssd"], "evictionRequested": true})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["disks"]["disk-1"]["storageReserved"], 1u64 << 30);
    assert_eq!(v["spec"]["disks"]["disk-1"]["tags"], json!(["ssd"]));
    let (s, _) = api
        .call(
            "PATCH",
            "/v1/nodes/node-1/disks/disk-9",
            Some(json!({"allowScheduling": false})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/nodes/node-1/disks/disk-1",
            Some(json!({"storageReserved": "1Qi"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["error"].as_str().unwrap().starts_with("storageReserved:"),
        "{v}"
    );
}

#[tokio::test]
async fn volume_records_get_patch_delete() {
    let api = Api::new();
    api.seed_volume(
        json!({"name": "v1", "size": "1Gi", "numberOfReplicas": 3, "dataLocality": "best-effort"}),
    )
    .await;
    let (s, _) = api
        .call(
            "POST",
            "/v1/volumes",
            Some(json!({"name": "v1", "size": "1Gi"})),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "duplicate name");

    let (s, v) = api.call("GET", "/v1/volumes/v1", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["spec"]["size"], 1u64 << 30);
    assert_eq!(v["status"]["robustness"], "unknown");
    assert_eq!(v["status"]["replicas"], json!([]));

    let (s, v) = api
        .call(
            "PATCH",
            "/v1/volumes/v1",
            Some(json!({"numberOfReplicas": 2, "replicaAutoBalance": "best-effort"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["numberOfReplicas"], 2);
    assert_eq!(v["spec"]["replicaAutoBalance"], "best-effort");

    // A rate past the highest: 400, naming the field; a good one is kept.
    let (s, e) = api
        .call(
            "PATCH",
            "/v1/volumes/v1",
            Some(json!({"replicaRebuildRate": 20000})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .starts_with("replicaRebuildRate:"),
        "{e}"
    );
    let (s, v) = api
        .call(
            "PATCH",
            "/v1/volumes/v1",
            Some(json!({"replicaRebuildRate": 25})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["replicaRebuildRate"], 25);

    let (s, v) = api
        .call(
            "PATCH",
            "/v1/volumes/v1",
            Some(json!({"resourceVersion": 1, "numberOfReplicas": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "stale version: {v}");

    let (_, list) = api.call("GET", "/v1/volumes", None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (s, _) = api.call("DELETE", "/v1/volumes/v1", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = api.call("GET", "/v1/volumes/v1", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api.call("DELETE", "/v1/volumes/v1", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn creating_a_volume_that_cannot_be_placed_is_422_with_the_planners_reasons() {
    let api = Api::new();
    seed_ready_node(&api, "node-1", "z1").await;
    let (s, v) = api
        .call(
            "POST",
            "/v1/volumes",
            Some(json!({"name": "big", "size": "1Gi", "numberOfReplicas": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["code"], "no_room");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("cannot place 2 replicas")
            && msg.contains("replica-soft-anti-affinity is false"),
        "{msg}"
    );
    let (_, list) = api.call("GET", "/v1/volumes", None).await;
    assert_eq!(list["items"], json!([]), "nothing is left behind");
}

#[tokio::test]
async fn attach_to_an_unknown_node_is_400_and_unknown_volumes_404() {
    let api = Api::new();
    api.seed_volume(json!({"name": "v1", "size": "1Gi"})).await;
    let (s, v) = api
        .call(
            "POST",
            "/v1/volumes/v1/attach",
            Some(json!({"nodeId": "node-9"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("nodeId:"));
    let (s, _) = api
        .call(
            "POST",
            "/v1/volumes/nope/attach",
            Some(json!({"nodeId": "node-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = api.call("POST", "/v1/volumes/v1/detach", None).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "detaching a detached volume is a no-op: {v}"
    );
}

#[tokio::test]
async fn bad_volume_input_names_the_field_and_creates_nothing() {
    let api = Api::new();
    for (body, field, needle) in [
        (
            json!({"name": "v1", "size": "1Gi", "dataLocality": "sometimes"}),
            "dataLocality",
            "best-effort",
        ),
        (
            json!({"name": "v1", "size": "1Gi", "numberOfReplicas": 0}),
            "numberOfReplicas",
            "1 to 20",
        ),
        (json!({"name": "v1", "size": "lots"}), "size", "number"),
        (json!({"name": "v1"}), "size", "missing"),
        (json!({"name": "V 1", "size": "1Gi"}), "name", "lower-case"),
        (
            json!({"name": "v1", "size": "1Gi", "replicas": 3}),
            "replicas",
            "unknown field",
        ),
        (
            json!({"name": "v1", "size": "1Gi", "numberOfReplicas": 2, "dataLocality": "strict-local"}),
            "dataLocality",
            "numberOfReplicas = 1",
        ),
    ] {
        let (s, v) = api.call("POST", "/v1/volumes", Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        let msg = v["error"].as_str().unwrap();
        assert!(msg.starts_with(&format!("{field}:")), "{body} -> {msg}");
        assert!(msg.contains(needle), "{body} -> {msg}");
    }
    let (s, v) = api.call("POST", "/v1/volumes", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "body: empty: expected a JSON object");
    // Not an object at all, or not JSON: the body is named, not a field
    // serde made up from an array's place.
    for body in [json!(["v1", "1Gi"]), json!("v1")] {
        let (s, v) = api.call("POST", "/v1/volumes", Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(v["error"], "body: expected a JSON object", "{body}");
    }
    let gate = super::gate::Gate::default();
    let json = [("content-type", "application/json")];
    let (s, v, _) = raw(&api, gate.clone(), "POST", "/v1/volumes", &json, "not json").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "body: expected a JSON object");
    let cut = r#"{"name": "v1", "size": "1Gi""#;
    let (s, v, _) = raw(&api, gate, "POST", "/v1/volumes", &json, cut).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.starts_with("body: not valid JSON: ") && msg.contains("line 1 column"),
        "{msg}"
    );
    let (_, list) = api.call("GET", "/v1/volumes", None).await;
    assert_eq!(list["items"], json!([]));
}

#[tokio::test]
async fn replicas_and_events_filter_and_unknown_paths_are_json_404() {
    let api = Api::new();
    let (s, v) = api
        .call("GET", "/v1/replicas?volume=v1&node=n1", None)
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!({"items": []})));
    let (s, v) = api.call("GET", "/v1/replicas?colour=red", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = api.call("GET", "/v1/nothing", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], "not_found");
}

#[tokio::test]
async fn healthz_metrics_and_openapi() {
    let api = Api::new();
    api.seed_node("node-1").await;
    let (s, v) = api.call("GET", "/healthz", None).await;
    assert_eq!((s, v["status"].clone()), (StatusCode::OK, json!("ok")));
    let (s, v) = api.call("GET", "/metrics", None).await;
    assert_eq!(s, StatusCode::OK);
    let text = v.as_str().unwrap();
    assert!(text.contains("ballast_nodes{ready=\"false\"} 1"), "{text}");
    let (s, doc) = api.call("GET", "/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    for (method, path, _) in super::ROUTES {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    // Every route in the table is served: none answers "no such path".
    for (method, path, _) in super::ROUTES {
        let concrete = path
            .replace("{name}", "x")
            .replace("{id}", "x")
            .replace("{diskId}", "x");
        let (_, v) = api
            .call(&method.to_uppercase(), &concrete, Some(json!({})))
            .await;
        assert!(
            !v["error"]
                .as_str()
                .unwrap_or_default()
                .starts_with("no such path"),
            "{method} {path} is not routed"
        );
    }
}

async fn seed_ready_node(api: &Api, id: &str, zone: &str) {
    let mut node = Node {
        id: id.into(),
        resource_version: 0,
        spec: NodeSpec {
            zone: zone.into(),
            tags: vec![],
            allow_scheduling: true,
            eviction_requested: false,
            disks: [("disk-1".to_string(), DiskSpec::new("/d1", vec![]))].into(),
        },
        status: NodeStatus::default(),
    };
    node.status.ready = true;
    node.status.disks.insert(
        "disk-1".into(),
        ballast::model::DiskStatus {
            ready: true,
            storage_maximum: 100 << 30,
            storage_available: 90 << 30,
            ..Default::default()
        },
    );
    api.ctx.store.create(&node).await.unwrap();
}

#[tokio::test]
async fn plan_is_a_dry_run_with_reasons() {
    let api = Api::new();
    for (id, zone) in [("node-1", "z1"), ("node-2", "z2"), ("node-3", "z3")] {
        seed_ready_node(&api, id, zone).await;
    }
    api.seed_volume(json!({"name": "v1", "size": "1Gi"})).await;
    api.seed_volume(json!({"name": "v2", "size": "1Gi", "numberOfReplicas": 4}))
        .await;
    let (s, v) = api.call("GET", "/v1/plan?volume=v1", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let creates: Vec<&Value> = v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["type"] == "createReplica")
        .collect();
    assert_eq!(creates.len(), 3, "{v}");
    let mut nodes: Vec<&str> = creates
        .iter()
        .map(|a| a["node"].as_str().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"], "one per zone");
    assert!(
        creates
            .iter()
            .all(|a| a["rule"] == "schedule" && a["reason"].as_str().unwrap().contains("v1"))
    );
    // v2 wants 4 replicas on 3 nodes with hard node anti-affinity: blocked, with reasons.
    let (_, v) = api.call("GET", "/v1/plan?volume=v2", None).await;
    let blocked = v["blocked"].as_array().unwrap();
    assert!(
        blocked.iter().any(|b| b["reason"]
            .as_str()
            .unwrap()
            .contains("replica-soft-anti-affinity is false")),
        "{v}"
    );
    // Nothing was done: still no replica records.
    assert!(
        api.ctx
            .store
            .list::<ballast::model::Replica>()
            .await
            .unwrap()
            .is_empty()
    );
    let (s, _) = api.call("GET", "/v1/plan?volume=nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// One request through a router behind `gate`, with these headers.
async fn raw(
    api: &Api,
    gate: super::gate::Gate,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Body::from(body.to_string())).unwrap();
    let resp = super::router_with(api.ctx.clone(), gate)
        .oneshot(req)
        .await
        .unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

#[tokio::test]
async fn a_change_that_is_not_json_is_415_and_changes_nothing() {
    let api = Api::new();
    let body = r#"{"value": "best-effort"}"#;
    let open = super::gate::Gate::default();
    for headers in [&[("content-type", "text/plain")][..], &[][..]] {
        let (s, v, _) = raw(
            &api,
            open.clone(),
            "PUT",
            "/v1/settings/replica-auto-balance",
            headers,
            body,
        )
        .await;
        assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{headers:?}: {v}");
        assert_eq!(v["code"], "unsupported_media_type");
    }
    // A text/plain POST, as any web page may send, creates nothing.
    let (s, _, _) = raw(
        &api,
        open.clone(),
        "POST",
        "/v1/volumes",
        &[("content-type", "text/plain")],
        r#"{"name": "v", "size": "1Gi"}"#,
    )
    .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        api.ctx
            .store
            .list::<ballast::model::Volume>()
            .await
            .unwrap()
            .is_empty()
    );
    assert!(api.ctx.store.list::<Setting>().await.unwrap().is_empty());
    let json = [("content-type", "application/json; charset=utf-8")];
    let (s, v, _) = raw(
        &api,
        open,
        "PUT",
        "/v1/settings/replica-auto-balance",
        &json,
        body,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[tokio::test]
async fn with_a_token_changes_need_it_reads_do_not_and_no_cors_is_answered() {
    let api = Api::new();
    let gate = super::gate::Gate {
        token: ballast::bearer::Tokens::from_text("s3cret", &super::gate::API_TOKEN),
    };
    let body = r#"{"value": "best-effort"}"#;
    let path = "/v1/settings/replica-auto-balance";
    let json = ("content-type", "application/json");
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret"),
        Some("Bearer s3cre"),
    ] {
        let mut headers = vec![json];
        headers.extend(auth.map(|a| ("authorization", a)));
        let (s, v, _) = raw(&api, gate.clone(), "PUT", path, &headers, body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{auth:?}: {v}");
        assert_eq!(v["code"], "unauthenticated");
    }
    assert!(api.ctx.store.list::<Setting>().await.unwrap().is_empty());
    let headers = [json, ("authorization", "Bearer s3cret")];
    let (s, v, _) = raw(&api, gate.clone(), "PUT", path, &headers, body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v, _) = raw(&api, gate.clone(), "GET", path, &[], "").await;
    assert_eq!(
        (s, v["value"].as_str()),
        (StatusCode::OK, Some("best-effort"))
    );
    // A preflight from another origin is given no permission.
    let (_, _, h) = raw(
        &api,
        gate,
        "OPTIONS",
        "/v1/volumes",
        &[
            ("origin", "https://elsewhere.example"),
            ("access-control-request-method", "POST"),
        ],
        "",
    )
    .await;
    assert!(h.get("access-control-allow-origin").is_none(), "{h:?}");
}
