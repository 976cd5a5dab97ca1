//! Who may call the operator's admission webhooks, and what a call may
//! cost it. Their answers describe the namespace a request body names
//! (cache digests and the nodes they fit, claims, quota use), so with
//! `--webhook-client-ca` only a caller presenting a client certificate of
//! that CA (the apiserver, from its admission configuration) gets past the
//! TLS handshake; and every route takes bodies of its own size only,
//! refusing larger ones before decoding them. Against the real
//! `gkm-operator` running as its ServiceAccount with the shipped RBAC, and a
//! real kube-apiserver started with `--admission-control-config-file`.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use gkm_k8s_operator::admission::quota::{ENFORCED_LABEL, QUOTA_BINDING_PATH, QUOTA_PATH};
use gkm_testenv::{ControlPlane, ControlPlaneOptions, Process, free_port, http_get};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const MODEL: &str = "NVIDIA-A100-SXM4-80GB";
/// Every path the operator's webhooks serve.
const ROUTES: [&str; 4] = [
    "/mutate-pods",
    "/mutate-image-volumes",
    QUOTA_PATH,
    QUOTA_BINDING_PATH,
];

/// A certificate and its key, PEM.
#[derive(Clone)]
struct Identity {
    cert: String,
    key: String,
}

/// A CA issuing client certificates: its PEM and a client certificate.
fn client_ca(name: &str) -> anyhow::Result<(String, Identity)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let key = rcgen::KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver-webhook-client");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = client.signed_by(&key, &Issuer::from_params(&ca, &ca_key))?;
    Ok((
        ca_pem,
        Identity {
            cert: cert.pem(),
            key: key.serialize_pem(),
        },
    ))
}

/// The admission configuration making the apiserver present `identity` to
/// webhooks at `host` (`HOST:PORT` for a URL webhook, the Service's DNS name
/// behind a Service): its `--admission-control-config-file`.
fn admission_config(dir: &Path, host: &str, identity: &Identity) -> anyhow::Result<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let kubeconfig = dir.join("webhook-kubeconfig.yaml");
    std::fs::write(
        &kubeconfig,
        serde_json::to_string(&json!({
            "apiVersion": "v1", "kind": "Config",
            "users": [{"name": host, "user": {
                "client-certificate-data": b64(&identity.cert),
                "client-key-data": b64(&identity.key)}}],
        }))?,
    )?;
    let webhook = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": kubeconfig.display().to_string(),
    });
    let path = dir.join("admission.yaml");
    std::fs::write(
        &path,
        serde_json::to_string(&json!({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
            "plugins": [
                {"name": "ValidatingAdmissionWebhook", "configuration": webhook},
                {"name": "MutatingAdmissionWebhook", "configuration": webhook},
            ],
        }))?,
    )?;
    Ok(format!(
        "--admission-control-config-file={}",
        path.display()
    ))
}

/// A control plane whose apiserver presents the webhook client certificate,
/// and the operator serving the webhooks to holders of that certificate
/// (with `--webhook-client-ca`), or to any caller (the default install).
struct Ground {
    plane: ControlPlane,
    admin: kube::Client,
    operator: Process,
    addr: String,
    metrics_port: u16,
    /// The CA the operator's serving certificate chains to.
    serving_ca: String,
    /// The apiserver's client certificate.
    apiserver: Identity,
    _dir: tempfile::TempDir,
}

async fn ground() -> anyhow::Result<Ground> {
    ground_with(true).await
}

