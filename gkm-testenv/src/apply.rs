//! Applying YAML files (gkm's `deploy/` manifests) to a control plane, as
//! `kubectl apply --server-side` does.

use std::path::Path;

use k8s_openapi::serde::Deserialize;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, ValidationDirective};
use kube::discovery::Scope;

use crate::ControlPlane;

/// The non-empty YAML documents of `path`, as JSON values.
pub fn yaml_documents(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|e| anyhow::anyhow!("{} document {i}: {e}", path.display()))?;
        if !value.is_null() {
            docs.push(serde_json::to_value(value)?);
        }
    }
    Ok(docs)
}

/// `apiVersion kind namespace/name` of a manifest, for messages.
pub fn describe_object(doc: &serde_json::Value) -> String {
    let field = |v: &serde_json::Value| v.as_str().unwrap_or("?").to_string();
    format!(
        "{} {} {}/{}",
        field(&doc["apiVersion"]),
        field(&doc["kind"]),
        doc["metadata"]["namespace"].as_str().unwrap_or(""),
        field(&doc["metadata"]["name"])
    )
}

/// The field managers of `object` (`metadata.managedFields`), sorted and
/// each once: who the apiserver records as having written it.
pub fn field_managers(object: &impl kube::ResourceExt) -> Vec<String> {
    let mut managers: Vec<String> = object
        .managed_fields()
        .iter()
        .filter_map(|f| f.manager.clone())
        .collect();
    managers.sort();
    managers.dedup();
    managers
}

impl ControlPlane {
    /// Server-side applies `doc` as admin (field manager `gkm-testenv`,
    /// conflicts forced, unknown fields rejected); with `dry_run`, the
    /// apiserver validates and admits it without storing it.
    pub async fn apply_object(&self, doc: &serde_json::Value, dry_run: bool) -> anyhow::Result<()> {
        let client = self.client().await?;
        let what = describe_object(doc);
        let object: DynamicObject =
            serde_json::from_value(doc.clone()).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let types = object
            .types
            .clone()
            .ok_or_else(|| anyhow::anyhow!("{what}: no apiVersion or kind"))?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (resource, caps) = kube::discovery::pinned_kind(&client, &gvk)
            .await
            .map_err(|e| anyhow::anyhow!("{what}: kind not served: {e}"))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = object
                    .metadata
                    .namespace
                    .as_deref()
                    .ok_or_else(|| anyhow::anyhow!("{what}: namespaced but no namespace"))?;
                Api::namespaced_with(client, ns, &resource)
            }
            Scope::Cluster => Api::all_with(client, &resource),
        };
        let name = object
            .metadata
            .name
            .clone()
            .ok_or_else(|| anyhow::anyhow!("{what}: no name"))?;
        let mut params = PatchParams::apply("gkm-testenv").force();
        params.dry_run = dry_run;
        params.field_validation = Some(ValidationDirective::Strict);
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .map_err(|e| anyhow::anyhow!("applying {what}: {e}"))?;
        Ok(())
    }

    /// Server-side applies every document of the YAML file `path`, in order;
    /// see [`ControlPlane::apply_object`].
    pub async fn apply_file(&self, path: &Path) -> anyhow::Result<()> {
        for doc in yaml_documents(path)? {
            self.apply_object(&doc, false).await?;
        }
        Ok(())
    }
}
