"""The hostile and legitimate images hack/hostile/extract.sh feeds to
`gkm extract`, as OCI layouts under WORK, SCALE_MIB the size of the large
ones: WORK SCALE_MIB."""
import hashlib, io, json, os, random, sys, zlib

work, scale = sys.argv[1], int(sys.argv[2]) << 20
rng = random.Random(14)
GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
ZST = "application/vnd.oci.image.layer.v1.tar+zstd"

def header(name, kind, size, link=b""):
    h = bytearray(512)
    name = name.encode() if isinstance(name, str) else name
    h[0:len(name[:100])] = name[:100]
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[157:157 + len(link[:100])] = link[:100]
    h[257:265] = b"ustar  \0"
    h[148:156] = b"        "
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)

def pad(n):
    return b"\0" * ((512 - n % 512) % 512)

def noisy(n):
    """n bytes that deflate about 100:1 (under the 200:1 ratio limit)."""
    chunk = bytearray(1 << 20)
    for i in range(0, len(chunk), 90):
        chunk[i] = rng.randrange(256)
    chunk = bytes(chunk)
    while n > 0:
        take = min(n, len(chunk))
        yield chunk[:take]
        n -= take

class Blob:
    """Writes a gzip (or raw) layer blob in streaming fashion, hashing it."""
    def __init__(self, path, gzip=True):
        self.f = open(path, "wb")
        self.z = zlib.compressobj(1, zlib.DEFLATED, 31) if gzip else None
    def write(self, data):
        self.f.write(self.z.compress(data) if self.z else data)
    def close(self):
        if self.z:
            self.f.write(self.z.flush())
        self.f.close()

def layout(name, layer_path, media_type, declared=None, config=None, manifest_pad=0):
    root = os.path.join(work, name)
    blobs = os.path.join(root, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    def put(data_or_path):
        if isinstance(data_or_path, bytes):
            d = hashlib.sha256(data_or_path).hexdigest()
            with open(os.path.join(blobs, d), "wb") as f:
                f.write(data_or_path)
            return d, len(data_or_path)
        h = hashlib.sha256()
        with open(data_or_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        d = h.hexdigest()
        os.rename(data_or_path, os.path.join(blobs, d))
        return d, os.path.getsize(os.path.join(blobs, d))
    if config is None:
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {
            "org.opencontainers.image.title": name}}, "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    cd, cs = put(config)
    ld, ls = put(layer_path)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + cd, "size": cs},
                "layers": [{"mediaType": media_type, "digest": "sha256:" + ld, "size": declared if declared is not None else ls}]}
    if manifest_pad:
        manifest["annotations"] = {"pad": "x" * manifest_pad}
    md, ms = put(json.dumps(manifest).encode())
    with open(os.path.join(root, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                   "digest": "sha256:" + md, "size": ms,
                   "annotations": {"org.opencontainers.image.ref.name": "x"}}]}, f)

def tar_blob(name, entries):
    path = os.path.join(work, name + ".blob")
    b = Blob(path)
    for e in entries:
        b.write(e)
    b.write(b"\0" * 1024)
    b.close()
    return path

def tar_layer(name, entries, media_type=GZ, **kw):
    layout(name, tar_blob(name, entries), media_type, **kw)

def small_blob(name):
    return tar_blob(name, small_cache())

def dirs():
    yield header("io.triton.cache/", b"5", 0)
    yield header("io.triton.manifest/", b"5", 0)

def manifest_entry():
    body = b'{"triton":[]}'
    yield header("io.triton.manifest/manifest.json", b"0", len(body))
    yield body + pad(len(body))

def small_cache():
    yield from dirs()
    for i in range(3):
        body = b"kernel %d\n" % i
        yield header("io.triton.cache/k%d.ptx" % i, b"0", len(body))
        yield body + pad(len(body))
    yield from manifest_entry()

