//! A generated corpus of hostile layers: each is rejected with its rule,
//! naming the entry, and nothing is written outside staging nor left in it.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use gkm_oci::labels::{OCI_CONFIG, OCI_MANIFEST};
use gkm_oci::{
    Compression, Error, ExtractPolicy, Image, ImageRef, Layout, RegistryOptions, Repo, Rule, Store,
    UnpackOptions, extract_to_dir,
};

/// Tar entry types by their flag byte.
const REG: u8 = b'0';
const HARD: u8 = b'1';
const SYM: u8 = b'2';
const CHR: u8 = b'3';
const BLK: u8 = b'4';
const DIR: u8 = b'5';
const FIFO: u8 = b'6';
const PAX: u8 = b'x';
const LONGNAME: u8 = b'L';
const SPARSE: u8 = b'S';

/// A raw tar, written header by header, so nothing sanitises the names.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn entry(self, name: &[u8], kind: u8, mode: u32, link: &[u8], size: u64, data: &[u8]) -> Tar {
        self.entry_dated(name, kind, mode, link, size, data, 0)
    }
    #[allow(clippy::too_many_arguments)]
    fn entry_dated(
        mut self,
        name: &[u8],
        kind: u8,
        mode: u32,
        link: &[u8],
        size: u64,
        data: &[u8],
        mtime: u64,
    ) -> Tar {
        let mut h = tar::Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().expect("gnu header");
            let n = name.len().min(100);
            gnu.name[..n].copy_from_slice(&name[..n]);
            let l = link.len().min(100);
            gnu.linkname[..l].copy_from_slice(&link[..l]);
        }
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(mtime);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
        self
    }
    fn file(self, name: &str, data: &[u8]) -> Tar {
        self.entry(name.as_bytes(), REG, 0o644, b"", data.len() as u64, data)
    }
    fn dir(self, name: &str) -> Tar {
        self.entry(name.as_bytes(), DIR, 0o755, b"", 0, b"")
    }
    fn pax(self, records: &[(&str, &[u8])]) -> Tar {
        let mut body = Vec::new();
        for (k, v) in records {
            let rest = k.len() + v.len() + 3;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        let size = body.len() as u64;
        self.entry(b"./PaxHeaders/x", PAX, 0o644, b"", size, &body)
    }
    fn long_name(self, name: &[u8]) -> Tar {
        let mut data = name.to_vec();
        data.push(0);
        let size = data.len() as u64;
        self.entry(b"././@LongLink", LONGNAME, 0o644, b"", size, &data)
    }
    fn end(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0u8, 1024));
        self.0
    }
    /// Ends without the end-of-archive blocks, as a cut download would.
    fn cut(self) -> Vec<u8> {
        self.0
    }
}

const C: &str = "io.triton.cache";

fn base() -> Tar {
    Tar::default()
        .dir("io.triton.cache/")
        .file("io.triton.cache/ok.json", b"{}")
}

struct Case {
    name: &'static str,
    tar: Vec<u8>,
    policy: ExtractPolicy,
    rule: Rule,
    entry: String,
    compression: Compression,
}

fn case(name: &'static str, tar: Vec<u8>, rule: Rule, entry: impl Into<String>) -> Case {
    Case {
        name,
        tar,
        policy: ExtractPolicy::default(),
        rule,
        entry: entry.into(),
        compression: Compression::Zstd,
    }
}

fn with_links(mut c: Case) -> Case {
    c.policy.allow_in_tree_links = true;
    c
}

fn strict_bits(mut c: Case) -> Case {
    c.policy.reject_special_bits = true;
    c
}

/// The store's staging directory is `<work>/store/staging/<name>`, so
/// `../../../outside` from it is the canary directory `<work>/outside`.
const ESCAPE: &str = "../../../outside/pwned";