async fn ground_with(verify_callers: bool) -> anyhow::Result<Ground> {
    let dir = gkm_testenv::temp_dir()?;
    let hook_port = free_port()?;
    let addr = format!("127.0.0.1:{hook_port}");
    let (ca_pem, apiserver) = client_ca("webhook client CA")?;
    let ca_file = dir.path().join("webhook-client-ca.crt");
    std::fs::write(&ca_file, &ca_pem)?;
    let plane = ControlPlane::start_with(ControlPlaneOptions {
        apiserver_args: vec![admission_config(dir.path(), &addr, &apiserver)?],
        ..ControlPlaneOptions::default()
    })
    .await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let deploy = gkm_testenv::repo_root().join("deploy");
    plane.apply_file(&deploy.join("namespace.yaml")).await?;
    plane.apply_file(&deploy.join("rbac/operator.yaml")).await?;
    let admin = plane.client().await?;
    let apply = PatchParams::apply("gkm-test").force();
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "a100-1", "labels": {"gkm.io/gpu.product": MODEL}},
    }))?;
    Api::<Node>::all(admin.clone())
        .patch("a100-1", &apply, &Patch::Apply(&node))
        .await?;
    let operator = support::start_operator(
        &plane,
        &admin,
        "callers",
        &addr,
        &(verify_callers
            .then(|| format!("--webhook-client-ca={}", ca_file.display()))
            .into_iter()
            .collect::<Vec<_>>()),
        dir.path(),
    )
    .await?;
    let (metrics_port, serving_ca) = (
        operator.metrics_port,
        String::from_utf8(operator.ca_bundle)?,
    );
    let operator = operator.process;
    Ok(Ground {
        plane,
        admin,
        operator,
        addr,
        metrics_port,
        serving_ca,
        apiserver,
        _dir: dir,
    })
}

/// A TLS connection to the webhooks, trusting `ca_pem` and presenting
/// `identity` when given.
async fn connect(
    addr: &str,
    ca_pem: &str,
    identity: Option<&Identity>,
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match identity {
        Some(id) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(id.cert.as_bytes()).collect::<Result<_, _>>()?,
            PrivateKeyDer::from_pem_slice(id.key.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1")?, tcp)
        .await?;
    Ok(stream)
}

/// One POST of `body` to `path`: the whole reply, or the error that ended
/// the exchange (a refused handshake shows only on the first read under
/// TLS 1.3).
async fn post(
    addr: &str,
    ca_pem: &str,
    identity: Option<&Identity>,
    path: &str,
    body: &str,
) -> anyhow::Result<String> {
    let mut stream = connect(addr, ca_pem, identity).await?;
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

/// A POST of `size` bytes of `{` to `path`, sent chunked as a client that
/// declares no length would: the status the webhook answered with (the body
/// may still be being sent when it answers and closes).
async fn post_oversized(
    addr: &str,
    ca_pem: &str,
    identity: &Identity,
    path: &str,
    size: usize,
) -> anyhow::Result<u16> {
    let stream = connect(addr, ca_pem, Some(identity)).await?;
    let (mut read, mut write) = tokio::io::split(stream);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let sender = tokio::spawn(async move {
        let chunk = vec![b'{'; 64 << 10];
        write.write_all(head.as_bytes()).await?;
        let mut sent = 0;
        while sent < size {
            let n = chunk.len().min(size - sent);
            write.write_all(format!("{n:x}\r\n").as_bytes()).await?;
            write.write_all(&chunk[..n]).await?;
            write.write_all(b"\r\n").await?;
            sent += n;
        }
        write.write_all(b"0\r\n\r\n").await?;
        std::io::Result::Ok(())
    });
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = read.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the connection closed without an answer");
        reply.extend_from_slice(&buf[..n]);
    }
    sender.abort();
    let text = String::from_utf8_lossy(&reply);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no HTTP status in {text:?}"))?;
    Ok(status)
}

/// An AdmissionReview of a bind of `pod` in `namespace` to `node`.
fn binding_review(namespace: &str, pod: &str, node: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "probe", "namespace": namespace, "name": pod, "subResource": "binding",
            "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": pod, "namespace": namespace},
                       "target": {"kind": "Node", "name": node}},
        },
    })
    .to_string()
}

