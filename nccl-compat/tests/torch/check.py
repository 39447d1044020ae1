"""torch.distributed on railcc's libnccl.so.2 (issue 7): run under torchrun with 2 processes.

  python3 -m torch.distributed.run --nproc_per_node 2 check.py OUT_PREFIX

Checks all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast and send/recv
against values computed here, then trains a small model with DistributedDataParallel for
STEPS steps and writes rank 0's loss per step to OUT_PREFIX.loss.txt (compare two runs: one
with LD_PRELOAD of railcc's library, one on NCCL)."""
import os
import sys

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
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
