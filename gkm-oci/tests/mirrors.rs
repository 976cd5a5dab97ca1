//! Pulls through a registry mirror configured as containerd's hosts.toml,
//! against two real Distribution registries: the origin an image names and
//! a mirror holding a copy. What each was asked comes from its access log.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::assert_same_tree;
use gkm_oci::mirrors::HostsConfig;
use gkm_oci::{
    BuildOptions, Digest, Error, ExtractPolicy, Image, ImageRef, RegistryOptions, Repo, Store,
    build, copy_image,
};
use gkm_testenv::{Registry, fixture_cache};

const FIXTURE: &str = "triton-vector-add-cuda-sm75";

/// An origin and a mirror, both logging requests, with the fixture pushed
/// to the origin (and, when `mirrored`, copied to the mirror under the same
/// repository, as a pull-through cache would hold it).
struct Ground {
    origin: Registry,
    mirror: Registry,
    image: ImageRef,
    digest: Digest,
    config: Digest,
    layer: Digest,
    work: tempfile::TempDir,
    /// How many requests each registry had answered once set up.
    setup: (usize, usize),
}

impl Ground {
    async fn new(mirrored: bool) -> Ground {
        let start = || {
            Registry::start_logging_requests()
                .expect("start docker-registry (apt-get install -y docker-registry)")
        };
        let (origin, mirror) = (start(), start());
        let plain = RegistryOptions {
            insecure: true,
            ..RegistryOptions::default()
        };
        let tagged: ImageRef = format!("{}/mirrored/cache:v1", origin.addr())
            .parse()
            .expect("ref");
        let built = build(
            &fixture_cache(FIXTURE),
            &tagged,
            &BuildOptions::default(),
            &plain,
        )
        .await
        .expect("build and push to the origin");
        if mirrored {
            let copy: ImageRef = format!("{}/mirrored/cache:v1", mirror.addr())
                .parse()
                .expect("ref");
            copy_image(
                &Repo::open(&tagged, &plain).expect("open"),
                &Repo::create(&copy, &plain).expect("create"),
                None,
            )
            .await
            .expect("copy to the mirror");
        }
        let image = tagged.with_digest(&built.digest);
        let fetched = Image::fetch(&Repo::open(&image, &plain).expect("open"))
            .await
            .expect("fetch");
        let answered = |r: &Registry| r.answered().expect("access log");
        Ground {
            setup: (answered(&origin), answered(&mirror)),
            config: fetched.manifest.config.digest.clone(),
            layer: fetched.cache_layer().expect("layer").digest.clone(),
            digest: built.digest,
            image,
            origin,
            mirror,
            work: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// A config directory whose hosts.toml for the origin says `text`.
    fn hosts(&self, text: &str) -> RegistryOptions {
        let dir = self.work.path().join("registry.d").join(self.origin.addr());
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("hosts.toml"), text).expect("write hosts.toml");
        RegistryOptions {
            insecure: true,
            hosts: HostsConfig::Dir(self.work.path().join("registry.d")),
            ..RegistryOptions::default()
        }
    }

    /// The hosts.toml listing the mirror (pull only) before the origin.
    fn through_mirror(&self) -> RegistryOptions {
        self.hosts(&format!(
            "[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n",
            self.mirror.addr()
        ))
    }

    /// Pulls the image into a fresh store and checks the tree is the fixture's.
    async fn pull(&self, options: &RegistryOptions) -> Result<PathBuf, Error> {
        let root = tempfile::tempdir_in(self.work.path())
            .expect("tempdir")
            .keep();
        let store = Store::open(&root)?;
        let stored = store
            .ensure(
                &Repo::open(&self.image, options)?,
                &ExtractPolicy::default(),
                None,
            )
            .await?;
        assert_eq!(stored.digest, self.digest);
        assert_same_tree(
            &fixture_cache(FIXTURE),
            &stored.path.join("io.triton.cache"),
        );
        Ok(root)
    }

    /// Replaces the bytes `registry` stores for `digest` with as many other
    /// bytes, so that the real registry serves them under that digest.
    fn tamper(registry: &Registry, digest: &Digest) {
        let path = registry.blob_data_path(digest.as_str());
        let mut bytes = std::fs::read(&path).expect("read the stored blob");
        let from = bytes.len() / 3;
        for b in bytes.iter_mut().skip(from).take(64) {
            *b ^= 0x5a;
        }
        std::fs::write(&path, bytes).expect("tamper");
    }
}

impl Ground {
    /// The GETs of the origin since setup whose path holds `needle`.
    fn origin_gets(&self, needle: &str) -> Vec<String> {
        self.origin
            .gets_since(self.setup.0, needle)
            .expect("access log")
    }

    /// The GETs of the mirror since setup whose path holds `needle`.
    fn mirror_gets(&self, needle: &str) -> Vec<String> {
        self.mirror
            .gets_since(self.setup.1, needle)
            .expect("access log")
    }

