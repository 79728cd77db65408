//! The test bench's control plane comes up for real: a namespace created
//! through the API server is read back, and the controller manager acts
//! (its disruption controller reports on a PodDisruptionBudget).

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ObjectMeta, PostParams};

#[tokio::test]
async fn a_namespace_created_on_the_real_api_server_reads_back() {
    let cp = ballast_k8s_harness::ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("ballast-smoke".into()),
            labels: Some([("purpose".to_string(), "smoke".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let back = namespaces.get("ballast-smoke").await.unwrap();
    assert_eq!(back.metadata.name.as_deref(), Some("ballast-smoke"));
    assert_eq!(
        back.metadata
            .labels
            .unwrap_or_default()
            .get("purpose")
            .map(String::as_str),
        Some("smoke")
    );
    assert!(back.metadata.uid.is_some(), "the API server gave it a uid");

    // The controller manager runs: its disruption controller observes a
    // new PodDisruptionBudget and fills in its status.
    let pdbs: Api<PodDisruptionBudget> =
        Api::namespaced(cp.client().await.unwrap(), "ballast-smoke");
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "smoke"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "none"}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = pdbs.get("smoke").await.unwrap().status;
        if status.as_ref().and_then(|s| s.observed_generation) == Some(1) {
            let s = status.unwrap();
            assert_eq!((s.expected_pods, s.disruptions_allowed), (Some(0), Some(0)));
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the disruption controller did not observe the budget; kube-controller-manager's log:\n{}",
            cp.log("kube-controller-manager")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
