//! Stored settings the controller cannot use. The REST API validates a
//! value before it stores it, and on Kubernetes the CRD's rules refuse
//! what they can express; a value that gets past both (a rule the schema
//! cannot state, a CRD installed without its rules, an older release's
//! value) is not silently replaced by the default: its Setting's
//! `status.refused` says why and which values are accepted, with a
//! `SettingRefused` event, until the value is fixed.
//!
//! It owns the Settings' status; it never changes a value.

use ballast::model::{Kind, Setting};

use crate::context::Context;
use crate::error::Error;

/// Records, on every stored Setting, whether its value is refused.
/// Returns the names of those newly refused.
#[tracing::instrument(skip_all)]
pub async fn check_settings(ctx: &Context) -> Result<Vec<String>, Error> {
    let mut refused = Vec::new();
    for s in ctx.store.list::<Setting>().await? {
        let why = ballast::settings::validate(&s.name, &s.value)
            .err()
            .map(|e| e.to_string());
        if why == s.status.refused {
            continue;
        }
        let mut changed = false;
        ctx.store
            .modify::<Setting, Error>(&s.name, |fresh| {
                let why = ballast::settings::validate(&fresh.name, &fresh.value)
                    .err()
                    .map(|e| e.to_string());
                changed = why != fresh.status.refused;
                fresh.status.refused = why;
                Ok(changed)
            })
            .await?;
        if !changed {
            continue;
        }
        match why {
            Some(why) => {
                ctx.event(
                    Kind::Setting,
                    &s.name,
                    "SettingRefused",
                    format!("{why}; the default is in effect until it is fixed"),
                )
                .await;
                refused.push(s.name);
            }
            None => {
                ctx.event(
                    Kind::Setting,
                    &s.name,
                    "SettingAccepted",
                    format!("value {:?} is in effect", s.value),
                )
                .await
            }
        }
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ballast::store::{MemoryStore, Store};

    use super::*;

    fn setting(name: &str, value: &str) -> Setting {
        Setting {
            name: name.into(),
            resource_version: 0,
            value: value.into(),
            status: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_stored_value_that_does_not_validate_is_refused_with_an_event_naming_the_accepted_values()
     {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let ctx = Context::new(store.clone(), std::time::Duration::from_secs(30));
        // Past every check: written straight into the store.
        store
            .create(&setting("replica-auto-balance", "sometimes"))
            .await
            .unwrap();
        store
            .create(&setting("default-replica-count", "2"))
            .await
            .unwrap();
        assert_eq!(
            check_settings(&ctx).await.unwrap(),
            ["replica-auto-balance"]
        );
        let s: Setting = store.fetch("replica-auto-balance").await.unwrap();
        let why = s.status.refused.unwrap();
        assert!(
            why.contains("accepted values") && why.contains("best-effort"),
            "{why}"
        );
        let ok: Setting = store.fetch("default-replica-count").await.unwrap();
        assert_eq!(ok.status.refused, None);
        let events: Vec<ballast::model::Event> = store.list().await.unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.object == "setting/replica-auto-balance" && e.reason == "SettingRefused"),
            "{events:?}"
        );
        // The effective value is the default meanwhile.
        assert_eq!(
            ctx.settings().await.unwrap().get("replica-auto-balance"),
            Some("disabled")
        );

        // Checked again: nothing new. Fixed: accepted, and the refusal goes.
        assert!(check_settings(&ctx).await.unwrap().is_empty());
        store
            .modify::<Setting, Error>("replica-auto-balance", |s| {
                s.value = "least-effort".into();
                Ok(true)
            })
            .await
            .unwrap();
        assert!(check_settings(&ctx).await.unwrap().is_empty());
        let s: Setting = store.fetch("replica-auto-balance").await.unwrap();
        assert_eq!(s.status.refused, None);
    }
}
