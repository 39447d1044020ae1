"""torch.distributed on railcc's libnccl.so.2 or on NCCL (issue 18's suite): 4 processes.

  torchrun ... suite.py OUT_PREFIX        (nccl-compat/tests/torch/suite.sh launches it)

Every collective torch sends to NCCL, with every dtype it sends, checked against values
computed here (small integers, so every order of reduction is exact): all_reduce (sum, prod,
min, max, avg, premultiplied sum by a host and a device factor), reduce, broadcast,
all_gather (list and tensor), reduce_scatter (list and tensor), gather, scatter,
all_to_all_single (even and uneven splits), all_to_all, send/recv, batch_isend_irecv, barrier,
all_gather_object, broadcast_object_list, scatter_object_list; fp8 (e4m3fn, e5m2) where torch
sends it; new_group and split_group; a 2 x 2 DeviceMesh with DTensor ops. Then DDP and FSDP2
(bf16 parameters and bf16 gradient reduction) train a small model STEPS steps and write the
mean loss per step to OUT_PREFIX.ddp.loss.txt and OUT_PREFIX.fsdp.loss.txt (rank 0).

A check that torch itself refuses before calling the library prints "SKIP <name>: <why>"; any
other failure ends the run with the check's name. The last line of each rank is
"suite: rank R: N checks ok, K skipped"."""
import os
import sys
import traceback

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "40"))
OK = 0
SKIPPED = []


def check(name, fn):
    global OK
    if os.environ.get("SUITE_VERBOSE"):
        print(f"suite: rank {dist.get_rank()}: {name} ...", flush=True)
    try:
        fn()
    except (TypeError, ValueError, NotImplementedError, RuntimeError) as e:
        msg = str(e).split("\n")[0]
        # torch's own refusals say so before any call; what the library returns comes back
        # as "NCCL error ..." (with railcc's text).
        from_library = "NCCL error" in msg or "railcc" in msg or "ncclInvalid" in msg
        refused = any(w in msg.lower() for w in ("not supported", "unsupported", "not currently", "currenlty"))
        if refused and not from_library:
            SKIPPED.append(name)
            sys.stdout.write(f"SKIP {name}: torch refuses it: {msg}\n")
            sys.stdout.flush()
            return
        traceback.print_exc()
        raise SystemExit(f"suite: rank {dist.get_rank()}: {name}: FAILED: {msg}")
    torch.cuda.synchronize()
    OK += 1


def same(a, b, what):
    if not torch.equal(a.double() if a.is_floating_point() else a, b.double() if b.is_floating_point() else b):
        bad = (a.double() != b.double()).nonzero()
        i = bad[0].tolist() if len(bad) else "?"
        raise AssertionError(f"{what}: element {i}: got {a.flatten()[0:4].tolist()}..., want {b.flatten()[0:4].tolist()}...")


def base(n, dev, dtype, rank, mod=7):
    return (torch.arange(n, device=dev) % mod + rank + 1).to(dtype)


