//! What to try next, added under an error when its cause is a common one:
//! a plain-HTTP registry spoken to over HTTPS, or a registry that wants
//! credentials gkm did not have.

use gkm_oci::Credentials;
use gkm_oci::auth::docker_config_path;
use oci_client::secrets::RegistryAuth;

/// A hint for `err`, when gkm recognises its cause. `with_username` is
/// whether `--username` was given.
pub fn hint(err: &anyhow::Error, with_username: bool) -> Option<String> {
    let (reference, text) = registry_error(err)?;
    let host = reference.split('/').next().unwrap_or(&reference);
    if plain_http(&text) {
        return Some(format!(
            "{host} does not speak HTTPS; if it is a plain-HTTP registry, add --insecure"
        ));
    }
    if unauthorized(&text) {
        if with_username {
            return Some(format!(
                "{host} refused the user name and password given with --username"
            ));
        }
        return Some(credentials_hint(host));
    }
    None
}

/// The image reference and the full text (every cause) of the first
/// registry error in `err`'s chain.
fn registry_error(err: &anyhow::Error) -> Option<(String, String)> {
    let reference = err.chain().find_map(|e| match e.downcast_ref() {
        Some(gkm_oci::Error::Registry { reference, .. }) => Some(reference.clone()),
        _ => None,
    })?;
    let text = err
        .chain()
        .flat_map(|e| std::iter::successors(Some(e), |e| e.source()).map(|e| format!("{e:?} {e}")))
        .collect::<Vec<_>>()
        .join(" ");
    Some((reference, text))
}

/// TLS failed because an HTTP server answered (rustls and OpenSSL's words
/// for it).
fn plain_http(text: &str) -> bool {
    [
        "InvalidContentType",
        "received corrupt message",
        "wrong version number",
        "http request to https",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// The registry asked for credentials or refused the ones sent.
fn unauthorized(text: &str) -> bool {
    [
        "401",
        "Unauthorized",
        "UNAUTHORIZED",
        "AuthenticationFailure",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Where gkm looked for credentials for `host`, and what it found there.
fn credentials_hint(host: &str) -> String {
    let fix = format!("run `docker login {host}`, or pass --username with --password-stdin");
    let Some(path) = docker_config_path() else {
        return format!(
            "{host} wants credentials; gkm looks in $DOCKER_CONFIG/config.json or \
             ~/.docker/config.json, and neither DOCKER_CONFIG nor HOME is set; {fix}"
        );
    };
    let found = match Credentials::DockerConfig.resolve(host) {
        Ok(RegistryAuth::Anonymous) if path.exists() => format!("which has no entry for {host}"),
        Ok(RegistryAuth::Anonymous) => "which does not exist".to_string(),
        Ok(_) => format!("whose credentials for {host} were refused"),
        Err(e) => format!("which could not be read ({e})"),
    };
    format!(
        "{host} wants credentials; gkm looked for them in {}, {found}; {fix}",
        path.display()
    )
}
