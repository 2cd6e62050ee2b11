"""Verify cost over a plain step on a GPU (--out JSON; benchmarks/results/gpu_*_cost_h200.json).

The ``r`` of the SUFFIX draft gate. The draft gate (``sglang_spec_ext/suffix/gate.py``)
verifies a SUFFIX step only where the batch's expected accepted draft tokens exceed
``bs * r``, ``r = t_verify(W) / t_plain - 1``. On the served path it measures ``r``; until
then it assumes ``SGLANG_SPEC_EXT_DRAFT_GATE_COST``. This script measures ``r`` for a dense
decoder's step on the GPU at hand, without SGLang (not installable on the lent GPU
machines): an 8B-shaped Llama step (GQA attention over a KV cache of ``--context`` tokens
per request with ``torch.nn.functional.scaled_dot_product_attention``, the four projection
GEMMs, RMSNorm, the LM head), bf16, random weights, each (batch size, tokens per request)
captured in one CUDA graph and replayed, as a server's decode and verify graphs are. What it
leaves out: sampling, the verify tree mask (the step's tokens attend to each other unmasked:
the same work), the scheduler. A proxy of the forward's cost shape, not a served
measurement.

    python benchmarks/gpu_verify_cost.py [--layers 32] [--context 2048] --out results.json
    python benchmarks/gpu_verify_cost.py --mtp --out results.json   # + MTP forward cost
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch
import torch.nn.functional as F

MAX_WIDTH = 32
SHAPE_8B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
            "intermediate": 14336, "vocab": 128256}  # fmt: skip


class Step:
    """One decoder step for ``bs`` requests of ``n`` new tokens each over a fixed cache."""

    def __init__(self, layers: int, context: int, bs_max: int, dev: str) -> None:
        s = SHAPE_8B
        h, d = s["hidden"], s["head_dim"]
        q_dim, kv_dim = s["heads"] * d, s["kv_heads"] * d
        g = torch.Generator(device=dev).manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device=dev) * 0.02).to(torch.bfloat16)

        self.layers = [
            {"qkv": w(h, q_dim + 2 * kv_dim), "o": w(q_dim, h),
             "gate_up": w(h, 2 * s["intermediate"]), "down": w(s["intermediate"], h)}
            for _ in range(layers)
        ]  # fmt: skip
        self.lm_head = w(h, s["vocab"])
        # the cache and room for the step's tokens, written in place as a server does
        shape = (bs_max, s["kv_heads"], context + MAX_WIDTH, d)
        self.k = [w(*shape) for _ in range(layers)]
        self.v = [w(*shape) for _ in range(layers)]
        self.s, self.q_dim, self.kv_dim, self.context = s, q_dim, kv_dim, context

    def __call__(self, x: torch.Tensor, bs: int, n: int) -> torch.Tensor:
        s, d = self.s, self.s["head_dim"]
        for i, layer in enumerate(self.layers):
            y = F.rms_norm(x, (s["hidden"],))
            qkv = y @ layer["qkv"]
            q = qkv[:, : self.q_dim].view(bs, n, s["heads"], d).transpose(1, 2)
            k_new = qkv[:, self.q_dim : self.q_dim + self.kv_dim]
            k_new = k_new.view(bs, n, s["kv_heads"], d).transpose(1, 2)
            v_new = qkv[:, self.q_dim + self.kv_dim :].view(bs, n, s["kv_heads"], d).transpose(1, 2)
            ctx = self.context + n
            self.k[i][:bs, :, self.context : ctx] = k_new
            self.v[i][:bs, :, self.context : ctx] = v_new
            k, v = self.k[i][:bs, :, :ctx], self.v[i][:bs, :, :ctx]
            # no mask: the step's tokens all see each other and the cache (a tree mask's
            # work); the query heads of one KV head go as one head of groups * n queries,
            # as decode kernels do with GQA, so K and V are read once (the flash kernel)
            groups = s["heads"] // s["kv_heads"]
            q = q.reshape(bs, s["kv_heads"], groups * n, d)
            a = F.scaled_dot_product_attention(q, k, v).view(bs, s["heads"], n, d)
            x = x + a.transpose(1, 2).reshape(bs * n, self.q_dim) @ layer["o"]
            y = F.rms_norm(x, (s["hidden"],))
            gu = y @ layer["gate_up"]
            gate, up = gu.chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        return F.rms_norm(x, (s["hidden"],)) @ self.lm_head


class MTPForward:
    """One MTP draft forward (MiMo / DeepSeek-V3 shape): ``input_proj`` over the target's
    hidden state and the next token's embedding (``[2H, H]``), one decoder layer of the
    target's shape with its own KV cache of ``context`` tokens, and the target's
    full-vocabulary LM head; one token per request, as a chain step runs it."""

    def __init__(self, context: int, bs_max: int, dev: str) -> None:
        self.layer = Step(1, context, bs_max, dev)
        self.s = self.layer.s
        g = torch.Generator(device=dev).manual_seed(1)
        h = self.s["hidden"]
        self.input_proj = (torch.randn(2 * h, h, generator=g, device=dev) * 0.02).to(torch.bfloat16)

    def __call__(self, x: torch.Tensor, bs: int, n: int) -> torch.Tensor:
        h = self.s["hidden"]
        # normed hidden state and a stand-in for the next token's embedding (a gather of
        # one row per request: no cost worth modelling), concatenated as MiMo's MTP does
        both = torch.cat([F.rms_norm(x, (h,)), F.rms_norm(x.flip(0), (h,))], dim=-1)
        return self.layer(both @ self.input_proj, bs, n)


def time_graph(step: Step | MTPForward, bs: int, n: int, iters: int) -> float:
    x = torch.randn(bs * n, step.s["hidden"], device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(x, bs, n)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(x, bs, n)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) / iters / 1000.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch-sizes", default="1,4,16,64,256")
    ap.add_argument("--widths", default="1,4,8,16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="gpu_verify_cost.json")
    ap.add_argument(
        "--mtp",
        action="store_true",
        help="also time one MTP draft forward per batch size (mtp_over_plain: its time over "
        "the plain step's), to check the controller's llama3-8b-h100-mtp prior",
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark measures a GPU (skipped)")
        return 0
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    if max(widths) > MAX_WIDTH:
        raise SystemExit(f"--widths: at most {MAX_WIDTH} tokens per request")
    t0 = time.time()
    step = Step(args.layers, args.context, max(sizes), "cuda")
    mtp = MTPForward(args.context, max(sizes), "cuda") if args.mtp else None
    rows, mtp_rows = [], []
    with torch.inference_mode():
        for bs in sizes:
            plain = time_graph(step, bs, 1, args.iters)
            if mtp is not None:
                t = time_graph(mtp, bs, 1, args.iters)
                mtp_rows.append({"bs": bs, "plain_ms": round(plain * 1e3, 3),
                                 "mtp_ms": round(t * 1e3, 3),
                                 "mtp_over_plain": round(t / plain, 4)})  # fmt: skip
                print(f"bs={bs:>4} MTP forward {t * 1e3:8.3f} ms = {t / plain:.3f} x plain",
                      flush=True)  # fmt: skip
            for width in widths:
                t = plain if width == 1 else time_graph(step, bs, width, args.iters)
                rows.append({"bs": bs, "width": width, "step_ms": round(t * 1e3, 3),
                             "r": round(t / plain - 1.0, 4)})  # fmt: skip
                print(f"bs={bs:>4} width={width:>3} step {t * 1e3:8.3f} ms  r={t / plain - 1:.3f}",
                      flush=True)  # fmt: skip
    report = {
        "what": "verify-step extra cost r = t(width) / t(1) - 1 of an 8B-shaped dense decoder "
        "step (GEMMs, SDPA over a KV cache, LM head; bf16, random weights), one CUDA graph per "
        "(batch size, width), replayed; a proxy of the forward's cost shape, not a served "
        "SGLang measurement (no sampling, scheduler, tree mask or KV write)",
        "machine": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },  # fmt: skip
        "parameters": {
            "layers": args.layers,
            "context": args.context,
            "shape": SHAPE_8B,
            "iters": args.iters,
        },  # fmt: skip
        "rows": rows,
        "mtp_rows": mtp_rows,
        "wall_s": round(time.time() - t0, 1),
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"{'bs':>5}" + "".join(f"{'r@W=' + str(w):>10}" for w in widths if w > 1))
    for bs in sizes:
        rs = [r["r"] for r in rows if r["bs"] == bs and r["width"] > 1]
        print(f"{bs:>5}" + "".join(f"{r:>10.3f}" for r in rs))
    if mtp_rows:
        print(f"{'bs':>5}{'MTP fwd / plain step':>22}")
        for r in mtp_rows:
            print(f"{r['bs']:>5}{r['mtp_over_plain']:>22.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
