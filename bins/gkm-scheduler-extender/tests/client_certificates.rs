//! Who may call the extender's verbs, as it ships: over mutual TLS, only a
//! caller presenting a client certificate of the client CA it was given
//! (kube-scheduler's, named in its `tlsConfig`) gets past the TLS
//! handshake; any other caller on the pod network never reaches
//! `/scheduler/bind`, so it cannot bind pods with the extender's rights.
//! Against the real binary started with the chart's default arguments, a
//! real kube-apiserver and a real kube-scheduler configured from the shipped
//! example.

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use support::{Certificates, Cluster, Outcome, asking, outcome, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// One POST of `body` to `path` over TLS, trusting `ca_pem` and presenting
/// `identity` (certificate and key PEM) when given: the whole reply, or the
/// error that ended the exchange.
async fn post_tls(
    addr: &str,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    path: &str,
    body: &str,
) -> anyhow::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>()?,
            PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let mut stream = connector.connect(name, tcp).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// The bind call kube-scheduler makes, for pod `ns/name` (`uid`) onto `node`.
fn bind_call(ns: &str, name: &str, uid: &str, node: &str) -> String {
    json!({"PodName": name, "PodNamespace": ns, "PodUID": uid, "Node": node}).to_string()
}

/// Callers without a client certificate, or with one of another CA, are
/// refused at the handshake and the pod they name stays unbound; the same
/// call with the scheduler's certificate binds it, and kube-scheduler with
/// that certificate schedules through the extender.
#[tokio::test]
async fn only_a_caller_with_the_schedulers_client_certificate_may_bind() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    cluster.namespace("ml").await?;
    for node in ["a100-0", "a100-1"] {
        cluster
            .gpu_node(node, "NVIDIA-A100", &[("nvidia.com/gpu", "8")], &[])
            .await?;
    }
    let certificates: Certificates = cluster.start_extender_mtls().await?;
    let addr = cluster.extender_addr.clone();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "ml");

    // A pod no scheduler places: only a bind call can put it on a node.
    let spec =
        json!({"schedulerName": "nobody", "containers": asking(json!({"nvidia.com/gpu": "1"}))});
    let target = cluster.pod("ml", "target", spec).await?;
    let uid = target.metadata.uid.clone().unwrap_or_default();
    let bind = bind_call("ml", "target", &uid, "a100-1");

    let (foreign_cert, foreign_key) = (
        certificates.foreign_cert_pem.as_str(),
        certificates.foreign_key_pem.as_str(),
    );
    for (caller, identity) in [
        ("a caller without a client certificate", None),
        (
            "a caller with a client certificate of another CA",
            Some((foreign_cert, foreign_key)),
        ),
    ] {
        let reply = tokio::time::timeout(
            Duration::from_secs(10),
            post_tls(
                &addr,
                &certificates.ca_pem,
                identity,
                "/scheduler/bind",
                &bind,
            ),
        )
        .await;
        let Ok(reply) = reply else {
            panic!(
                "{caller}: the extender neither answered nor refused\n{}",
                cluster.logs()
            );
        };
        match reply {
            Ok(reply) => panic!(
                "{caller} reached the bind verb: {}\n{}",
                reply.lines().next().unwrap_or_default(),
                cluster.logs()
            ),
            Err(e) => assert!(
                format!("{e:#}").contains("alert"),
                "{caller}: refused, but not by the TLS handshake: {e:#}"
            ),
        }
    }
    let after = outcome(&pods.get("target").await?);
    assert!(
        matches!(after, Outcome::Pending(_)),
        "a refused caller's bind placed the pod: {after:?}"
    );

    // The same call with the scheduler's client certificate is answered and
    // binds the pod: the refusals above were the certificate's doing.
    let (client_cert, client_key) = certificates.client_pem()?;
    let reply = post_tls(
        &addr,
        &certificates.ca_pem,
        Some((&client_cert, &client_key)),
        "/scheduler/bind",
        &bind,
    )
    .await?;
    assert!(
        reply.starts_with("HTTP/1.1 200"),
        "{reply}\n{}",
        cluster.logs()
    );
    let placed = wait_for(&cluster.client, "ml", "target", |o| {
        matches!(o, Outcome::Bound(_))
    })
    .await?;
    assert_eq!(
        placed,
        Outcome::Bound("a100-1".into()),
        "{}",
        cluster.logs()
    );

    // kube-scheduler configured from the shipped example, with the client
    // certificate, filters, scores and binds through the extender.
    let config = support::scheduler_config_mtls(&addr, &certificates)?;
    cluster.start_scheduler(&config)?;
    cluster
        .pod(
            "ml",
            "job",
            json!({"containers": asking(json!({"nvidia.com/gpu": "1"}))}),
        )
        .await?;
    let scheduled = wait_for(&cluster.client, "ml", "job", |o| {
        matches!(o, Outcome::Bound(_))
    })
    .await?;
    assert!(
        matches!(&scheduled, Outcome::Bound(node) if node.starts_with("a100-")),
        "{scheduled:?}\n{}",
        cluster.logs()
    );
    Ok(())
}

/// Started without a client CA, the extender refuses to serve unless told
/// in so many words to let any caller bind.
#[test]
fn the_extender_will_not_serve_binds_without_a_client_ca() -> anyhow::Result<()> {
    let binary = env!("CARGO_BIN_EXE_gkm-scheduler-extender");
    let dir = std::env::temp_dir().join(format!("gkm-extender-no-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let certificates = Certificates::issue(&dir)?;
    let runs = [
        vec![],
        vec![
            format!("--tls-cert-file={}", certificates.serving_cert.display()),
            format!("--tls-key-file={}", certificates.serving_key.display()),
        ],
    ];
    for flags in runs {
        let out = Command::new(binary)
            .args(&flags)
            .arg("--kubeconfig=/nonexistent")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: started\n{stderr}");
        assert!(
            stderr.contains("--client-ca-file") && stderr.contains("--insecure-no-client-auth"),
            "{flags:?}: the refusal names the flags that fix it:\n{stderr}"
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