fn corpus() -> Vec<Case> {
    let big_zero = vec![0u8; 64 << 20];
    let long_component = "k".repeat(300);
    let long_path = format!("{C}/{}", ["d"; 2100].join("/"));
    let mut cases = vec![
        case(
            "traversal in cache",
            base().file(&format!("{C}/{ESCAPE}"), b"x").end(),
            Rule::ParentDir,
            format!("{C}/{ESCAPE}"),
        ),
        case(
            "traversal at top",
            base().file(ESCAPE, b"x").end(),
            Rule::ParentDir,
            ESCAPE,
        ),
        case(
            "traversal in the middle",
            base()
                .file(&format!("{C}/a/../../../../outside/p"), b"x")
                .end(),
            Rule::ParentDir,
            format!("{C}/a/../../../../outside/p"),
        ),
        case(
            "traversal directory",
            base().dir(&format!("{C}/../../../outside/d/")).end(),
            Rule::ParentDir,
            "outside/d",
        ),
        case(
            "traversal via long name",
            base()
                .long_name(format!("{C}/{ESCAPE}").as_bytes())
                .file("placeholder", b"x")
                .end(),
            Rule::ParentDir,
            "pwned",
        ),
        case(
            "traversal via pax path",
            base()
                .pax(&[("path", format!("{C}/{ESCAPE}").as_bytes())])
                .file("placeholder", b"x")
                .end(),
            Rule::ParentDir,
            "pwned",
        ),
        case(
            "absolute path",
            base().file("/etc/passwd-gkm-test", b"x").end(),
            Rule::AbsolutePath,
            "/etc/passwd-gkm-test",
        ),
        case(
            "absolute cache path",
            base().file(&format!("/{C}/x"), b"x").end(),
            Rule::AbsolutePath,
            format!("/{C}/x"),
        ),
        case(
            "symlink to outside",
            base()
                .entry(format!("{C}/l").as_bytes(), SYM, 0o777, b"/tmp", 0, b"")
                .end(),
            Rule::LinkNotAllowed,
            format!("{C}/l"),
        ),
        case(
            "symlink as cache root",
            Tar::default()
                .entry(C.as_bytes(), SYM, 0o777, b"/", 0, b"")
                .end(),
            Rule::LinkNotAllowed,
            C,
        ),
        with_links(case(
            "allowed links: symlink as cache root",
            Tar::default()
                .entry(C.as_bytes(), SYM, 0o777, b".", 0, b"")
                .end(),
            Rule::LinkEscape,
            C,
        )),
        case(
            "hardlink to /etc/passwd",
            base()
                .entry(
                    format!("{C}/h").as_bytes(),
                    HARD,
                    0o644,
                    b"/etc/passwd",
                    0,
                    b"",
                )
                .end(),
            Rule::LinkNotAllowed,
            format!("{C}/h"),
        ),
        with_links(case(
            "allowed links: relative symlink escape",
            base()
                .entry(
                    format!("{C}/l").as_bytes(),
                    SYM,
                    0o777,
                    b"../../../outside",
                    0,
                    b"",
                )
                .end(),
            Rule::LinkEscape,
            format!("{C}/l"),
        )),
        with_links(case(
            "allowed links: absolute symlink",
            base()
                .entry(format!("{C}/l").as_bytes(), SYM, 0o777, b"/etc", 0, b"")
                .end(),
            Rule::LinkEscape,
            format!("{C}/l"),
        )),
        with_links(case(
            "allowed links: dotdot after a name",
            base()
                .entry(
                    format!("{C}/a/b/l").as_bytes(),
                    SYM,
                    0o777,
                    b"x/../../../..",
                    0,
                    b"",
                )
                .end(),
            Rule::LinkEscape,
            format!("{C}/a/b/l"),
        )),
        with_links(case(
            "allowed links: symlink leaving the cache dir",
            base()
                .entry(format!("{C}/l").as_bytes(), SYM, 0o777, b"..", 0, b"")
                .end(),
            Rule::LinkEscape,
            format!("{C}/l"),
        )),
        with_links(case(
            "allowed links: write through symlink",
            base()
                .dir(&format!("{C}/sub/"))
                .entry(format!("{C}/d").as_bytes(), SYM, 0o777, b"sub", 0, b"")
                .file(&format!("{C}/d/x"), b"x")
                .end(),
            Rule::ThroughLink,
            format!("{C}/d/x"),
        )),
        with_links(case(
            "allowed links: hardlink escape",
            base()
                .entry(
                    format!("{C}/h").as_bytes(),
                    HARD,
                    0o644,
                    b"../../../outside/secret",
                    0,
                    b"",
                )
                .end(),
            Rule::LinkEscape,
            format!("{C}/h"),
        )),
        with_links(case(
            "allowed links: hardlink to absent file",
            base()
                .entry(
                    format!("{C}/h").as_bytes(),
                    HARD,
                    0o644,
                    format!("{C}/nope").as_bytes(),
                    0,
                    b"",
                )
                .end(),
            Rule::LinkEscape,
            format!("{C}/h"),
        )),
        with_links(case(
            "allowed links: absolute hardlink",
            base()
                .entry(
                    format!("{C}/h").as_bytes(),
                    HARD,
                    0o644,
                    b"/etc/shadow",
                    0,
                    b"",
                )
                .end(),
            Rule::LinkEscape,
            format!("{C}/h"),
        )),
        case(
            "character device",
            base()
                .entry(format!("{C}/null").as_bytes(), CHR, 0o666, b"", 0, b"")
                .end(),
            Rule::SpecialFile,
            format!("{C}/null"),
        ),
        case(
            "block device",
            base()
                .entry(format!("{C}/sda").as_bytes(), BLK, 0o660, b"", 0, b"")
                .end(),
            Rule::SpecialFile,
            format!("{C}/sda"),
        ),
        case(
            "fifo",
            base()
                .entry(format!("{C}/fifo").as_bytes(), FIFO, 0o644, b"", 0, b"")
                .end(),
            Rule::SpecialFile,
            format!("{C}/fifo"),
        ),
        case(
            "unknown type (socket-like)",
            base()
                .entry(format!("{C}/sock").as_bytes(), b'Z', 0o644, b"", 0, b"")
                .end(),
            Rule::SpecialFile,
            format!("{C}/sock"),
        ),
        strict_bits(case(
            "setuid file",
            base()
                .entry(format!("{C}/suid").as_bytes(), REG, 0o4755, b"", 1, b"x")
                .end(),
            Rule::SpecialBits,
            format!("{C}/suid"),
        )),
        strict_bits(case(
            "setgid file",
            base()
                .entry(format!("{C}/sgid").as_bytes(), REG, 0o2755, b"", 1, b"x")
                .end(),
            Rule::SpecialBits,
            format!("{C}/sgid"),
        )),
        strict_bits(case(
            "sticky directory",
            base()
                .entry(format!("{C}/tmp/").as_bytes(), DIR, 0o1777, b"", 0, b"")
                .end(),
            Rule::SpecialBits,
            format!("{C}/tmp/"),
        )),
        case(
            "huge entry",
            base()
                .entry(
                    format!("{C}/huge").as_bytes(),
                    REG,
                    0o644,
                    b"",
                    100 << 30,
                    b"",
                )
                .cut(),
            Rule::EntryTooLarge,
            format!("{C}/huge"),
        ),
        Case {
            policy: ExtractPolicy {
                max_total_size: 1 << 20,
                ..Default::default()
            },
            ..case(
                "total too large",
                base()
                    .file(&format!("{C}/a"), &[1; 600 << 10])
                    .file(&format!("{C}/b"), &[2; 600 << 10])
                    .end(),
                Rule::TotalTooLarge,
                format!("{C}/b"),
            )
        },
        Case {
            policy: ExtractPolicy {
                max_entries: 10,
                ..Default::default()
            },
            ..case(
                "too many entries",
                (0..20)
                    .fold(base(), |t, i| t.file(&format!("{C}/f{i}"), b"x"))
                    .end(),
                Rule::TooManyEntries,
                "",
            )
        },
        case(
            "zip bomb (zstd)",
            base().file(&format!("{C}/zeros"), &big_zero).end(),
            Rule::CompressionRatio,
            "(layer)",
        ),
        Case {
            compression: Compression::Gzip,
            ..case(
                "zip bomb (gzip)",
                base().file(&format!("{C}/zeros"), &big_zero).end(),
                Rule::CompressionRatio,
                "(layer)",
            )
        },
        case(
            "duplicate file",
            base()
                .file(&format!("{C}/dup"), b"one")
                .file(&format!("{C}/dup"), b"two")
                .end(),
            Rule::Duplicate,
            format!("{C}/dup"),
        ),
        case(
            "file then directory",
            base()
                .file(&format!("{C}/x"), b"one")
                .dir(&format!("{C}/x/"))
                .end(),
            Rule::Duplicate,
            format!("{C}/x/"),
        ),
        case(
            "file under a file",
            base()
                .file(&format!("{C}/x"), b"one")
                .file(&format!("{C}/x/y"), b"two")
                .end(),
            Rule::Duplicate,
            format!("{C}/x/y"),
        ),
        case(
            "long component",
            base()
                .long_name(format!("{C}/{long_component}").as_bytes())
                .file("placeholder", b"x")
                .end(),
            Rule::NameTooLong,
            "kkkk",
        ),
        case(
            "long path",
            base()
                .pax(&[("path", long_path.as_bytes())])
                .file("placeholder", b"x")
                .end(),
            Rule::NameTooLong,
            "d/d/d",
        ),
        case(
            "non-UTF-8 name",
            base()
                .entry(b"io.triton.cache/\xff\xfekernel", REG, 0o644, b"", 1, b"x")
                .end(),
            Rule::NonUtf8Name,
            "kernel",
        ),
        case(
            "non-UTF-8 pax path",
            base()
                .pax(&[("path", b"io.triton.cache/\xc3\x28")])
                .file("placeholder", b"x")
                .end(),
            Rule::NonUtf8Name,
            "io.triton.cache/",
        ),
        case(
            "pax size smaller than data",
            base()
                .pax(&[("size", b"10")])
                .entry(
                    format!("{C}/p").as_bytes(),
                    REG,
                    0o644,
                    b"",
                    2048,
                    &[b'A'; 2048],
                )
                .end(),
            Rule::Malformed,
            format!("{C}/p"),
        ),
        case(
            "pax size larger than data",
            base()
                .pax(&[("size", b"1048576")])
                .entry(
                    format!("{C}/p").as_bytes(),
                    REG,
                    0o644,
                    b"",
                    10,
                    &[b'A'; 10],
                )
                .cut(),
            Rule::Malformed,
            format!("{C}/p"),
        ),
        case(
            "a modification time beyond any date",
            base()
                .entry_dated(
                    format!("{C}/p").as_bytes(),
                    REG,
                    0o644,
                    b"",
                    1,
                    b"x",
                    u64::MAX,
                )
                .end(),
            Rule::Malformed,
            format!("{C}/p"),
        ),
        case(
            "pax size not a number",
            base()
                .pax(&[("size", b"12abc")])
                .file(&format!("{C}/p"), b"x")
                .end(),
            Rule::Malformed,
            format!("{C}/p"),
        ),
        case(
            "pax size huge",
            base()
                .pax(&[("size", b"1099511627776")])
                .entry(format!("{C}/p").as_bytes(), REG, 0o644, b"", 0, b"")
                .cut(),
            Rule::EntryTooLarge,
            format!("{C}/p"),
        ),
        case(
            "truncated data",
            base()
                .entry(
                    format!("{C}/t").as_bytes(),
                    REG,
                    0o644,
                    b"",
                    4096,
                    &[b'B'; 100],
                )
                .cut(),
            Rule::Malformed,
            format!("{C}/t"),
        ),
        case(
            "outside the layout",
            base().file("etc/cron.d/job", b"x").end(),
            Rule::OutsideLayout,
            "etc/cron.d/job",
        ),
        case(
            "extra file in manifest dir",
            base().file("io.triton.manifest/run.sh", b"x").end(),
            Rule::OutsideLayout,
            "io.triton.manifest/run.sh",
        ),
        case(
            "sparse file",
            base()
                .entry(format!("{C}/s").as_bytes(), SPARSE, 0o644, b"", 0, b"")
                .end(),
            Rule::Malformed,
            "after io.triton.cache/ok.json",
        ),
    ];
    // Memory an input controls: extension headers are read whole by the tar
    // parser, remembered paths add up.
    cases.extend(memory_cases());
    let mut bad_sum = base().end();
    bad_sum[512 + 148] ^= 0x11;
    cases.push(case(
        "corrupt header checksum",
        bad_sum,
        Rule::Malformed,
        "",
    ));
    cases
}

