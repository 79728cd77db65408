//! The cluster's secrets kept in Kubernetes Secrets: the cluster token
//! (`--cluster-token-secret`) and the cluster CA (`--cluster-ca-secret`).
//! The first controller to start makes each (random token, new CA), every
//! controller reads them, and the node plugins and engine hosts mount the
//! token's Secret as files: it also carries the CA's certificate
//! (`ca.crt`), never its key. It owns those Secrets and nothing else.

use std::collections::BTreeMap;

use ballast::cluster_token::ClusterToken;
use ballast::tls::{CA_CERT_FILE, CA_KEY_FILE, Ca};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::KubeError;

/// The key of the token in the Secret's data (the file name in a pod).
pub const KEY: &str = "token";

type Data = BTreeMap<String, Vec<u8>>;

/// A Secret's data, as bytes.
fn data_of(s: Secret) -> Data {
    let data = s.data.unwrap_or_default();
    data.into_iter().map(|(k, v)| (k, v.0)).collect()
}

/// The data of Secret `name`, made with `make()` first when missing (when
/// another controller makes it at the same time, the one made first wins).
async fn read_or_make(
    api: &Api<Secret>,
    name: &str,
    make: impl Fn() -> Result<Data, KubeError>,
) -> Result<Data, KubeError> {
    for _ in 0..3 {
        if let Some(s) = api.get_opt(name).await? {
            return Ok(data_of(s));
        }
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            data: Some(
                make()?
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v)))
                    .collect(),
            ),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            // Another controller made it first: read that one.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(KubeError::ClusterSecret(format!(
        "Secret {name}: neither read nor made"
    )))
}

fn text(data: &Data, key: &str) -> String {
    String::from_utf8(data.get(key).cloned().unwrap_or_default()).unwrap_or_default()
}

/// The token of Secret `name` in `namespace`, made first when missing.
pub async fn read_or_make_token(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ClusterToken, KubeError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let data = read_or_make(&api, name, || {
        let token = ClusterToken::random_text()
            .map_err(|e| KubeError::ClusterSecret(format!("no randomness for the token: {e}")))?;
        Ok(BTreeMap::from([(KEY.to_string(), token.into_bytes())]))
    })
    .await?;
    let origin = format!("Secret {namespace}/{name}, key {KEY}");
    ClusterToken::parse(&text(&data, KEY), &origin).map_err(KubeError::ClusterSecret)
}

/// How often the token's Secret is read again (`keep_reading_token`).
const TOKEN_READ_AGAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// Reads the token's Secret `name` in `namespace` again every
/// `TOKEN_READ_AGAIN_EVERY` and gives `token` (and so every channel and
/// gate made from it) what it holds now: while the token changes it holds
/// two, one per line (docs/security.md; `bearer::Tokens::keep_replacing`).
pub fn keep_reading_token(client: kube::Client, namespace: &str, name: &str, token: &ClusterToken) {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let name = name.to_string();
    let origin = format!("Secret {namespace}/{name}, key {KEY}");
    let read = move || {
        let (api, name, origin) = (api.clone(), name.clone(), origin.clone());
        async move {
            match api.get_opt(&name).await {
                Ok(Some(s)) => Ok((text(&data_of(s), KEY), origin)),
                Ok(None) => Err(format!("{origin}: the Secret is gone")),
                Err(e) => Err(format!("{origin}: {e}")),
            }
        }
    };
    token.keep_replacing(
        "the cluster token's Secret".to_string(),
        TOKEN_READ_AGAIN_EVERY,
        read,
    );
}

/// The CA of Secret `name` in `namespace`, made first when missing; its
/// certificate is then put into the token's Secret `token_secret` (where
/// the nodes read it) when it is not there yet.
pub async fn read_or_make_ca(
    client: kube::Client,
    namespace: &str,
    name: &str,
    token_secret: &str,
) -> Result<Ca, KubeError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let data = read_or_make(&api, name, || {
        let ca = Ca::generate().map_err(|e| KubeError::ClusterSecret(e.to_string()))?;
        Ok(BTreeMap::from([
            (CA_CERT_FILE.to_string(), ca.cert_pem().as_bytes().to_vec()),
            (CA_KEY_FILE.to_string(), ca.key_pem().as_bytes().to_vec()),
        ]))
    })
    .await?;
    let ca = Ca::from_pem(&text(&data, CA_CERT_FILE), &text(&data, CA_KEY_FILE))
        .map_err(|e| KubeError::ClusterSecret(format!("Secret {namespace}/{name}: {e}")))?;
    let published = api.get(token_secret).await?;
    let has = published
        .data
        .as_ref()
        .and_then(|d| d.get(CA_CERT_FILE))
        .is_some_and(|v| v.0 == ca.cert_pem().as_bytes());
    if !has {
        let patch = serde_json::json!({
            "data": { CA_CERT_FILE: ByteString(ca.cert_pem().as_bytes().to_vec()) }
        });
        api.patch(token_secret, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(ca)
}