def many_files(n, size):
    yield from dirs()
    for i in range(n):
        yield header("io.triton.cache/d%03d/f%06d.bin" % (i % 100, i), b"0", size)
        yield os.urandom(size) + pad(size)
    yield from manifest_entry()

def big_file(size):
    yield from dirs()
    yield header("io.triton.cache/big.cubin", b"0", size)
    left = size
    while left:
        take = min(left, 1 << 20)
        yield os.urandom(take)
        left -= take
    yield pad(size)
    yield from manifest_entry()

def extension(kind, size):
    yield from dirs()
    if kind == b"x":
        rec_len = len(b"path=") + size + 2  # the space and the newline
        ln = rec_len + 1
        while ln != rec_len + len(str(ln)):
            ln = rec_len + len(str(ln))
        yield header("PaxHeaders/x", b"x", ln)
        yield b"%d path=" % ln
        yield from noisy(size)
        yield b"\n" + pad(ln)
    else:
        yield header("././@LongLink", kind, size)
        yield from noisy(size)
        yield pad(size)
    yield header("io.triton.cache/f", b"0", 0)
    yield from manifest_entry()

def long_paths(n):
    yield from dirs()
    stem = "/".join(("%s" % chr(97 + i)) * 250 for i in range(15))
    for i in range(n):
        name = ("io.triton.cache/%s/%032x" % (stem, rng.getrandbits(128))).encode()
        yield header("././@LongLink", b"L", len(name) + 1)
        yield name + b"\0" + pad(len(name) + 1)
        yield header("x", b"5", 0)
    yield from manifest_entry()

# Legitimate inputs.
tar_layer("legit-small-cache", small_cache())
tar_layer("legit-20k-files-1KiB", many_files(20000, 1024))
tar_layer("legit-one-%dMiB-file" % (scale >> 20), big_file(scale))
# Extension headers that the tar parser would read whole into memory.
tar_layer("pax-header-%dMiB" % (scale >> 20), extension(b"x", scale))
tar_layer("gnu-longname-%dMiB" % (scale >> 20), extension(b"L", scale))
tar_layer("gnu-longlink-%dMiB" % (scale >> 20), extension(b"K", scale))
# Path bookkeeping: 200k paths of ~3.8 KiB.
tar_layer("200k-paths-of-3.8KiB", long_paths(200000))
# A gzip bomb: zeros far beyond the ratio limit.
path = os.path.join(work, "bomb.blob")
b = Blob(path)
b.write(b"".join(dirs()))
b.write(header("io.triton.cache/zeros", b"0", 4 << 30))
for _ in range(4 << 10):
    b.write(b"\0" * (1 << 20))
b.close()
layout("gzip-bomb-4GiB", path, GZ)
# A zstd frame asking for a 2 GiB window (raw blocks follow).
data = b"".join(small_cache()) + b"\0" * 1024
frame = b"\x28\xb5\x2f\xfd" + bytes([0x00, 21 << 3])
for i in range(0, len(data), 1 << 16):
    block = data[i:i + (1 << 16)]
    last = 1 if i + (1 << 16) >= len(data) else 0
    frame += ((len(block) << 3) | last).to_bytes(3, "little") + block
path = os.path.join(work, "window.blob")
open(path, "wb").write(frame)
layout("zstd-window-2GiB", path, ZST)
# A layer blob longer than its descriptor says.
path = small_blob("long")
declared = os.path.getsize(path)
with open(path, "ab") as f:
    for _ in range(256):
        f.write(os.urandom(1 << 20))
layout("layer-256MiB-past-its-size", path, GZ, declared=declared)
# A config blob and a manifest that do not end where a document should.
path = small_blob("ok")
big = json.dumps({"config": {"Labels": {"pad": "x" * (scale)}}}).encode()
layout("config-%dMiB" % (scale >> 20), path, GZ, config=big)
path2 = small_blob("ok2")
layout("manifest-%dMiB" % (scale >> 20), path2, GZ, manifest_pad=scale)