/// Inputs that would make the extractor allocate what they ask for.
fn memory_cases() -> Vec<Case> {
    let huge = vec![b'n'; 16 << 20];
    let long_pax = vec![b'p'; 1 << 20];
    let mut many_paths = base();
    let stem = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"]
        .map(|c| c.repeat(250))
        .join("/");
    for i in 0..64 {
        let name = format!("{C}/{stem}/{i:04}/");
        many_paths = many_paths.long_name(name.as_bytes()).dir("placeholder");
    }
    let mut bookkeeping = case(
        "64 paths of 2.8 KiB over a 64 KiB bookkeeping budget",
        many_paths.end(),
        Rule::TooManyEntries,
        "/0023/",
    );
    bookkeeping.policy.max_path_bookkeeping = 64 << 10;
    vec![
        case(
            "GNU long name of 16 MiB",
            base()
                .long_name(&huge)
                .file("io.triton.cache/after", b"x")
                .end(),
            Rule::OversizedHeader,
            "(header at byte 1536)",
        ),
        case(
            "GNU long link of 16 MiB",
            base()
                .entry(b"././@LongLink", b'K', 0o644, b"", huge.len() as u64, &huge)
                .file("io.triton.cache/after", b"x")
                .end(),
            Rule::OversizedHeader,
            "(header at byte 1536)",
        ),
        case(
            "PAX header of 1 MiB",
            base()
                .pax(&[("comment", &long_pax)])
                .file("io.triton.cache/after", b"x")
                .end(),
            Rule::OversizedHeader,
            "(header at byte 1536)",
        ),
        bookkeeping,
    ]
}

