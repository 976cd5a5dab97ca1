//! Who a daemon is to the apiserver: the `User-Agent` of its client.
//!
//! A write that names no field manager (a merge or JSON patch, a create, an
//! update) is recorded in `metadata.managedFields` under the manager the
//! apiserver takes from the User-Agent, up to its first `/`, and audit logs
//! record the User-Agent of every request. kube's client sends none, so
//! without one such writes are owned by `unknown`: kube-runtime's
//! finalizer helper, for one, patches `metadata.finalizers` that way. Every
//! gkm binary's client identifies itself as `<program>/<version> (<os>/<arch>)`,
//! as client-go's programs do, so those writes are owned by the program.
//!
//! ```
//! let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
//! gkm_k8s_runtime::identity::identify(&mut config, "gkm-operator");
//! let (name, value) = config.headers.last().unwrap();
//! assert_eq!(name, http::header::USER_AGENT);
//! assert!(value.to_str().unwrap().starts_with("gkm-operator/"));
//! ```

use http::HeaderValue;
use http::header::USER_AGENT;

/// `<program>/<version> (<os>/<arch>)`, with `program` cut to the characters
/// a field manager's name keeps (letters, digits, `-`, `_`, `.`); `gkm` when
/// nothing is left.
pub fn user_agent(program: &str) -> String {
    let program: String = program
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(128)
        .collect();
    let program = if program.is_empty() { "gkm" } else { &program };
    format!(
        "{program}/{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// The file name this program was started as (`gkm-operator`), empty when
/// unknown.
pub fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|arg0| {
            std::path::Path::new(&arg0)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

/// Makes `config`'s client send [`user_agent`]`(program)`, replacing a
/// User-Agent it was given before.
pub fn identify(config: &mut kube::Config, program: &str) {
    config.headers.retain(|(name, _)| name != USER_AGENT);
    // Only visible ASCII is left in the value, so it is a valid header.
    if let Ok(value) = HeaderValue::from_str(&user_agent(program)) {
        config.headers.push((USER_AGENT, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manager_the_apiserver_derives_is_the_program() {
        let agent = user_agent("gkm-agent");
        assert_eq!(agent.split('/').next(), Some("gkm-agent"));
        assert!(agent.contains(env!("CARGO_PKG_VERSION")), "{agent}");
    }

    #[test]
    fn odd_program_names_still_give_a_valid_header() {
        assert!(user_agent("gkm agent/ü\n").starts_with("gkmagent/"));
        assert!(user_agent("/").starts_with("gkm/"));
        for program in ["gkm agent/ü\n", "", "\u{7f}"] {
            let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
            identify(&mut config, program);
            assert_eq!(config.headers.len(), 1, "{program:?}");
        }
    }

    #[test]
    fn identifying_twice_keeps_one_user_agent() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        identify(&mut config, "first");
        identify(&mut config, "gkm-csi");
        assert_eq!(config.headers.len(), 1);
        assert!(
            config.headers[0]
                .1
                .to_str()
                .unwrap()
                .starts_with("gkm-csi/")
        );
    }
}
