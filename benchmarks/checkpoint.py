"""What a checkpoint costs the outer step, written synchronously against in the background
(``loop.async_checkpoint``), for a teacher state of a chosen size; JSON out.

    python benchmarks/checkpoint.py --out benchmarks/results/checkpoint.json      # CPU, ~1 min

The teacher state is a random Llama's trainer state as ``RLOOTrainer.state_dict`` lays it out
(trainable weights, AdamW's two moments after one step, schedule): the paper's 3B teacher's is ~19 GB
(fp32 moments). Each mode writes it ``--repeats`` times through the loop's own pieces
(``RunDir.checkpoint``, ``LoopState.save``, ``state.Background``, ``state.on_cpu``) and records the
seconds the step waits: sync, the whole write; async, handing it to the thread (the write then
overlaps the next step, which waits only if its sampling and students take less than the write).
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
    ap.add_argument("--out", default="benchmarks/results/checkpoint.json")
    args = ap.parse_args(argv)

    import torch

    import soar
    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.run import RunDir
    from soar.state import Background, LoopState, on_cpu

    model = build_tiny_llama(build_char_tokenizer(), hidden=args.hidden, layers=args.layers, heads=args.hidden // 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = {"trainable": {k: v.detach().clone() for k, v in model.named_parameters()},
             "optimizer": optimizer.state_dict(), "scheduler": {}, "step": 1, "version": 1}
    gb = sum(t.numel() * t.element_size() for t in [*state["trainable"].values(),
                                                    *(x for s in optimizer.state.values() for x in s.values()
                                                      if torch.is_tensor(x))]) / 2**30
    result = {"benchmark": "checkpoint", "machine": {"platform": platform.platform(), "torch": torch.__version__},
              "state_gb": gb, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="checkpoint_bench_") as tmp:
        cfg = soar.compose(["experiment=arith_micro", f"run.dir={tmp}/run", "model.path=/tmp"])
        run = RunDir(cfg, "train")
        step = 0
        for mode in ("sync", "async"):
            writer, waited, written = Background(mode == "async", "bench"), [], []

            def write(st, teacher_state, into=written):
                t0 = time.perf_counter()
                with run.checkpoint(st.step) as ckpt:
                    st.save(ckpt, teacher_state)
                into.append(time.perf_counter() - t0)

            for _ in range(args.repeats):
                step += 1
                writer.wait()  # the next step's wait: here none is left to overlap, so it is counted apart
                t0 = time.perf_counter()
                teacher_state = {**state, "trainable": on_cpu(state["trainable"])} if writer.threaded else state
                writer.submit(write, LoopState(step=step), teacher_state)
                waited.append(time.perf_counter() - t0)
            writer.close()
            result[mode] = {"step_waits_s": waited, "write_s": written, "median_wait_s": statistics.median(waited),
                            "median_write_s": statistics.median(written)}
        run.close()
    result["async_over_sync_wait"] = result["async"]["median_wait_s"] / result["sync"]["median_wait_s"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
