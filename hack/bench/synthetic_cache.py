"""A synthetic Triton-like cache for hack/bench/extract.sh: ROOT SIZE_MIB FILES.

Kernel directories of seven files each (PTX-like text compresses ~4x,
cubin-like binary ~1.5x), SIZE_MIB in about FILES files, the same every
run (seeded).
"""
import base64, hashlib, json, os, random, sys
root, size_mib, nfiles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(42)
per_kernel = 7
kernels = max(1, nfiles // per_kernel)
avg = size_mib * (1 << 20) // (kernels * 5)  # five bulky files per kernel
# Pools sliced per file: PTX-like text compresses ~4x, cubin-like binary ~1.5x.
ops = ["ld.global.f32", "st.global.f32", "add.f32", "mul.rn.f32", "fma.rn.f32", "mov.u32",
       "setp.lt.s32", "bra.uni", "cvt.rn.f32.s32", "shl.b32", "mad.lo.s32", "bar.sync"]
lines, total = [], 0
while total < 32 << 20:
    op = rng.choice(ops)
    line = f"\t{op} \t%r{rng.randrange(4096)}, [%rd{rng.randrange(512)}+{rng.randrange(1 << 16)}];\n"
    lines.append(line)
    total += len(line)
text = "".join(lines).encode()
binary = bytearray()
while len(binary) < 32 << 20:
    binary += rng.randbytes(96) + bytes([rng.randrange(4)]) * 160
binary = bytes(binary)
def piece(pool, n):
    start = rng.randrange(len(pool) - n - 1)
    return pool[start:start + n]
os.makedirs(root)
for k in range(kernels):
    key = base64.b32encode(hashlib.sha256(b"key%d" % k).digest()).decode().rstrip("=")
    d = os.path.join(root, key)
    os.mkdir(d)
    name = f"kernel_{k}"
    h = hashlib.sha256(name.encode()).hexdigest()
    meta = {"hash": h, "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "num_warps": 4,
            "num_ctas": 1, "num_stages": 3, "ptx_version": 84, "debug": False, "backend_name": "cuda",
            "triton_version": "3.3.0", "shared": 0, "name": name}
    files = {f"{name}.json": json.dumps(meta).encode()}
    sizes = [max(64, int(rng.expovariate(1 / avg))) for _ in range(5)]
    files[f"{name}.cubin"] = piece(binary, min(sizes[0], 8 << 20))
    for ext, n in zip(["ptx", "llir", "ttir", "ttgir"], sizes[1:]):
        files[f"{name}.{ext}"] = b"//\n.version 8.4\n.target sm_90a\n" + piece(text, min(n, 8 << 20))
    files[f"__grp__{name}.json"] = json.dumps(
        {"child_paths": {f: os.path.join(d, f) for f in files}}).encode()
    for f, b in files.items():
        with open(os.path.join(d, f), "wb") as out:
            out.write(b)