fn compress(tar: &[u8], c: Compression) -> Vec<u8> {
    match c {
        Compression::Zstd => zstd::encode_all(tar, 19).expect("zstd"),
        Compression::Gzip => {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(tar).expect("gzip");
            e.finish().expect("gzip")
        }
        Compression::None => tar.to_vec(),
    }
}

/// Write `blob` as the one layer of an image in a layout; returns its ref.
fn image_of(dir: &Path, blob: &[u8], compression: Compression) -> ImageRef {
    let layout = Layout::create(dir).expect("layout");
    let layer = layout.write_blob(blob).expect("blob");
    let config = br#"{"architecture":"amd64","os":"linux","config":{"Labels":{"cache.triton.image/summary":"{\"targets\":[]}"}},"rootfs":{"type":"layers","diff_ids":[]}}"#;
    let config_digest = layout.write_blob(config).expect("config");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest.to_string(), "size": config.len()},
        "layers": [{"mediaType": compression.media_type(), "digest": layer.to_string(), "size": blob.len()}],
    });
    let bytes = serde_json::to_vec(&manifest).expect("json");
    let digest = layout.write_blob(&bytes).expect("manifest");
    let desc = oci_spec::image::Descriptor::new(
        oci_spec::image::MediaType::ImageManifest,
        bytes.len() as u64,
        digest
            .as_str()
            .parse::<oci_spec::image::Digest>()
            .expect("digest"),
    );
    layout.tag("hostile", &desc).expect("tag");
    format!("oci:{}:hostile", dir.display())
        .parse()
        .expect("ref")
}

