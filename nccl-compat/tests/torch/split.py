"""Communicator splits through torch (issue 18): new_group and split_group after
init_process_group(device_id=...) make torch call ncclCommSplit. Every group's all_reduce sum,
size and rank order (all_gather of global ranks) is checked; with NCCL_DEBUG=INFO railcc's
libnccl prints one "ncclCommSplit" line per split, which split.sh counts.

Run under torchrun (any rank count >= 2; ranks may share GPUs: device LOCAL_RANK mod the GPU
count). Prints "split: ok" on every rank; an assertion names what differed."""
import os

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)

    def check(pg, members, what):
        members = sorted(members)
        if rank not in members:
            return
        assert dist.get_world_size(pg) == len(members), f"{what}: size {dist.get_world_size(pg)}, want {len(members)}"
        x = torch.full((1000003,), float(rank + 1), device=dev)
        dist.all_reduce(x, group=pg)
        want = float(sum(m + 1 for m in members))
        assert bool(torch.all(x == want)), f"{what}: all_reduce gave {x[0].item()}, want {want}"
        got = [torch.empty(1, device=dev) for _ in members]
        dist.all_gather(got, torch.tensor([float(rank)], device=dev), group=pg)
        order = [int(t.item()) for t in got]
        assert order == members, f"{what}: group ranks hold global ranks {order}, want {members}"
        print(f"rank {rank} {what}: {len(members)} ranks {members} ok", flush=True)

    evens = [r for r in range(world) if r % 2 == 0]
    odds = [r for r in range(world) if r % 2 == 1]
    g_even = dist.new_group(evens)
    g_odd = dist.new_group(odds)
    check(g_even, evens, "new_group evens")
    check(g_odd, odds, "new_group odds")
    # One group per rank: a one-rank communicator, every other rank left out.
    for r in range(world):
        g = dist.new_group([r])
        check(g, [r], f"new_group [{r}]")
    # Everyone, listed backwards: torch orders group ranks by global rank.
    g_all = dist.new_group(list(reversed(range(world))))
    check(g_all, list(range(world)), "new_group all (reversed list)")
    if hasattr(dist, "split_group"):
        halves = [list(range(world // 2)), list(range(world // 2, world))]
        g = dist.split_group(split_ranks=halves)
        mine = halves[0] if rank in halves[0] else halves[1]
        check(g, mine, "split_group halves")
    # The parent still works after its splits.
    check(None, list(range(world)), "default group after splits")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} split: ok", flush=True)


if __name__ == "__main__":
    main()