REDUCE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64]
COPY_DTYPES = REDUCE_DTYPES + [torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def collectives(rank, world, dev):
    n = 4099  # not a multiple of anything
    for dt in REDUCE_DTYPES:
        ops = [("sum", dist.ReduceOp.SUM, 7), ("prod", dist.ReduceOp.PRODUCT, 2), ("min", dist.ReduceOp.MIN, 7), ("max", dist.ReduceOp.MAX, 7)]
        if dt.is_floating_point:
            ops.append(("avg", dist.ReduceOp.AVG, 7))
        for name, op, mod in ops:
            def run(op=op, mod=mod, name=name):
                xs = [base(n, dev, torch.float64, r, mod) for r in range(world)]
                if name == "prod":
                    xs = [(torch.arange(n, device=dev) % 2 + (r % 2)).double() for r in range(world)]
                want = {"sum": sum(xs), "prod": torch.stack(xs).prod(0), "min": torch.stack(xs).min(0).values,
                        "max": torch.stack(xs).max(0).values, "avg": sum(xs) / world}[name]
                x = xs[rank].to(dt).clone()
                dist.all_reduce(x, op=op)
                same(x, want.to(dt), f"all_reduce {name} {dt}")
            check(f"all_reduce {name} {dt}", run)
        if dt == torch.bfloat16:
            # torch 2.11 hands NCCL a float factor (host value or a float tensor it insists
            # on) with the bfloat16 type, so the library reads the float's low two bytes: 0
            # for 0.5 and 2.0. Seen on NCCL as on railcc; nothing to check here.
            SKIPPED.append(f"premul_sum {dt}")
            print(f"SKIP premul_sum {dt}: torch passes a float factor for bfloat16 (NCCL reads 0 too)", flush=True)
        elif dt.is_floating_point:
            def premul(dt=dt):
                xs = [base(n, dev, torch.float64, r) for r in range(world)]
                x = xs[rank].to(dt).clone()  # .to(float64) would alias xs[rank]
                dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
                same(x, (sum(xs) * 0.5).to(dt), f"all_reduce premul_sum(0.5) {dt}")
                # A device factor: each rank its own (rank + 1), read when the call runs.
                f = torch.tensor([float(rank + 1)], device=dev, dtype=dt)
                x = xs[rank].to(dt).clone()
                dist.all_reduce(x, op=dist._make_nccl_premul_sum(f))
                same(x, sum(xs[r] * (r + 1) for r in range(world)).to(dt), f"all_reduce premul_sum(device factor) {dt}")
                out = torch.empty(n, device=dev, dtype=dt)
                big = torch.cat([base(n, dev, dt, rank + 2 * k) for k in range(world)])
                dist.reduce_scatter_tensor(out, big, op=dist._make_nccl_premul_sum(2.0))
                same(out, sum(base(n, dev, torch.float64, r + 2 * rank) for r in range(world)) * 2, f"reduce_scatter premul_sum {dt}")
            check(f"premul_sum {dt}", premul)

        def rooted(dt=dt):
            x = base(n, dev, dt, rank)
            dist.reduce(x, dst=1)
            if rank == 1:
                same(x, sum(base(n, dev, torch.float64, r) for r in range(world)).to(dt), f"reduce {dt}")
            out = torch.empty(n, device=dev, dtype=dt)
            big = torch.cat([base(n, dev, dt, rank + 2 * k) for k in range(world)])
            dist.reduce_scatter_tensor(out, big)
            same(out, sum(base(n, dev, torch.float64, r + 2 * rank) for r in range(world)).to(dt), f"reduce_scatter_tensor {dt}")
            outs = torch.empty(n, device=dev, dtype=dt)
            dist.reduce_scatter(outs, [base(n, dev, dt, rank + 2 * k) for k in range(world)])
            same(outs, out, f"reduce_scatter (list) {dt}")
        check(f"reduce, reduce_scatter {dt}", rooted)

    for dt in COPY_DTYPES:
        def copies(dt=dt):
            def v(r, m=n):
                return (torch.arange(m, device=dev) % 5 + r).to(torch.float32).to(dt)
            b = v(rank)
            dist.broadcast(b, src=2)
            same(b, v(2), f"broadcast {dt}")
            g = torch.empty(world * n, device=dev, dtype=dt)
            dist.all_gather_into_tensor(g, v(rank))
            same(g, torch.cat([v(r) for r in range(world)]), f"all_gather_into_tensor {dt}")
            lst = [torch.empty(n, device=dev, dtype=dt) for _ in range(world)]
            dist.all_gather(lst, v(rank))
            same(torch.cat(lst), g, f"all_gather (list) {dt}")
            gl = [torch.empty(n, device=dev, dtype=dt) for _ in range(world)] if rank == 0 else None
            dist.gather(v(rank), gl, dst=0)
            if rank == 0:
                same(torch.cat(gl), g, f"gather {dt}")
            sc = torch.empty(n, device=dev, dtype=dt)
            dist.scatter(sc, [v(10 * r) for r in range(world)] if rank == 3 else None, src=3)
            same(sc, v(10 * rank), f"scatter {dt}")
            # all_to_all_single, even: chunk j of rank r holds r * 4 + j.
            src = torch.cat([v(rank * 4 + j, 64) for j in range(world)])
            dst = torch.empty_like(src)
            dist.all_to_all_single(dst, src)
            same(dst, torch.cat([v(j * 4 + rank, 64) for j in range(world)]), f"all_to_all_single even {dt}")
            # Uneven: rank r sends (r + j + 1) * 3 elements to rank j.
            sizes = [(rank + j + 1) * 3 for j in range(world)]
            src = torch.cat([v(rank * 4 + j, sizes[j]) for j in range(world)])
            dst = torch.empty(sum(sizes), device=dev, dtype=dt)
            dist.all_to_all_single(dst, src, output_split_sizes=sizes, input_split_sizes=sizes)
            same(dst, torch.cat([v(j * 4 + rank, sizes[j]) for j in range(world)]), f"all_to_all_single uneven {dt}")
            outs = [torch.empty(64, device=dev, dtype=dt) for _ in range(world)]
            dist.all_to_all(outs, [v(rank * 4 + j, 64) for j in range(world)])
            same(torch.cat(outs), torch.cat([v(j * 4 + rank, 64) for j in range(world)]), f"all_to_all (list) {dt}")
        check(f"copies {dt}", copies)

    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        def fp8_sum(dt=dt):
            xs = [(torch.arange(n, device=dev) % 2 + 1).double() for _ in range(world)]
            x = xs[rank].to(dt).clone()
            dist.all_reduce(x)
            same(x, sum(xs).to(dt), f"all_reduce sum {dt}")
        check(f"all_reduce sum {dt}", fp8_sum)

    def p2p():
        x = base(n, dev, torch.float32, rank)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        if rank % 2 == 0:
            dist.send(x, nxt)
            r = torch.empty_like(x)
            dist.recv(r, prv)
        else:
            r = torch.empty_like(x)
            dist.recv(r, prv)
            dist.send(x, nxt)
        same(r, base(n, dev, torch.float32, prv), "send/recv")
        r2 = torch.empty_like(x)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, r2, prv)])
        for q in reqs:
            q.wait()
        same(r2, r, "batch_isend_irecv")
        r3 = torch.empty_like(x)
        a = dist.isend(x, nxt)
        b = dist.irecv(r3, prv)
        a.wait()
        b.wait()
        same(r3, r, "isend/irecv")
    check("send/recv, isend/irecv, batch_isend_irecv", p2p)

    def objects():
        dist.barrier()
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
        assert objs == [{"rank": r, "s": "x" * r} for r in range(world)], f"all_gather_object {objs}"
        lst = [{"from": 1, "n": 7}, "two"] if rank == 1 else [None, None]
        dist.broadcast_object_list(lst, src=1)
        assert lst == [{"from": 1, "n": 7}, "two"], f"broadcast_object_list {lst}"
        got = [None]
        dist.scatter_object_list(got, [f"for {r}" for r in range(world)] if rank == 0 else None, src=0)
        assert got == [f"for {rank}"], f"scatter_object_list {got}"
    check("barrier, all_gather_object, broadcast_object_list, scatter_object_list", objects)


