"""Starts a real vLLM engine on a model directory and reports its start-up.

    vllm-python hack/vllm/engine_start.py --model DIR --cache-root DIR [--tokens N]

The model directory holds a hand-written ``config.json`` only
(hack/fixtures/vllm-models/<arch>/): the engine loads seeded dummy weights
(``load_format="dummy"``) and no tokenizer, so it needs no hub. It generates
``--tokens`` tokens greedily from fixed prompt token ids and prints one JSON
line on standard output:

- ``init_engine_s``: vLLM's own figure, from its log line "init engine
  (profile, create kv cache, warmup model) took X seconds";
- ``engine_wall_s``: the wall time of the engine's construction (``LLM(...)``);
- ``torch_compile_s``: vLLM's "torch.compile took X s in total", logged in
  its ``VLLM_COMPILE`` mode only (a GPU; null on the CPU, whose mode is
  ``DYNAMO_TRACE_ONCE``);
- ``output_token_ids``: the generated token ids, one list per prompt;
- ``counters``: torch's own compile counters (``torch._dynamo.utils.counters``)
  in the engine, which runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
  ``aot_autograd`` (``autograd_cache_hit``/``miss``/``saved``), ``inductor``
  (pattern matcher counts; no FX graph cache counts, which vLLM's
  ``standalone_compile`` path does not make) and ``stats``;
- ``vllm_counters``: vLLM's own compile counters
  (``vllm.compilation.counter``, non-zero ones: ``num_aot_compiles``,
  ``num_aot_artifacts_saved``/``loaded``, ``num_inductor_compiles``…);
- ``cpp_kernels_built``: how many C++ kernels Inductor compiled (its
  ``CppBuilder.build`` calls that made a shared object under the cache,
  counted in this process), and every build's target under ``cpp_builds``;
- ``aot_compile``: what vLLM's log lines say of its saved AOT compiled
  model (``saved``, ``loaded``, ``load_failed``: traced and compiled again
  after failing to load it), and the lines that speak of compiling or
  caches under ``log_lines``.

All logging goes to standard error. The engine and its compile cache follow
the environment: ``VLLM_CACHE_ROOT`` is set to ``--cache-root``.
"""

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import time

PROMPTS = [[1, 17, 42, 99, 123, 7], [1, 250, 3, 3, 400]]

# Log lines that tell what the compile did, by what they mean.
PATTERNS = {
    "init_engine_s": re.compile(r"init engine .* took ([0-9.]+) s"),
    "torch_compile_s": re.compile(r"torch\.compile took ([0-9.]+) s in total"),
}
# Lines kept for the report: whatever speaks of compiling or caches.
KEEP = re.compile(
    r"compil|cache|graph|AOT|aot|inductor|Inductor|dynamo|Dynamo|init engine",
)


# vLLM's line when it loads a saved AOT compiled model instead of tracing.
LOADED = re.compile(r"Directly load AOT compilation")


def is_kernel(target):
    """Whether a C++ build is a kernel: a shared object Inductor loads.
    Its other builds (the preprocessed header ``header.i``, the vector ISA
    probe) happen in every process whatever its cache holds."""
    return str(target).endswith(".so") and "inductor_cache" in str(target)


class Tee:
    """Standard error that also keeps every line written to it: vLLM's log
    handler writes to the ``sys.stderr`` of the time it is configured."""

    def __init__(self, stream):
        self.stream = stream
        self.text = []

    def write(self, data):
        self.text.append(data)
        return self.stream.write(data)

    def flush(self):
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def lines(self):
        return "".join(self.text).splitlines()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory (config.json)")
    parser.add_argument("--cache-root", required=True, help="VLLM_CACHE_ROOT")
    parser.add_argument("--tokens", type=int, default=8, help="tokens to generate")
    args = parser.parse_args()
    config = os.path.join(args.model, "config.json")
    if not os.path.isfile(config):
        parser.error(f"--model {args.model}: no config.json there")
    if args.tokens < 1:
        parser.error(f"--tokens {args.tokens}: must be at least 1")
    return args


def main():
    args = parse_args()
    os.environ["VLLM_CACHE_ROOT"] = os.path.abspath(args.cache_root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")

    tee = Tee(sys.stderr)
    sys.stderr = tee
    logging.basicConfig(stream=tee, level=logging.INFO)

    import torch._inductor.cpp_builder as cpp_builder
    from torch._dynamo.utils import counters

    builds = []
    original_build = cpp_builder.CppBuilder.build

    def counting_build(self, *a, **kw):
        builds.append(self.get_target_file_path())
        return original_build(self, *a, **kw)

    cpp_builder.CppBuilder.build = counting_build

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.compilation.counter import compilation_counter

    start = time.monotonic()
    llm = LLM(
        model=args.model,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=128,
        max_num_seqs=4,
        seed=0,
        enforce_eager=False,
    )
    engine_wall_s = time.monotonic() - start

    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids in PROMPTS], params, use_tqdm=False
    )
    tokens = [list(o.outputs[0].token_ids) for o in outputs]

    report = {
        "vllm_version": vllm.__version__,
        "engine_wall_s": round(engine_wall_s, 3),
        "output_token_ids": tokens,
        "counters": {
            k: dict(counters[k]) for k in ("inductor", "aot_autograd", "stats") if k in counters
        },
        # vLLM's own compile counters (vllm.compilation.counter).
        "vllm_counters": {
            k: v for k, v in dataclasses.asdict(compilation_counter).items() if v
        },
        "cpp_kernels_built": len([b for b in builds if is_kernel(b)]),
        "cpp_builds": [str(b) for b in builds],
    }
    lines = tee.lines()
    for key, pattern in PATTERNS.items():
        found = [float(m.group(1)) for m in map(pattern.search, lines) if m]
        report[key] = found[-1] if found else None
    report["aot_compile"] = {
        "saved": any("saved AOT compiled function" in line for line in lines),
        "load_failed": any("due to a load failure" in line for line in lines),
        "loaded": any(LOADED.search(line) for line in lines),
    }
    report["log_lines"] = [line for line in lines if KEEP.search(line) and "filelock" not in line]
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