/// Namespace `name` under quota: labelled for enforcement, its `default`
/// ServiceAccount, and a quota of `gpus` GPUs of [`MODEL`].
async fn quota_namespace(admin: &kube::Client, name: &str, gpus: i64) -> anyhow::Result<()> {
    let apply = PatchParams::apply("gkm-test").force();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name,
        "labels": {ENFORCED_LABEL.0: ENFORCED_LABEL.1}}}))?;
    Api::<Namespace>::all(admin.clone())
        .patch(name, &apply, &Patch::Apply(&ns))
        .await?;
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default", "namespace": name}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), name)
        .patch("default", &apply, &Patch::Apply(&account))
        .await?;
    let quota: gkm_k8s_api::crd::GKMGPUQuota = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": "a100", "namespace": name},
        "spec": {"limits": [{"model": MODEL, "gpus": gpus}]},
    }))?;
    Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(admin.clone(), name)
        .patch("a100", &apply, &Patch::Apply(&quota))
        .await?;
    Ok(())
}

/// A pod naming node `a100-1` and asking one GPU.
fn gpu_pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": "a100-1", "containers": [{"name": "main",
            "image": "registry.invalid/infer:v1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))?)
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_apiserver_may_call_the_admission_webhooks() -> anyhow::Result<()> {
    let mut ground = ground().await?;
    let admin = ground.admin.clone();
    quota_namespace(&admin, "tenant-b", 1).await?;
    let pods = Api::<Pod>::namespaced(admin.clone(), "tenant-b");
    pods.create(&PostParams::default(), &gpu_pod("held")?)
        .await?;

    // A pod of another namespace asking about tenant-b, without the
    // apiserver's certificate or with one of another CA: refused at the
    // handshake, no answer, nothing about tenant-b.
    let (_, foreign) = client_ca("another CA")?;
    let probe = binding_review("tenant-b", "held", "a100-1");
    for (caller, identity) in [
        ("a caller without a client certificate", None),
        ("a caller with another CA's certificate", Some(&foreign)),
    ] {
        for path in ROUTES {
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                post(&ground.addr, &ground.serving_ca, identity, path, &probe),
            )
            .await
            .map_err(|_| anyhow::anyhow!("{caller} on {path}: neither answered nor refused"))?;
            match reply {
                Ok(reply) => panic!(
                    "{caller} was answered on {path}: {reply}\noperator:\n{}",
                    ground.operator.log_tail(20)
                ),
                Err(e) => assert!(
                    format!("{e:#}").contains("alert") || format!("{e:#}").contains("reset"),
                    "{caller} on {path}: refused, but not at the handshake: {e:#}"
                ),
            }
        }
    }
    // The apiserver's certificate is answered.
    let reply = post(
        &ground.addr,
        &ground.serving_ca,
        Some(&ground.apiserver),
        QUOTA_BINDING_PATH,
        &probe,
    )
    .await?;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    // The apiserver, presenting it from its admission configuration, still
    // admits through the webhook: within the quota, and refused past it.
    let refused = match pods.create(&PostParams::default(), &gpu_pod("over")?).await {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some(e.message),
        Err(e) => return Err(e.into()),
    };
    let message = refused.ok_or_else(|| {
        anyhow::anyhow!(
            "a second GPU pod was admitted over a quota of 1; operator:\n{}",
            ground.operator.log_tail(20)
        )
    })?;
    assert!(
        message.contains("gkm: quota tenant-b/a100 reached"),
        "the apiserver did not get the webhook's answer: {message}"
    );
    ground.operator.check_running()?;
    drop(ground.plane);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_admission_bodies_are_refused_before_decoding() -> anyhow::Result<()> {
    /// What the operator may grow by while refusing them: eight bodies at
    /// once, each read to its route's cap (3.5 MiB at most) and no further.
    const BOUND_MIB: f64 = 64.0;
    const SIZE: usize = 16 << 20;
    let mut ground = ground().await?;
    let pid = ground.operator.pid();
    let (_, before) = gkm_testenv::memory_mib(pid)?;
    for path in ROUTES {
        let posts = (0..8).map(|_| {
            post_oversized(
                &ground.addr,
                &ground.serving_ca,
                &ground.apiserver,
                path,
                SIZE,
            )
        });
        let statuses = futures::future::join_all(posts).await;
        for status in statuses {
            let status = status?;
            assert_eq!(
                status,
                413,
                "a 16 MiB body to {path} was not refused as too large; operator:\n{}",
                ground.operator.log_tail(20)
            );
        }
    }
    let (_, after) = gkm_testenv::memory_mib(pid)?;
    assert!(
        after - before <= BOUND_MIB,
        "the operator's peak memory grew by {:.0} MiB (from {before:.0} to {after:.0} MiB) refusing 32 oversized bodies",
        after - before
    );
    // It keeps answering: a review of its size, and its readiness.
    let reply = post(
        &ground.addr,
        &ground.serving_ca,
        Some(&ground.apiserver),
        QUOTA_BINDING_PATH,
        &binding_review("anywhere", "p", "a100-1"),
    )
    .await?;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"allowed\":true"), "{reply}");
    assert_eq!(
        http_get(ground.metrics_port, "/readyz").await.map(|r| r.0),
        Some(200)
    );
    ground.operator.check_running()?;
    Ok(())
}