def groups(rank, world, dev):
    def new_groups():
        evens = dist.new_group([0, 2])
        odds = dist.new_group([1, 3])
        mine = evens if rank % 2 == 0 else odds
        x = torch.full((1000,), float(rank), device=dev)
        dist.all_reduce(x, group=mine)
        members = [0, 2] if rank % 2 == 0 else [1, 3]
        same(x, torch.full((1000,), float(sum(members)), device=dev), "all_reduce in new_group")
        pair = dist.split_group(split_ranks=[[0, 1], [2, 3]])
        y = torch.full((1000,), float(rank), device=dev)
        dist.all_reduce(y, group=pair)
        lo = rank // 2 * 2
        same(y, torch.full((1000,), float(lo + lo + 1), device=dev), "all_reduce in split_group")
    check("new_group, split_group", new_groups)

    def mesh_dtensor():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
        g = torch.Generator().manual_seed(3)
        a = torch.randint(-4, 5, (64, 32), generator=g).float()
        b = torch.randint(-4, 5, (32, 16), generator=g).float()
        da = distribute_tensor(a.to(dev), mesh, [Shard(0), Shard(1)])
        db = distribute_tensor(b.to(dev), mesh, [Replicate(), Shard(0)])
        same((da @ db).full_tensor().cpu(), a @ b, "DTensor matmul on a 2 x 2 mesh")
        same(da.redistribute(mesh, [Replicate(), Replicate()]).to_local().cpu(), a, "DTensor redistribute")
        same(da.sum().full_tensor().cpu(), a.sum(), "DTensor sum")
        tp = mesh["tp"].get_group()
        x = torch.full((100,), float(rank), device=dev)
        dist.all_reduce(x, group=tp)
        lo = rank // 2 * 2
        same(x, torch.full((100,), float(2 * lo + 1), device=dev), "all_reduce on the mesh's tp dimension")
    check("2 x 2 DeviceMesh and DTensor", mesh_dtensor)


def model(dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(dev)


def train(rank, world, dev, out, kind):
    m = model(dev)
    if kind == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(m, device_ids=[dev.index])
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mp_policy=mp)
        net = fully_shard(m, mp_policy=mp)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1234 + rank)
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(STEPS):
        xb = torch.randn(128, 64, generator=gen)
        yb = (xb @ w_true).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(net(xb.to(dev)).float(), yb.to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        l = loss.detach().float().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
    if rank == 0:
        with open(f"{out}.{kind}.loss.txt", "w") as f:
            f.write("\n".join(f"{v:.7f}" for v in losses) + "\n")


def main():
    out = sys.argv[1]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, f"the suite wants 4 ranks, got {world}"
    if rank == 0:
        print(f"suite: torch {torch.__version__}, NCCL version torch sees {torch.cuda.nccl.version()}", flush=True)
    collectives(rank, world, dev)
    groups(rank, world, dev)
    check("DDP training", lambda: train(rank, world, dev, out, "ddp"))
    check("FSDP2 training, bf16 reduce", lambda: train(rank, world, dev, out, "fsdp"))
    # One write (print writes the newline apart, so ranks sharing a log would mix lines).
    sys.stdout.write(f"suite: rank {rank}: {OK} checks ok, {len(SKIPPED)} skipped\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