fn assert_empty(dir: &Path, what: &str) {
    let left = left_in(dir);
    assert!(left.is_empty(), "{what} holds {left:?}");
}

fn left_in(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Run one case; every broken expectation is returned, not panicked on.
async fn check(c: &Case) -> Vec<String> {
    let mut failures = Vec::new();
    let mut fail = |m: String| failures.push(format!("{}: {m}", c.name));
    let opts = RegistryOptions::default();
    let work = tempfile::tempdir().expect("tempdir");
    let outside = work.path().join("outside");
    std::fs::create_dir(&outside).expect("canary dir");
    let image = image_of(
        &work.path().join("layout"),
        &compress(&c.tar, c.compression),
        c.compression,
    );
    let repo = Repo::open(&image, &opts).expect("repo");

    // Into the node store.
    let store = Store::open(work.path().join("store")).expect("store");
    match store.ensure(&repo, &c.policy, None).await {
        Ok(_) => fail("accepted by the store".into()),
        Err(Error::Rejected(r)) => {
            if r.rule != c.rule {
                fail(format!("rule {} instead of {}: {r}", r.rule, c.rule));
            }
            if !r.entry.contains(&c.entry) {
                fail(format!("names {:?}, expected {:?}", r.entry, c.entry));
            }
            let message = Error::Rejected(r.clone()).to_string();
            if !message.contains(c.rule.name()) {
                fail(format!("message {message:?} does not name the rule"));
            }
        }
        Err(e) => fail(format!("not a policy rejection: {e}")),
    }
    for dir in ["store/staging", "store/sha256"] {
        let left = left_in(&work.path().join(dir));
        if !left.is_empty() {
            fail(format!("{dir} holds {left:?}"));
        }
    }

    // Into a directory.
    let img = Image::fetch(&repo).await.expect("fetch");
    let out = work.path().join("out/cache");
    let options = UnpackOptions {
        policy: c.policy.clone(),
        no_sync: true,
        progress: None,
    };
    match extract_to_dir(&repo, &img, &out, &options).await {
        Err(Error::Rejected(r)) if r.rule == c.rule => {}
        other => fail(format!("extract_to_dir gave {other:?}")),
    }
    let left = left_in(&work.path().join("out"));
    if !left.is_empty() {
        fail(format!("the output's parent holds {left:?}"));
    }
    let left = left_in(&outside);
    if !left.is_empty() {
        fail(format!("written outside staging: {left:?}"));
    }
    failures
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_corpus_is_rejected() {
    let corpus = corpus();
    assert!(corpus.len() >= 30, "corpus has {} archives", corpus.len());
    let mut failures = Vec::new();
    for c in &corpus {
        failures.extend(check(c).await);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn special_bits_dropped_by_default_and_safe_links_kept() {
    let work = tempfile::tempdir().expect("tempdir");
    let tar = base()
        .entry(format!("{C}/suid").as_bytes(), REG, 0o4755, b"", 1, b"x")
        .entry(format!("{C}/sub/").as_bytes(), DIR, 0o1777, b"", 0, b"")
        .file(&format!("{C}/sub/data"), b"payload")
        .entry(
            format!("{C}/sub/hard").as_bytes(),
            HARD,
            0o644,
            format!("{C}/sub/data").as_bytes(),
            0,
            b"",
        )
        .entry(
            format!("{C}/sub/soft").as_bytes(),
            SYM,
            0o777,
            b"../ok.json",
            0,
            b"",
        )
        .end();
    let image = image_of(
        &work.path().join("layout"),
        &compress(&tar, Compression::Zstd),
        Compression::Zstd,
    );
    let repo = Repo::open(&image, &RegistryOptions::default()).expect("repo");
    let img = Image::fetch(&repo).await.expect("fetch");
    let policy = ExtractPolicy {
        allow_in_tree_links: true,
        ..Default::default()
    };
    let out = work.path().join("out");
    extract_to_dir(
        &repo,
        &img,
        &out,
        &UnpackOptions {
            policy,
            ..Default::default()
        },
    )
    .await
    .expect("extract");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out.join("suid"))
        .expect("suid")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7000, 0, "setuid bit kept: {mode:o}");
    let mode = std::fs::metadata(out.join("sub"))
        .expect("sub")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7000, 0, "sticky bit kept: {mode:o}");
    assert_eq!(
        std::fs::read(out.join("sub/hard")).expect("hard link"),
        b"payload"
    );
    assert_eq!(std::fs::read(out.join("sub/soft")).expect("symlink"), b"{}");

    // By default the same links are refused.
    let out = work.path().join("out2");
    let err = extract_to_dir(&repo, &img, &out, &UnpackOptions::default())
        .await
        .expect_err("links refused");
    assert!(
        matches!(err, Error::Rejected(ref r) if r.rule == Rule::LinkNotAllowed),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_layer_fails_its_digest() {
    let work = tempfile::tempdir().expect("tempdir");
    let blob = compress(&base().end(), Compression::Zstd);
    let image = image_of(&work.path().join("layout"), &blob, Compression::Zstd);
    let layout = Layout::open(work.path().join("layout")).expect("layout");
    let digest = gkm_oci::Digest::of(&blob);
    // Same bytes plus trailing garbage the decompressor skips.
    let mut tampered = blob.clone();
    tampered.extend_from_slice(&[0u8; 64]);
    std::fs::write(layout.blob_path(&digest), &tampered).expect("tamper");
    let repo = Repo::open(&image, &RegistryOptions::default()).expect("repo");
    let store = Store::open(work.path().join("store")).expect("store");
    let err = store
        .ensure(&repo, &ExtractPolicy::default(), None)
        .await
        .expect_err("tampered");
    assert!(
        matches!(err, Error::DigestMismatch { .. } | Error::Rejected(_)),
        "{err}"
    );
    assert!(store.list().expect("list").is_empty());
    assert_empty(&work.path().join("store/staging"), "staging");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layer_longer_than_its_descriptor_is_cut_off() {
    let work = tempfile::tempdir().expect("tempdir");
    let blob = compress(&base().end(), Compression::Gzip);
    let image = image_of(&work.path().join("layout"), &blob, Compression::Gzip);
    // The blob grows past the size its descriptor declares (a source that
    // does not end); reading stops at the declared size.
    let layout = Layout::open(work.path().join("layout")).expect("layout");
    let digest = gkm_oci::Digest::of(&blob);
    let mut longer = blob.clone();
    longer.extend(std::iter::repeat_n(0x5a, 8 << 20));
    std::fs::write(layout.blob_path(&digest), &longer).expect("grow");
    let repo = Repo::open(&image, &RegistryOptions::default()).expect("repo");
    let store = Store::open(work.path().join("store")).expect("store");
    let err = store
        .ensure(&repo, &ExtractPolicy::default(), None)
        .await
        .expect_err("longer than declared");
    assert!(
        err.to_string().contains("longer than its declared"),
        "{err}"
    );
    assert!(store.list().expect("list").is_empty());
    assert_empty(&work.path().join("store/staging"), "staging");
}

/// The memory cases, served by a real registry: refused with their rule
/// before their data is read, nothing left in the store.
#[tokio::test(flavor = "multi_thread")]
async fn memory_hostile_layers_from_a_registry_are_refused() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let opts = RegistryOptions {
        insecure: true,
        ..Default::default()
    };
    let work = tempfile::tempdir().expect("tempdir");
    let store = Store::open(work.path().join("store")).expect("store");
    for (i, c) in memory_cases().into_iter().enumerate() {
        let local = image_of(
            &work.path().join(format!("layout-{i}")),
            &compress(&c.tar, c.compression),
            c.compression,
        );
        let remote: ImageRef = format!("{}/hostile/memory-{i}:v1", registry.addr())
            .parse()
            .expect("ref");
        gkm_oci::copy_image(
            &Repo::open(&local, &opts).expect("open"),
            &Repo::create(&remote, &opts).expect("create"),
            None,
        )
        .await
        .expect("push");
        let repo = Repo::open(&remote, &opts).expect("open");
        match store.ensure(&repo, &c.policy, None).await {
            Err(Error::Rejected(r)) => {
                assert_eq!(r.rule, c.rule, "{}: {r}", c.name);
                assert!(r.entry.contains(&c.entry), "{}: {r}", c.name);
            }
            other => panic!("{}: {other:?}", c.name),
        }
        assert!(store.list().expect("list").is_empty(), "{}", c.name);
        assert_empty(&work.path().join("store/staging"), "staging");
    }
}

/// A registry answering in bad faith on loopback: `/v2/` says yes, and every
/// manifest GET gets `headers` and then bytes without end (chunked, unless
/// `headers` declares a length). Returns its address and how many body bytes
/// it managed to send.
fn endless_manifest_registry(
    headers: &'static str,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let sent = std::sync::Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 2 {
                        line.clear();
                    }
                    if !request_line.contains("/manifests/") {
                        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
                        if stream.write_all(ok.as_bytes()).is_err() {
                            return;
                        }
                        continue;
                    }
                    let chunked = !headers.contains("Content-Length");
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {OCI_MANIFEST}\r\n{}{headers}\r\n",
                        if chunked {
                            "Transfer-Encoding: chunked\r\n"
                        } else {
                            ""
                        }
                    );
                    if stream.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                    let block = vec![b' '; 64 << 10];
                    // Stop at 1 GiB whatever happens, so a broken client
                    // fails this test instead of filling the machine.
                    while counter.load(Ordering::Relaxed) < 1 << 30 {
                        let written = if chunked {
                            stream
                                .write_all(format!("{:x}\r\n", block.len()).as_bytes())
                                .and_then(|_| stream.write_all(&block))
                                .and_then(|_| stream.write_all(b"\r\n"))
                        } else {
                            stream.write_all(&block)
                        };
                        if written.is_err() {
                            return;
                        }
                        counter.fetch_add(block.len() as u64, Ordering::Relaxed);
                    }
                    return;
                }
            });
        }
    });
    (addr, sent)
}

/// A manifest body that never ends, and one declaring 1 GiB, are refused
/// once the 4 MiB a manifest may have is passed: the registry gets to send
/// little more than that before gkm hangs up.
#[tokio::test(flavor = "multi_thread")]
async fn endless_or_huge_manifests_are_refused_at_the_cap() {
    let opts = RegistryOptions {
        insecure: true,
        ..Default::default()
    };
    for (headers, says) in [
        ("", "larger than 4 MiB"),
        (
            "Content-Length: 1073741824\r\n",
            "declares 1073741824 bytes",
        ),
    ] {
        let (addr, sent) = endless_manifest_registry(headers);
        let image: ImageRef = format!("{addr}/hostile/endless:v1").parse().expect("ref");
        let repo = Repo::open(&image, &opts).expect("repo");
        let err = repo.fetch_manifest().await.expect_err("refused");
        assert!(err.to_string().contains(says), "{headers:?}: {err}");
        // Let the server notice the closed connection, then count.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            sent < 64 << 20,
            "{headers:?}: the registry sent {sent} bytes before gkm stopped"
        );
    }
}