/// A caller of the webhooks that holds `connections` connections open the
/// slow way: each sends its request head and one byte of a 1 KiB body, then
/// waits for the server to give up on it, and opens another, until `stop`;
/// `opened` counts the heads sent.
fn hold_slow_connections(
    addr: &str,
    ca_pem: &str,
    connections: usize,
    stop: &Arc<AtomicBool>,
    opened: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..connections)
        .map(|_| {
            let (addr, ca_pem) = (addr.to_string(), ca_pem.to_string());
            let (stop, opened) = (stop.clone(), opened.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = connect(&addr, &ca_pem, None).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let head = format!(
                        "POST {QUOTA_PATH} HTTP/1.1\r\nHost: {addr}\r\n\
                         Content-Type: application/json\r\nContent-Length: 1024\r\n\r\n{{"
                    );
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        continue;
                    }
                    opened.fetch_add(1, Ordering::Relaxed);
                    let mut reply = Vec::new();
                    let _ = tokio::time::timeout(
                        Duration::from_secs(15),
                        stream.read_to_end(&mut reply),
                    )
                    .await;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_holding_slow_connections_do_not_starve_the_apiservers_reviews()
-> anyhow::Result<()> {
    // The default install: no client CA, so any pod reaching the port may
    // connect and take its time.
    let mut ground = ground_with(false).await?;
    let admin = ground.admin.clone();
    quota_namespace(&admin, "tenant-c", 2).await?;
    let pods = Api::<Pod>::namespaced(admin.clone(), "tenant-c");
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let slow = 4 * gkm_k8s_operator::admission::MAX_REVIEWS_IN_FLIGHT;
    let held = hold_slow_connections(&ground.addr, &ground.serving_ca, slow, &stop, &opened);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Meanwhile the apiserver's reviews are answered by the webhook: pods
    // within the quota admitted, one past it refused by the quota's answer.
    let outcome = async {
        for name in ["first", "second"] {
            pods.create(&PostParams::default(), &gpu_pod(name)?)
                .await
                .map_err(|e| anyhow::anyhow!("{name}, within the quota, was not admitted: {e}"))?;
        }
        match pods
            .create(&PostParams::default(), &gpu_pod("third")?)
            .await
        {
            Err(kube::Error::Api(e)) => anyhow::ensure!(
                e.message.contains("gkm: quota tenant-c/a100 reached"),
                "the third pod was refused, but not by the quota's answer: {}",
                e.message
            ),
            other => anyhow::bail!("a third GPU pod past a quota of 2: {other:?}"),
        }
        anyhow::Ok(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in held {
        task.abort();
    }
    outcome.map_err(|e| anyhow::anyhow!("{e:#}\noperator:\n{}", ground.operator.log_tail(20)))?;
    let opened = opened.load(Ordering::Relaxed);
    assert!(
        opened >= slow,
        "the slow caller got only {opened} of its {slow} connections in"
    );
    ground.operator.check_running()?;
    Ok(())
}
