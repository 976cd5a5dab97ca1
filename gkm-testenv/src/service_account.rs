//! Credentials for a ServiceAccount's identity, so that tests run gkm's
//! components with the RBAC that `deploy/rbac/` ships rather than as admin.

use std::path::PathBuf;

use crate::ControlPlane;

/// The user name Kubernetes gives the ServiceAccount `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups a ServiceAccount `namespace/…` is in.
pub fn service_account_groups(namespace: &str) -> [String; 2] {
    [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
    ]
}

impl ControlPlane {
    /// Writes a kubeconfig that authenticates as the ServiceAccount
    /// `namespace/name` (user `system:serviceaccount:NS:NAME`, groups
    /// `system:serviceaccounts` and `system:serviceaccounts:NS`), with a
    /// client certificate signed by the control plane's CA, and returns its
    /// path. The apiserver authorizes it exactly as it would the account's
    /// token: every RoleBinding naming the ServiceAccount applies.
    pub fn kubeconfig_for_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<PathBuf> {
        let groups = service_account_groups(namespace);
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        self.kubeconfig_for(&service_account_user(namespace, name), &groups)
    }

    /// A client authenticating as the ServiceAccount `namespace/name`; see
    /// [`ControlPlane::kubeconfig_for_service_account`].
    pub async fn client_for_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<kube::Client> {
        let groups = service_account_groups(namespace);
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        self.client_for(&service_account_user(namespace, name), &groups)
            .await
    }
}
