"""Matrix products on a GPU whose collective waits for a late peer (issue 30: the collective
shares the GPU with matrix products).

Under torchrun, one rank per GPU. Each round: a barrier; every rank but 0 sleeps --late-ms,
then calls a --mb MB bf16 all_reduce; rank 0 calls it at once (async_op), then runs --matmuls
bf16 products of --mm x --mm on its own stream while its peers are still away. Rank 0 times the
products with CUDA events and prints their TFLOP/s against the same products alone (no
collective pending), median of --rounds rounds, as one JSON line to --out.json and a summary.
Then --rounds rounds each of the peers arriving while rank 0's products (about three times
--late-ms of them) still run and with its GPU idle: the time from the last peer's call to rank
0's collective being complete (what a late kernel that must first get its SMs pays).

What it shows: where a collective waits for its peers while its GPU computes. NCCL's kernel
spins on its channels' SMs (24 on an H200); railcc's default path waits on the host (the
products are enqueued only after the call returns); with late kernel arguments its kernel is
enqueued at once, its grid spinning on its SMs until the peers come, unless a stream wait
holds it back (RAILCC_GPU_LATE_GATE=1).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--label", default="")
    p.add_argument("--late-ms", type=float, default=100.0)
    p.add_argument("--mb", type=float, default=64.0)
    p.add_argument("--mm", type=int, default=8192)
    p.add_argument("--matmuls", type=int, default=12)
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args()


def products(a, b, n, stream):
    """n products on stream, timed by events: (ms, the events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(n):
            torch.mm(a, b)
        end.record()
    return start, end


def main():
    a = parse()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    x = torch.ones(int(a.mb * (1 << 20)) // 2, dtype=torch.bfloat16, device="cuda")
    m1 = torch.randn(a.mm, a.mm, dtype=torch.bfloat16, device="cuda")
    m2 = torch.randn(a.mm, a.mm, dtype=torch.bfloat16, device="cuda")
    compute = torch.cuda.Stream()
    flop = 2.0 * a.mm**3 * a.matmuls
    for _ in range(3):  # warm both
        dist.all_reduce(x)
        products(m1, m2, 2, compute)
    torch.cuda.synchronize()
    alone, beside, call_us = [], [], []
    for _ in range(a.rounds):
        dist.barrier()
        torch.cuda.synchronize()
        if rank == 0:
            s, e = products(m1, m2, a.matmuls, compute)
            e.synchronize()
            alone.append(s.elapsed_time(e))
        dist.barrier()
        if rank != 0:
            time.sleep(a.late_ms / 1000)
            dist.all_reduce(x)
        else:
            t0 = time.perf_counter()
            work = dist.all_reduce(x, async_op=True)
            call_us.append((time.perf_counter() - t0) * 1e6)
            s, e = products(m1, m2, a.matmuls, compute)
            work.wait()
            e.synchronize()
            beside.append(s.elapsed_time(e))
        torch.cuda.synchronize()
    # Then the peers arrive while rank 0's products still run (busy) or with its GPU idle
    # (quiet): how long after the last peer's call rank 0's collective is complete, as its
    # host sees it (the peers' call times through the store: one host, one clock).
    store = dist.distributed_c10d._get_default_store()
    per_ms = statistics.median(alone) / a.matmuls if rank == 0 else 0.0
    n_busy = max(1, int(3 * a.late_ms / per_ms)) if rank == 0 else 0
    lag = {"busy": [], "quiet": []}
    for k in range(2 * a.rounds):
        how = "busy" if k % 2 == 0 else "quiet"
        dist.barrier()
        torch.cuda.synchronize()
        if rank != 0:
            time.sleep(a.late_ms / 1000)
            t = time.time()
            dist.all_reduce(x)
            store.set(f"late_peer_{k}_{rank}", repr(t))
        else:
            work = dist.all_reduce(x, async_op=True)
            if how == "busy":
                products(m1, m2, n_busy, compute)
            while not work.is_completed():
                pass
            done = time.time()
            last = max(float(store.get(f"late_peer_{k}_{r}")) for r in range(1, world))
            lag[how].append((done - last) * 1e6)
        torch.cuda.synchronize()
    # The data: x was all-reduced (sum) from ones, 3 + 3 x rounds times (powers of 2 in bf16: exact).
    expect = float(world) ** (3 + 3 * a.rounds)
    got = x[0].item() if x.numel() else expect
    ok = abs(got - expect) <= 1e-2 * expect
    if rank == 0:
        med_a, med_b = statistics.median(alone), statistics.median(beside)
        d = {
            "label": a.label,
            "world": world,
            "late_ms": a.late_ms,
            "mb": a.mb,
            "products_alone_ms": med_a,
            "products_beside_ms": med_b,
            "tflops_alone": flop / med_a / 1e9,
            "tflops_beside": flop / med_b / 1e9,
            "slowdown": med_b / med_a,
            "call_return_us": statistics.median(call_us),
            "done_after_last_peer_us_busy": statistics.median(lag["busy"]),
            "done_after_last_peer_us_quiet": statistics.median(lag["quiet"]),
            "all_reduce_ok": ok,
            "rounds": {"alone": alone, "beside": beside, "call_us": call_us, "lag_us": lag},
        }
        with open(a.out + ".json", "a") as f:
            f.write(json.dumps(d) + "\n")
        print(
            f"late_peer: {a.label} world {world} peers {a.late_ms:.0f} ms late: products "
            f"{d['tflops_beside']:.0f} TFLOP/s beside the waiting collective against "
            f"{d['tflops_alone']:.0f} alone ({d['slowdown']:.2f}x the time); the call returned "
            f"after {d['call_return_us']:.0f} us; done {d['done_after_last_peer_us_busy']:.0f} us after the "
            f"last peer's call with products running ({d['done_after_last_peer_us_quiet']:.0f} quiet); "
            f"all_reduce {'ok' if ok else 'WRONG'} "
            f"({got} against {expect})"
        )
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: all_reduce result {got}, expected {expect}")


if __name__ == "__main__":
    main()
