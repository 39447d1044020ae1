"""torch.distributed on railcc's libnccl.so.2 (issue 7): run under torchrun with 2 processes.

  python3 -m torch.distributed.run --nproc_per_node 2 check.py OUT_PREFIX

Checks all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast and send/recv
against values computed here, then trains a small model with DistributedDataParallel for
STEPS steps and writes rank 0's loss per step to OUT_PREFIX.loss.txt (compare two runs: one
with LD_PRELOAD of railcc's library, one on NCCL). Then trains with FSDP2 (fully_shard) the
same way and writes OUT_PREFIX.fsdp.loss.txt; where fully_shard can't be imported it prints
"SKIP fsdp2: ..." and writes no file. With OVERLAP=1 it also measures whether a 128 MB
all_reduce overlaps with matmuls on another stream (lines "rank R overlap: ...").

Works with one process per GPU where each process sees only its own GPU (CUDA_VISIBLE_DEVICES
per process, LOCAL_RANK 0 everywhere), as in bench/compare/gpu-torch-hosts.sh."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "300"))


def check_collectives(rank, world, dev):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        n = 1000003  # not a multiple of anything
        x = (torch.arange(n, device=dev) % 97 + rank).to(dtype)
        y = x.clone()
        dist.all_reduce(y)
        want = sum((torch.arange(n, device=dev) % 97 + r).to(torch.float64) for r in range(world))
        assert torch.equal(y.to(torch.float64), want.to(dtype).to(torch.float64)) or dtype == torch.bfloat16 and torch.allclose(y.double(), want, rtol=1e-2), f"all_reduce {dtype}"
        g = torch.empty(world * n, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(g, x)
        for r in range(world):
            assert torch.equal(g[r * n:(r + 1) * n], (torch.arange(n, device=dev) % 97 + r).to(dtype)), f"all_gather {dtype}"
        big = torch.cat([(torch.arange(n, device=dev) % 97 + rank + 10 * k).to(dtype) for k in range(world)])
        out = torch.empty(n, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, big)
        want = sum((torch.arange(n, device=dev) % 97 + r + 10 * rank).to(torch.float64) for r in range(world))
        assert torch.allclose(out.double(), want, rtol=1e-2 if dtype == torch.bfloat16 else 0), f"reduce_scatter {dtype}"
        b = x.clone() if rank == 1 else torch.zeros_like(x)
        dist.broadcast(b, src=1)
        assert torch.equal(b, (torch.arange(n, device=dev) % 97 + 1).to(dtype)), f"broadcast {dtype}"
        if rank == 0:
            dist.send(x, dst=1)
        else:
            r = torch.empty_like(x)
            dist.recv(r, src=0)
            assert torch.equal(r, (torch.arange(n, device=dev) % 97).to(dtype)), f"send/recv {dtype}"
    torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, send/recv: ok", flush=True)


def train(rank, world, dev, out):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
    losses = []
    for step in range(STEPS):
        xb = torch.randn(128, 64, generator=gen)
        yb = (xb @ w_true).argmax(dim=1)
        xb, yb = xb.to(dev), yb.to(dev)
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The mean loss over ranks, so the curve is the job's.
        l = loss.detach().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
    if rank == 0:
        with open(out + ".loss.txt", "w") as f:
            f.write("\n".join(f"{v:.7f}" for v in losses) + "\n")
        print(f"rank 0: {STEPS} DDP steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


def import_fully_shard():
    """FSDP2's fully_shard: torch.distributed.fsdp (torch >= 2.6), else the older
    torch.distributed._composable.fsdp. Returns (fully_shard, None) or (None, reason)."""
    errs = []
    try:
        from torch.distributed.fsdp import fully_shard
        return fully_shard, None
    except Exception as e:  # ImportError, or anything its import raises
        errs.append(f"torch.distributed.fsdp: {type(e).__name__}: {e}")
    try:
        from torch.distributed._composable.fsdp import fully_shard
        return fully_shard, None
    except Exception as e:
        errs.append(f"torch.distributed._composable.fsdp: {type(e).__name__}: {e}")
    return None, "; ".join(errs)


def train_fsdp2(rank, world, dev, out):
    """The DDP run's data and seeds on a larger model (64->512->512->10), each Linear and the
    root sharded with FSDP2; rank 0's per-step mean loss goes to OUT_PREFIX.fsdp.loss.txt."""
    fully_shard, why = import_fully_shard()
    if fully_shard is None:
        print(f"rank {rank}: SKIP fsdp2: {why}", flush=True)
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(dev)
    full = sum(p.numel() for p in model.parameters())
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    sharded = sum(1 for p in model.parameters() if hasattr(p, "to_local"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
    losses = []
    for step in range(STEPS):
        xb = torch.randn(128, 64, generator=gen)
        yb = (xb @ w_true).argmax(dim=1)
        xb, yb = xb.to(dev), yb.to(dev)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        l = loss.detach().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
    torch.cuda.synchronize()
    if rank == 0:
        with open(out + ".fsdp.loss.txt", "w") as f:
            f.write("\n".join(f"{v:.7f}" for v in losses) + "\n")
        print(f"rank 0: {STEPS} FSDP2 steps ({sharded} parameters sharded, {local} of {full} values local), "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


def _sync_ranks(dev):
    """Lines the ranks up before a timed run: a tiny all_reduce, waited for on the host."""
    t = torch.ones(1, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()


def overlap(rank, world, dev):
    """Does a 128 MB all_reduce run while matmuls run on another stream? Times (a) the
    all_reduce alone, (b) the matmuls alone, (c) both started together, each the median of 5,
    and how long dist.all_reduce(async_op=True) took to return to Python."""
    reps = 5
    n = 32 * 1024 * 1024  # 128 MB of float32
    want = world * (world + 1) / 2
    x = torch.empty(n, dtype=torch.float32, device=dev)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    c = torch.empty(8192, 8192, dtype=torch.bfloat16, device=dev)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()

    def check(what):
        ok = bool(torch.all(x == want).item())
        assert ok, f"overlap: all_reduce ({what}) wrong: want {want} everywhere, got min {x.min().item()} max {x.max().item()}"

    def matmuls(k):
        with torch.cuda.stream(s):
            for _ in range(k):
                torch.mm(a, b, out=c)

    # Warm-up: both paths, and the check on the result.
    for _ in range(2):
        x.fill_(rank + 1)
        _sync_ranks(dev)
        dist.all_reduce(x, async_op=True).wait()
        torch.cuda.synchronize()
        check("warm-up")
    matmuls(3)
    torch.cuda.synchronize()

    # (a) all_reduce alone.
    t_ar = []
    for _ in range(reps):
        x.fill_(rank + 1)
        _sync_ranks(dev)
        t0 = time.perf_counter()
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        torch.cuda.synchronize()
        t_ar.append((time.perf_counter() - t0) * 1e3)
        check("alone")
    ar_ms = statistics.median(t_ar)

    # Calibrate: enough matmuls to take about as long as the all_reduce.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    matmuls(10)
    torch.cuda.synchronize()
    one_ms = (time.perf_counter() - t0) * 1e3 / 10
    k = max(1, min(5000, round(ar_ms / one_ms)))

    # (b) matmuls alone.
    t_mm = []
    for _ in range(reps):
        _sync_ranks(dev)
        t0 = time.perf_counter()
        matmuls(k)
        torch.cuda.synchronize()
        t_mm.append((time.perf_counter() - t0) * 1e3)
    mm_ms = statistics.median(t_mm)

    # (c) both: the all_reduce first (async), then at once the matmuls on stream s.
    t_both, t_call = [], []
    for _ in range(reps):
        x.fill_(rank + 1)
        _sync_ranks(dev)
        t0 = time.perf_counter()
        w = dist.all_reduce(x, async_op=True)
        t_call.append((time.perf_counter() - t0) * 1e6)
        matmuls(k)
        w.wait()
        torch.cuda.synchronize()
        t_both.append((time.perf_counter() - t0) * 1e3)
        check("with matmuls")
    both_ms = statistics.median(t_both)
    call_us = statistics.median(t_call)
    verdict = "yes" if both_ms < 0.8 * (ar_ms + mm_ms) else "no"
    print(f"rank {rank} overlap: all_reduce 128MB alone {ar_ms:.2f} ms, matmuls alone {mm_ms:.2f} ms "
          f"({k} x 8192^3 bf16, one {one_ms:.3f} ms), both {both_ms:.2f} ms (sum {ar_ms + mm_ms:.2f} ms), "
          f"all_reduce call returned in {call_us:.0f} us (median); overlap: {verdict}", flush=True)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL version seen by torch: {torch.cuda.nccl.version()}", flush=True)
    check_collectives(rank, world, dev)
    train(rank, world, dev, sys.argv[1])
    train_fsdp2(rank, world, dev, sys.argv[1])
    if os.environ.get("OVERLAP") == "1":
        overlap(rank, world, dev)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