    /// Neither registry was asked for the image's config.
    fn assert_config_unread(&self) {
        let config = blob(&self.config);
        assert_eq!(self.origin_gets(&config), Vec::<String>::new());
        assert_eq!(self.mirror_gets(&config), Vec::<String>::new());
    }
}

fn blob(digest: &Digest) -> String {
    format!("/blobs/{digest}")
}

/// A blob the mirror holds is read from it alone: the origin is never
/// asked for it, nor for the manifest by digest.
#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_serves_the_pull_and_the_origin_is_not_asked() {
    let ground = Ground::new(true).await;
    ground
        .pull(&ground.through_mirror())
        .await
        .expect("pull through the mirror");
    // gkm's images carry their cache labels in the manifest, so a pull
    // reads the manifest and the layer, never the config.
    ground.assert_config_unread();
    {
        let digest = &ground.layer;
        assert_eq!(ground.origin_gets(&blob(digest)), Vec::<String>::new());
        let served = ground.mirror_gets(&blob(digest));
        assert_eq!(served.len(), 1, "{served:?}");
        // The mirror is told which registry the request is for.
        assert!(
            served[0].contains(&format!("?ns={}", ground.origin.addr())),
            "{served:?}"
        );
    }
    let by_digest = format!("/manifests/{}", ground.digest);
    assert_eq!(ground.origin_gets(&by_digest), Vec::<String>::new());
    assert_eq!(ground.mirror_gets(&by_digest).len(), 1);

    // A tag is never resolved by a pull-only mirror: the origin answers it.
    let tagged: ImageRef = format!("{}/mirrored/cache:v1", ground.origin.addr())
        .parse()
        .expect("ref");
    let repo = Repo::open(&tagged, &ground.through_mirror()).expect("open");
    assert_eq!(Image::resolve(&repo).await.expect("resolve"), ground.digest);
    assert_eq!(ground.origin_gets("/manifests/v1").len(), 1);
    assert_eq!(ground.mirror_gets("/manifests/v1"), Vec::<String>::new());
}

/// A mirror that does not hold the image is passed over for the origin.
#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_missing_the_image_falls_back_to_the_origin() {
    let ground = Ground::new(false).await;
    ground
        .pull(&ground.through_mirror())
        .await
        .expect("pull falls back to the origin");
    // Asked first, it answered 404.
    assert_eq!(ground.mirror_gets(&blob(&ground.layer)).len(), 1);
    assert_eq!(ground.origin_gets(&blob(&ground.layer)).len(), 1);
    ground.assert_config_unread();
}

/// A mirror whose storage holds other bytes under the layer's and the
/// config's digests is refused by digest and the origin serves the pull (a
/// pull reads the layer; the config is read on its own);
/// with the mirror as the only host the pull fails naming it and the digest,
/// and leaves nothing in the store.
#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_serving_wrong_bytes_is_refused_by_digest() {
    let ground = Ground::new(true).await;
    Ground::tamper(&ground.mirror, &ground.layer);
    Ground::tamper(&ground.mirror, &ground.config);
    ground
        .pull(&ground.through_mirror())
        .await
        .expect("the origin serves what the mirror got wrong");
    ground.assert_config_unread();
    {
        let digest = &ground.layer;
        assert_eq!(
            ground.mirror_gets(&blob(digest)).len(),
            1,
            "the mirror was tried"
        );
        assert_eq!(
            ground.origin_gets(&blob(digest)).len(),
            1,
            "then the origin"
        );
    }

    // The mirror as the registry's only host: nothing to fall back to.
    let only_mirror = ground.hosts(&format!("server = \"http://{}\"\n", ground.mirror.addr()));
    let config = Repo::open(&ground.image, &only_mirror).expect("open");
    let err = Image::fetch(&config)
        .await
        .expect_err("the config is wrong");
    assert_refused(&err, &ground, &ground.config);

    // The layer alone wrong: caught while streaming, nothing kept.
    let fresh = Ground::new(true).await;
    Ground::tamper(&fresh.mirror, &fresh.layer);
    let only_mirror = fresh.hosts(&format!("server = \"http://{}\"\n", fresh.mirror.addr()));
    let err = fresh
        .pull(&only_mirror)
        .await
        .expect_err("the layer is wrong");
    assert_refused(&err, &fresh, &fresh.layer);
    let stores: Vec<PathBuf> = std::fs::read_dir(fresh.work.path())
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("sha256").is_dir())
        .collect();
    for store in stores {
        assert!(
            is_empty(&store.join("sha256")),
            "{}: a refused layer left a tree",
            store.display()
        );
    }
}

fn assert_refused(err: &Error, ground: &Ground, digest: &Digest) {
    let text = err.to_string();
    assert!(
        matches!(err, Error::DigestMismatch { .. })
            && text.contains(&format!("http://{}", ground.mirror.addr()))
            && text.contains(digest.as_str()),
        "{text}"
    );
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}
