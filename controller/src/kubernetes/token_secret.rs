//! The cluster token kept in a Secret (`--cluster-token-secret`): the first
//! controller to start makes it (random), every controller reads it, and
//! the node plugins and engine hosts mount it as a file. It owns that
//! Secret and nothing else.

use std::collections::BTreeMap;

use ballast::cluster_token::ClusterToken;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

use super::KubeError;

/// The key of the token in the Secret's data (the file name in a pod).
pub const KEY: &str = "token";

/// The token of Secret `name` in `namespace`, made first when missing.
pub async fn read_or_make(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ClusterToken, KubeError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    for _ in 0..3 {
        if let Some(s) = api.get_opt(name).await? {
            let bytes = s
                .data
                .as_ref()
                .and_then(|d| d.get(KEY))
                .map(|b| b.0.clone())
                .unwrap_or_default();
            let text = String::from_utf8(bytes).unwrap_or_default();
            let origin = format!("Secret {namespace}/{name}, key {KEY}");
            return ClusterToken::parse(&text, &origin).map_err(KubeError::TokenSecret);
        }
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                KEY.to_string(),
                ByteString(
                    ClusterToken::random_text()
                        .map_err(|e| {
                            KubeError::TokenSecret(format!("no randomness for the token: {e}"))
                        })?
                        .into_bytes(),
                ),
            )])),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            // Another controller made it first: read that one.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(KubeError::TokenSecret(format!(
        "Secret {namespace}/{name}: neither read nor made"
    )))
}
