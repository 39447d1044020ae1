"""Collectives through torch.distributed under one of PyTorch's allocators (issue 29 item 1),
run by alloc.sh with torchrun, 2 or more ranks, one GPU each (PYTORCH_CUDA_ALLOC_CONF picks the
allocator; TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 registers every segment).

At 4 KB, 4 MB and 256 MB (ALLOC_SIZES picks others): all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast,
all_to_all_single and a batch_isend_irecv ring, every element checked against values computed
on the host. Then the time of all_reduce at each size (median of ALLOC_ITERS, default 20,
after 5 warm-ups; each timed call alone between two events, so the host's work for the call
is in it), as
"alloc.py: all_reduce <bytes> B: <us> us, busbw <GB/s>",
and back to back as nccl-tests times (20 calls between two events, the median of 5 such),
"alloc.py: all_reduce <bytes> B back to back: <us> us a call, busbw <GB/s>".
Last line on each rank: "alloc.py: rank R: N checks ok, M failed"; exit status 1 if any failed.
"""
import os
import sys

import torch
import torch.distributed as dist

OK, FAILED = 0, 0


def say(line):
    # One write per line: the ranks share the log, and print() writes the newline apart.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(name, got, want):
    global OK, FAILED
    bad = (got != want).sum().item()
    if bad:
        FAILED += 1
        say(f"alloc.py: rank {dist.get_rank()}: {name}: {bad} wrong")
    else:
        OK += 1


def values(n, rank, salt, dev):
    return ((torch.arange(n, device=dev) + salt) % 7 + rank + 1).float()


def collectives(nbytes, rank, world, dev):
    n = nbytes // 4
    tag = f"{nbytes} B"
    x = values(n, rank, 0, dev)
    y = x.clone()
    dist.all_reduce(y)
    check(f"all_reduce {tag}", y, sum(values(n, r, 0, dev) for r in range(world)))
    part = n // world
    g = torch.empty(part * world, device=dev)
    dist.all_gather_into_tensor(g, values(part, rank, 1, dev))
    check(f"all_gather {tag}", g, torch.cat([values(part, r, 1, dev) for r in range(world)]))
    s = torch.empty(part, device=dev)
    dist.reduce_scatter_tensor(s, values(part * world, rank, 2, dev))
    want = sum(values(part * world, r, 2, dev) for r in range(world))[rank * part:(rank + 1) * part]
    check(f"reduce_scatter {tag}", s, want)
    b = values(n, rank, 3, dev)
    dist.broadcast(b, src=world - 1)
    check(f"broadcast {tag}", b, values(n, world - 1, 3, dev))
    a = torch.empty(part * world, device=dev)
    # Rank r's block j goes to rank j: value r * 100 + j there.
    src = torch.cat([torch.full((part,), float(rank * 100 + j), device=dev) for j in range(world)])
    dist.all_to_all_single(a, src)
    check(f"all_to_all {tag}", a, torch.cat([torch.full((part,), float(j * 100 + rank), device=dev) for j in range(world)]))
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    r = torch.empty(n, device=dev)
    for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, r, prv)]):
        q.wait()
    check(f"batch_isend_irecv {tag}", r, values(n, prv, 0, dev))
    torch.cuda.synchronize()


def timing(nbytes, world, dev):
    x = torch.ones(nbytes // 4, device=dev)
    for _ in range(5):
        dist.all_reduce(x)
    ts = []
    for _ in range(int(os.environ.get("ALLOC_ITERS", "20"))):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dist.all_reduce(x)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    us = sorted(ts)[len(ts) // 2]
    busbw = nbytes / (us * 1e-6) * 2 * (world - 1) / world / 1e9
    # Back to back: the host runs ahead of the GPU, so a call's host time hides behind the
    # GPU's work unless it is longer.
    runs = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            dist.all_reduce(x)
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) * 1e3 / 20)
    us2 = sorted(runs)[len(runs) // 2]
    busbw2 = nbytes / (us2 * 1e-6) * 2 * (world - 1) / world / 1e9
    return us, busbw, us2, busbw2


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")
        hook = os.environ.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "0")
        say(f"alloc.py: torch {torch.__version__}, allocator {conf}, register hook {hook}")
    # ALLOC_SIZES (bytes, space-separated) narrows a run to some sizes, e.g. to trace one.
    sizes = [int(s) for s in os.environ.get("ALLOC_SIZES", f"{4 << 10} {4 << 20} {256 << 20}").split()]
    for nbytes in sizes:
        collectives(nbytes, rank, world, dev)
    for nbytes in sizes:
        us, busbw, us2, busbw2 = timing(nbytes, world, dev)
        if rank == 0:
            say(f"alloc.py: all_reduce {nbytes} B: {us:.1f} us, busbw {busbw:.1f} GB/s")
            say(f"alloc.py: all_reduce {nbytes} B back to back: {us2:.1f} us a call, busbw {busbw2:.1f} GB/s")
    say(f"alloc.py: rank {rank}: {OK} checks ok, {FAILED} failed")
    dist.destroy_process_group()
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
