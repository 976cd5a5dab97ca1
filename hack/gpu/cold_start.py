"""A Triton workload's start on a real GPU: the kernels it JIT-compiles and
autotunes before its first results, run against whatever TRITON_CACHE_DIR
holds (empty: a cold start; a tree gkm delivered: a warm one).

    TRITON_CACHE_DIR=DIR python3 hack/gpu/cold_start.py > run.json

The workload, written after Triton's tutorials: a vector add, a fused
row-wise softmax, a layer norm, and a matrix multiplication whose tile
sizes are autotuned over eight configurations, once plain and once with a
fused leaky-ReLU (each configuration of each is its own compiled kernel).
The autotuner keeps its results in the cache (`cache_results=True`, what
TRITON_CACHE_AUTOTUNING=1 sets for every kernel), so a delivered tree
spares the benchmarking as well as the compiling.

Prints one JSON object:
- `seconds`: from the first launch to the last result on the host
  (compiling, autotuning, launching, running); `setup_seconds`: importing
  PyTorch and Triton, starting CUDA and making the inputs, before that;
- `compiled`: runs of the backend's last compile stage (`make_cubin`),
  which Triton reaches only on a cache miss; `host_modules_built`: the
  launcher and driver libraries Triton had to build with the C compiler;
  `autotune_benchmarks`: configurations the autotuner timed;
- `outputs`: the sha256 of each output's bytes, to compare runs, and
  `max_abs_error` against PyTorch's own result.
"""

import hashlib
import json
import os
import sys
import time

_started = time.perf_counter()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.build  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from triton_calls import count_calls  # noqa: E402

COUNTS = {"compiled": 0, "host_modules_built": 0, "autotune_benchmarks": 0}


def counter(name):
    """A function adding one to COUNTS[name]."""
    def count():
        COUNTS[name] += 1
    return count


count_calls(CUDABackend, "make_cubin", counter("compiled"))
count_calls(triton.runtime.build, "_build", counter("host_modules_built"))
count_calls(Autotuner, "_bench", counter("autotune_benchmarks"))


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


@triton.jit
def layer_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(y_ptr + row * stride + cols, (centred * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


def matmul_configs():
    """Eight tile shapes, as Triton's matmul tutorial tries on Hopper."""
    shapes = [
        (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
    ]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=stages, num_warps=warps)
        for m, n, k, stages, warps in shapes
    ]


@triton.autotune(configs=matmul_configs(), key=["M", "N", "K", "LEAKY_RELU"], cache_results=True)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  LEAKY_RELU: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if LEAKY_RELU:
        acc = tl.where(acc >= 0, acc, 0.01 * acc)
    c = acc.to(tl.float16)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, c, mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a, b, leaky_relu):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                        LEAKY_RELU=leaky_relu)
    return c


def workload(inputs):
    """Every kernel once, as a workload's first requests would run them."""
    x, y, rows, w, b, a, m = inputs
    added = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, added, x.numel(), BLOCK=1024)
    soft = torch.empty_like(rows)
    block = triton.next_power_of_2(rows.shape[1])
    softmax_kernel[(rows.shape[0],)](soft, rows, rows.stride(0), rows.shape[1], BLOCK=block, num_warps=8)
    normed = torch.empty_like(rows)
    layer_norm_kernel[(rows.shape[0],)](rows, normed, w, b, rows.stride(0), rows.shape[1], 1e-5, BLOCK=block,
                                        num_warps=8)
    out = {"vector_add": added, "softmax": soft, "layer_norm": normed,
           "matmul": matmul(a, m, False), "matmul_leaky_relu": matmul(a, m, True)}
    torch.cuda.synchronize()
    return out


def references(inputs):
    """PyTorch's results for the same inputs."""
    x, y, rows, w, b, a, m = inputs
    product = a.float() @ m.float()
    return {"vector_add": x + y, "softmax": torch.softmax(rows, dim=1),
            "layer_norm": torch.nn.functional.layer_norm(rows, (rows.shape[1],), w, b, 1e-5),
            "matmul": product.half(), "matmul_leaky_relu": torch.nn.functional.leaky_relu(product, 0.01).half()}


def main():
    torch.manual_seed(0)
    dev = "cuda"
    inputs = (
        torch.rand(1 << 20, device=dev), torch.rand(1 << 20, device=dev),
        torch.randn(4096, 3000, device=dev), torch.rand(3000, device=dev), torch.rand(3000, device=dev),
        torch.randn(2048, 2048, device=dev, dtype=torch.float16), torch.randn(2048, 2048, device=dev, dtype=torch.float16),
    )
    torch.cuda.synchronize()
    setup = time.perf_counter() - _started
    start = time.perf_counter()
    out = workload(inputs)
    seconds = time.perf_counter() - start
    want = references(inputs)
    print(json.dumps({
        "seconds": round(seconds, 3),
        "setup_seconds": round(setup, 3),
        **COUNTS,
        "outputs": {name: hashlib.sha256(got.cpu().numpy().tobytes()).hexdigest() for name, got in out.items()},
        "max_abs_error": {name: (got.float() - want[name].float()).abs().max().item() for name, got in out.items()},
        "matmul_config": str(matmul_kernel.best_config),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "cache_dir": os.environ.get("TRITON_CACHE_DIR"),
    }))


if __name__ == "__main__":
    main()
