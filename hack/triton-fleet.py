"""Real Triton caches for every GPU target of a 2026 fleet, compiled ahead of
time without a GPU, and a check of whether Triton reuses a cache tree.

    triton-python hack/triton-fleet.py targets
    triton-python hack/triton-fleet.py compile --target cuda/90/32 --cache DIR
    triton-python hack/triton-fleet.py check --target cuda/90/32 --cache DIR ...

`compile` fills DIR (a TRITON_CACHE_DIR) with the kernels below compiled for
one target. `check` runs the same compiles against each --target/--cache pair
in one process and prints a JSON report per pair, a line each: what Triton
had to compile (it wraps the backends' last stage, CUDABackend.make_cubin and
HIPBackend.make_hsaco, which Triton runs only on a miss; a tree reused whole
has "compiled": 0) and the directory it read each kernel from. Run it with
hack/components.sh's Triton ($GKM_TOOLS_DIR/bin/triton-python). Keep the
kernels' lines where they are: their cache keys include them (see below).

The kernels: Triton's vector-add tutorial kernel, and a kernel with an
autotuning space whose every configuration is compiled as Triton's
autotuner compiles each one it benchmarks (its own cache entry per config).
"""

import argparse
import json
import os
import sys

# The cache directory must be set before Triton reads its settings.
if __name__ == "__main__":
    _args = sys.argv[1:]
    if "--cache" in _args:
        os.environ["TRITON_CACHE_DIR"] = os.path.abspath(_args[_args.index("--cache") + 1])

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# The fleet: every target Triton compiles for, and the GPUs that run it.
TARGETS = {
    "cuda/75/32": "NVIDIA T4",
    "cuda/80/32": "NVIDIA A100",
    "cuda/86/32": "NVIDIA A10",
    "cuda/89/32": "NVIDIA L4, L40S",
    "cuda/90/32": "NVIDIA H100, H200",
    "cuda/100/32": "NVIDIA B200, GB200",
    "cuda/103/32": "NVIDIA B300",
    "cuda/120/32": "NVIDIA RTX PRO 6000 Blackwell",
    "hip/gfx90a/64": "AMD MI210, MI250X",
    "hip/gfx942/64": "AMD MI300X, MI325X",
    "hip/gfx950/64": "AMD MI355X",
}


@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """Triton's vector-add tutorial kernel."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x + y, mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 256}, num_warps=2),
        triton.Config({"BLOCK_SIZE": 1024}, num_warps=4),
        triton.Config({"BLOCK_SIZE": 4096}, num_warps=8),
    ],
    key=["n_elements"],
)
@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, output_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    """output = alpha * x + y, with the block size and warps autotuned."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, alpha * x + y, mask=mask)


# What Triton 3.6 keys a kernel by (triton.runtime.cache.get_cache_key): the
# bytes of Triton's own sources and libtriton; the kernel function's source
# text and its starting line number in this file (and those of the functions
# it calls); its signature and constexprs; the target and the backend's tool
# versions (ptxas); the compile options; cache-relevant environment variables.
# Not the path of this file: a copy of it anywhere finds the same entries. So
# moving the kernels above by a line changes every key, and the fixtures must
# be written again (hack/triton-fixtures.sh). Each entry's group file
# (__grp__<kernel>.json) records the absolute path of every file of the kernel
# under the TRITON_CACHE_DIR it was compiled into, and a path that does not
# exist is a miss: a cache is reused only at the directory it was compiled in.


def compiles():
    """Every compile: (label, ASTSource, options), in a fixed order."""
    pointers = {"x_ptr": "*fp32", "y_ptr": "*fp32", "output_ptr": "*fp32"}
    yield (
        "add_kernel BLOCK_SIZE=1024 num_warps=4",
        ASTSource(
            fn=add_kernel,
            signature={**pointers, "n_elements": "i32", "BLOCK_SIZE": "constexpr"},
            constexprs={"BLOCK_SIZE": 1024},
        ),
        {"num_warps": 4},
    )
    for config in scaled_add_kernel.configs:
        label = " ".join(
            ["scaled_add_kernel"]
            + [f"{k}={v}" for k, v in config.kwargs.items()]
            + [f"num_warps={config.num_warps}", f"num_stages={config.num_stages}"]
        )
        yield (
            label,
            ASTSource(
                fn=scaled_add_kernel.fn,
                signature={**pointers, "alpha": "fp32", "n_elements": "i32", "BLOCK_SIZE": "constexpr"},
                constexprs=dict(config.kwargs),
            ),
            {"num_warps": config.num_warps, "num_stages": config.num_stages},
        )


