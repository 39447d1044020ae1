"""A training step and an overlap benchmark through torch.distributed (issues 30 and 31).

Run under torchrun, once with railcc's libnccl preloaded and once with NCCL (bench/torch/step.sh
does both in one call). Modes:
  ddp      a 12-layer, width-1024 transformer (about 150M parameters, batch 8 x 256) in bf16
           under DistributedDataParallel: its bucketed all_reduces overlap the backward pass;
  fsdp     the same model under FSDP2 (fully_shard per layer, bf16 parameters and reduction):
           all_gathers before each layer, reduce_scatters after its backward;
  hsdp     FSDP2 on a 2-D DeviceMesh (replicate across hosts, shard inside a host; one host:
           2 x 2): reduce_scatter inside, all_reduce across;
  overlap  bf16 matrix products on one stream and, on another, the collectives of a training
           step of the same model ("ddp": 25 MB all_reduce buckets; "fsdp": per layer an
           all_gather and a reduce_scatter), and one 128 MB all_reduce ("ar128", first), alone
           and together. The first overlapped step of
           the process is timed apart (issue 31: no first-call stall);
  small    all_reduce of 8 B, 64 KB and 1 MB through torch.distributed: the time per call of
           200 back-to-back calls after 20 warm-up calls, median of 5 rounds (issue 31: 8 B at
           NCCL's time through PyTorch).
Each rank prints nothing; rank 0 writes one JSON line per measurement to OUT.json and a
summary line to stdout. Losses (ddp/fsdp/hsdp) go into the JSON line, to compare libraries.
--cpu runs on the CPU with gloo (a smoke test of the script, no figures).
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "fsdp", "hsdp", "overlap", "small"], required=True)
    p.add_argument("--out", required=True, help="prefix of the JSON lines file")
    p.add_argument("--label", default="", help="run name written with each line")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--matmuls", type=int, default=12, help="overlap: products per step")
    p.add_argument("--mm", type=int, default=8192, help="overlap: square product size")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="overlap ddp: bucket size")
    p.add_argument("--small-sizes", default="8,65536,1048576", help="small: bytes per all_reduce")
    p.add_argument("--cpu", action="store_true")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        help="ddp/fsdp/hsdp: after the timed steps, this many more under torch.profiler; rank 0 prints "
        "where the device time went (kernels by total time) and the host time of the collectives' calls",
    )
    return p.parse_args()


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                a.width, a.width // 64, 4 * a.width, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(a.layers)
        )
        self.head = nn.Linear(a.width, a.vocab)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def hosts_and_local():
    """(number of hosts, ranks per host) from torchrun's environment."""
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(world // max(local, 1), 1), local


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def one_step(a, net, opt, x, y):
    """One training step (forward, loss, backward, optimizer); its loss."""
    out = net(x)
    loss = nn.functional.cross_entropy(out.float().reshape(-1, a.vocab), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def profile_steps(a, dev, rank, net, opt, x, y):
    """`a.profile` more steps under torch.profiler; rank 0 prints the kernels by device time and
    the collectives' host calls (how long the caller's thread spent in them): whether a
    library's step loses in its kernels or on the host."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sync(dev)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(a.profile):
            one_step(a, net, opt, x, y)
        sync(dev)
    wall = (time.perf_counter() - t0) * 1e3 / a.profile
    if rank != 0:
        return
    ev = prof.key_averages()
    dev_us = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
    kernels = sorted((e for e in ev if dev_us(e) > 0), key=dev_us, reverse=True)
    total = sum(dev_us(e) for e in kernels)
    print(f"profile: {a.label} {a.mode}: {a.profile} steps, {wall:.2f} ms a step (profiled), "
          f"device time {total / 1e3 / a.profile:.2f} ms a step", flush=True)
    for e in kernels[:12]:
        print(f"profile:   device {dev_us(e) / 1e3 / a.profile:8.3f} ms/step {e.count / a.profile:6.1f} calls/step  {e.key[:90]}", flush=True)
    for e in sorted((e for e in ev if "nccl" in e.key.lower() or "c10d" in e.key.lower()), key=lambda e: -e.cpu_time_total)[:8]:
        print(f"profile:   host   {e.cpu_time_total / 1e3 / a.profile:8.3f} ms/step {e.count / a.profile:6.1f} calls/step  {e.key[:90]}", flush=True)


def train(a, dev, rank, world):
    torch.manual_seed(0)  # the same initial model on every rank and in every library
    model = Model(a).to(dev)
    params = sum(p.numel() for p in model.parameters())
    if a.mode == "ddp":
        model = model.to(torch.bfloat16)
        net = nn.parallel.DistributedDataParallel(model, device_ids=None if a.cpu else [dev])
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        kw = {"mp_policy": mp}
        if a.mode == "hsdp":
            from torch.distributed.device_mesh import init_device_mesh

            nh, local = hosts_and_local()
            rep, shard = (nh, local) if nh > 1 else (2, world // 2)
            kw["mesh"] = init_device_mesh(dev.type, (rep, shard), mesh_dim_names=("replicate", "shard"))
        for layer in model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        net = model
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(dev)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(dev)
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        sync(dev)
        t0 = time.perf_counter()
        loss = one_step(a, net, opt, x, y)
        sync(dev)
        dt = time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if i >= a.warmup:
            times.append(dt * 1e3)
    if a.profile > 0:
        profile_steps(a, dev, rank, net, opt, x, y)
    return {
        "median_ms": statistics.median(times),
        # Issue 31's figure is the median of 10 steps; with --steps past 10 both are kept.
        "median10_ms": statistics.median(times[:10]),
        "min_ms": min(times),
        "max_ms": max(times),
        "times_ms": times,
        "losses": losses,
        "params": params,
    }


def overlap(a, dev, rank, world):
    """Matrix products on one stream, a step's collectives on another: alone and together."""
    bf = torch.bfloat16
    n = a.mm
    x = torch.randn(n, n, device=dev, dtype=bf)
    w = torch.randn(n, n, device=dev, dtype=bf)
    per_layer = 12 * a.width * a.width + 13 * a.width  # a transformer layer's parameters
    total = a.layers * per_layer
    if a.cpu:
        mm_stream = coll_stream = None
    else:
        mm_stream, coll_stream = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    results = {}
    # cuBLAS's first product in a process costs it tens of milliseconds (its handle and
    # kernels): done once here, so a first overlapped step times the collective's first call.
    if mm_stream is not None:
        with torch.cuda.stream(mm_stream):
            torch.mm(x, w)
        sync(dev)
    # ar128 first: its first overlapped step is the process's first 128 MB all_reduce (issue
    # 31: at most 1.2x the longer of its two parts alone).
    for kind in ("ar128", "ddp", "fsdp"):
        if kind == "ar128":
            elems = 64 * 2**20  # 128 MB of bf16
            big = torch.ones(elems, device=dev, dtype=bf)
            moved = elems * 2 * 2 * (world - 1) / world

            def colls():
                dist.all_reduce(big)
        elif kind == "ddp":
            elems = max(int(a.bucket_mb * 2**20 / 2), 1)
            n_buckets = (total + elems - 1) // elems
            bufs = [torch.ones(elems, device=dev, dtype=bf) for _ in range(n_buckets)]
            moved = n_buckets * elems * 2 * 2 * (world - 1) / world  # bus bytes

            def colls():
                for b in bufs:
                    dist.all_reduce(b)
        else:
            shard = (per_layer + world - 1) // world
            shards = [torch.ones(shard, device=dev, dtype=bf) for _ in range(a.layers)]
            fulls = [torch.empty(shard * world, device=dev, dtype=bf) for _ in range(a.layers)]
            grads = [torch.ones(shard * world, device=dev, dtype=bf) for _ in range(a.layers)]
            outs = [torch.empty(shard, device=dev, dtype=bf) for _ in range(a.layers)]
            moved = a.layers * 2 * shard * world * 2 * (world - 1) / world

            def colls():
                for i in range(a.layers):
                    dist.all_gather_into_tensor(fulls[i], shards[i])
                for i in reversed(range(a.layers)):
                    dist.reduce_scatter_tensor(outs[i], grads[i])

        def mms():
            for _ in range(a.matmuls):
                torch.mm(x, w)

        returned = []

        def run(do_mm, do_coll):
            """Seconds from launch until both streams are done (the host's time to issue the
            collectives, which the matrix products wait behind, goes to `returned`)."""
            sync(dev)
            dist.barrier()
            t0 = time.perf_counter()
            if a.cpu:
                if do_coll:
                    colls()
                if do_mm:
                    mms()
            else:
                if do_coll:
                    with torch.cuda.stream(coll_stream):
                        colls()
                returned.append(time.perf_counter() - t0)
                if do_mm:
                    with torch.cuda.stream(mm_stream):
                        mms()
            sync(dev)
            return time.perf_counter() - t0

        # The first overlapped step of the process (nothing of this size ran before it).
        first = run(True, True)
        first_returned = returned[-1] if returned else 0.0
        for _ in range(a.warmup):
            run(True, True)
        alone_mm = statistics.median(run(True, False) for _ in range(a.steps))
        alone_coll = statistics.median(run(False, True) for _ in range(a.steps))
        both = statistics.median(run(True, True) for _ in range(a.steps))
        flops = 2.0 * n * n * n * a.matmuls
        results[kind] = {
            "step_ms": both * 1e3,
            "mm_alone_ms": alone_mm * 1e3,
            "coll_alone_ms": alone_coll * 1e3,
            "first_step_ms": first * 1e3,
            # How long the first step's collectives took to be issued (the products start after).
            "first_issue_ms": first_returned * 1e3,
            "issue_ms": statistics.median(returned[1:]) * 1e3 if len(returned) > 1 else 0.0,
            "first_over_longer_alone": first / max(alone_mm, alone_coll),
            "step_over_longer_alone": both / max(alone_mm, alone_coll),
            "coll_busbw_alone_GBs": moved / alone_coll / 1e9,
            "mm_tflops_alone": flops / alone_mm / 1e12,
            # In the overlapped step each stream is done no later than the step.
            "mm_tflops_in_step_at_least": flops / both / 1e12,
        }
    return results


def small(a, dev, world):
    """Microseconds per all_reduce of back-to-back calls, per size (median of 5 rounds)."""
    out = {}
    for nbytes in (int(b) for b in a.small_sizes.split(",")):
        # MAX of rank + 1: the result stays `world` however many calls run, so it is checked.
        x = torch.full((nbytes // 4,), float(dist.get_rank() + 1), device=dev)
        for _ in range(20):
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        rounds = []
        for _ in range(5):
            sync(dev)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(200):
                dist.all_reduce(x, op=dist.ReduceOp.MAX)
            sync(dev)
            rounds.append((time.perf_counter() - t0) / 200 * 1e6)
        bad = (x != float(world)).sum().item()
        if bad:
            raise SystemExit(f"small: all_reduce of {nbytes} B: {bad} elements are not {world}")
        out[str(nbytes)] = statistics.median(rounds)
    return {"us_per_call": out}


def gpu_local_cpus(gpu):
    """The CPUs nearest physical GPU `gpu` (its PCI device's local_cpulist, as NCCL binds its
    own threads and bench/compare/as-host.sh binds ranks), or None where that is unknown."""
    try:
        bus = subprocess.run(
            ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", str(gpu)],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().lower()
        with open(f"/sys/bus/pci/devices/{bus[4:] if bus.startswith('0000') else bus}/local_cpulist") as f:
            spec = f.read().strip()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    cpus = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus or None


def pin_cpus():
    """STEP_PIN_SLOTS=N (step.sh's STEP_PIN=1; N: the machine's GPUs): this rank's threads on
    the CPUs nearest its GPU (its index among all the machine's GPUs, from
    CUDA_VISIBLE_DEVICES where set), else on the N-th share of the process's CPUs that
    belongs to it, so a run's steps do not depend on where the scheduler put its ranks, for
    either library alike. Before any thread starts: later threads (the libraries' own)
    inherit it."""
    slots = int(os.environ.get("STEP_PIN_SLOTS", "0"))
    if slots <= 0:
        return
    lr = int(os.environ.get("LOCAL_RANK", 0))
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    gpu = int(vis.split(",")[lr]) if vis else lr
    cpus = sorted(os.sched_getaffinity(0))
    near = gpu_local_cpus(gpu)
    mine = sorted(near & set(cpus)) if near else []
    if not mine:
        per = max(1, len(cpus) // slots)
        mine = cpus[gpu * per:(gpu + 1) * per] or cpus
    os.sched_setaffinity(0, mine)


def main():
    pin_cpus()
    a = parse()
    backend = "gloo" if a.cpu else "nccl"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.cpu:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
    nh, local = hosts_and_local()
    if a.mode == "overlap":
        r = overlap(a, dev, rank, world)
    elif a.mode == "small":
        r = small(a, dev, world)
    else:
        r = train(a, dev, rank, world)
    if rank == 0:
        line = {"label": a.label, "mode": a.mode, "world": world, "hosts": nh, "per_host": local}
        line.update(r)
        with open(a.out + ".json", "a") as f:
            f.write(json.dumps(line) + "\n")
        if a.mode == "small":
            us = r["us_per_call"]
            print(f"step: {a.label} small: all_reduce " + ", ".join(f"{k} B {v:.1f} us" for k, v in us.items()), flush=True)
        elif a.mode == "overlap":
            for k, v in r.items():
                print(
                    f"step: {a.label} overlap-{k}: step {v['step_ms']:.2f} ms "
                    f"(matmuls alone {v['mm_alone_ms']:.2f}, collectives alone {v['coll_alone_ms']:.2f}, "
                    f"first step {v['first_step_ms']:.2f} = {v['first_over_longer_alone']:.2f}x the longer alone, "
                    f"issued in {v['first_issue_ms']:.2f}, later {v['issue_ms']:.2f}), "
                    f"busbw alone {v['coll_busbw_alone_GBs']:.1f} GB/s, matmuls {v['mm_tflops_alone']:.0f} TFLOP/s alone",
                    flush=True,
                )
        else:
            print(
                f"step: {a.label} {a.mode}: median {r['median_ms']:.2f} ms of {len(r['times_ms'])} steps "
                f"(of the first 10: {r['median10_ms']:.2f}; min {r['min_ms']:.2f}, "
                f"max {r['max_ms']:.2f}), last loss {r['losses'][-1]:.6f}",
                flush=True,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