def gpu_target(spec):
    """`cuda/90/32` or `hip/gfx942/64` as Triton's GPUTarget."""
    try:
        backend, arch, warp = spec.split("/")
        return GPUTarget(backend, int(arch) if backend == "cuda" else arch, int(warp))
    except ValueError:
        sys.exit(f"bad target {spec!r}: expected BACKEND/ARCH/WARP_SIZE, one of {', '.join(TARGETS)}")


class FinalStage:
    """Counts the runs of the backends' last compile stage."""

    def __init__(self):
        # Imported here, below the kernels, whose lines must not move.
        from triton.backends.amd.compiler import HIPBackend
        from triton.backends.nvidia.compiler import CUDABackend
        from triton_calls import count_calls

        self.calls = 0
        for cls, name in ((CUDABackend, "make_cubin"), (HIPBackend, "make_hsaco")):
            count_calls(cls, name, self._count)

    def _count(self):
        self.calls += 1


def cache_dirs(kernel):
    """The TRITON_CACHE_DIRs holding the files Triton loaded `kernel` from:
    every file is <cache>/<key>/<name>."""
    return sorted({os.path.dirname(os.path.dirname(p)) for p in kernel.metadata_group.values()})


def run(stage, spec, cache):
    """Compile everything for one target against the cache directory
    `cache`; report what Triton compiled and where it found the rest."""
    target = gpu_target(spec)
    # Triton reads TRITON_CACHE_DIR at every compile, as a workload run
    # with that setting would.
    os.environ["TRITON_CACHE_DIR"] = cache
    kernels = []
    for label, source, options in compiles():
        before = stage.calls
        kernel = triton.compile(source, target=target, options=options)
        kernels.append({
            "kernel": label,
            "hash": kernel.hash,
            "compiled": stage.calls > before,
            "read_from": cache_dirs(kernel),
        })
    return {
        "target": spec,
        "triton": triton.__version__,
        "cache": cache,
        "kernels": kernels,
        "compiled": sum(k["compiled"] for k in kernels),
        "reused": sum(not k["compiled"] for k in kernels),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("targets", help="list the fleet's targets, one a line")
    for name, text in (
        ("compile", "compile the kernels for TARGET into the cache DIR"),
        ("check", "compile against each cache DIR and report, a JSON line each, what was compiled"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--target", required=True, action="append", help="BACKEND/ARCH/WARP_SIZE, e.g. cuda/90/32")
        p.add_argument("--cache", required=True, action="append", help="the TRITON_CACHE_DIR tree of the target before it")
    args = parser.parse_args()
    if args.command == "targets":
        for spec, gpus in TARGETS.items():
            print(f"{spec}\t{gpus}")
        return
    if len(args.target) != len(args.cache) or (args.command == "compile" and len(args.target) != 1):
        sys.exit(f"{args.command}: give one --cache per --target ({'one pair' if args.command == 'compile' else 'in pairs'})")
    caches = [os.path.abspath(c) for c in args.cache]
    for cache in caches:
        if not os.path.isdir(cache):
            sys.exit(f"no cache directory {cache}")
    stage = FinalStage()
    reports = [run(stage, target, cache) for target, cache in zip(args.target, caches)]
    if args.command == "check":
        for report in reports:
            print(json.dumps(report))
    elif reports[0]["reused"]:
        sys.exit(f"{caches[0]} already held {reports[0]['reused']} of the kernels: compile into an empty directory")


if __name__ == "__main__":
    main()
