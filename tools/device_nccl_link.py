#!/usr/bin/env python3
"""The link between the GPUs of one box as the MoE exchange of issue 25 would use it.

Measures, between GPU 0 and each other GPU (NCCL through torch.distributed, one process per GPU):
  - ping-pong: GPU 0 sends a message, the peer sends it back; half the round trip is one exchange;
  - all_to_all_single over every GPU: each sends `size` bytes to every other, as a token's hidden
    state goes out to the experts' GPUs and their partial sums come back; timed one at a time
    (barrier, op, synchronise: includes the host round trip) and queued (`iters` back to back,
    one synchronisation: the GPU-side time a step's in-order exchanges would see);
at message sizes from one token's bf16 hidden state (10,240 bytes at hidden 5,120) to 64 MiB, and
prints per size the median time and rate, then the two figures `flashbox probe --gpus N` takes
(--link-latency-us: the one-token exchange; --link-gbps: the large-message rate).

Usage on a multi-GPU machine:   python3 tools/device_nccl_link.py [--gpus N] [--iters 200]
On a CPU (the logic only):      python3 tools/device_nccl_link.py --backend gloo --gpus 2 --iters 20
Needs torch with distributed support (the device has it). Writes a CSV with --csv PATH.
"""
import argparse
import os
import statistics
import sys
import time


def sizes_for(hidden_bytes):
    return [hidden_bytes, 6 * hidden_bytes, 1 << 20, 16 << 20, 64 << 20]


def worker(rank, world, args, queue):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    gpu = args.backend == "nccl"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if gpu else torch.device("cpu")

    def sync():
        if gpu:
            torch.cuda.synchronize()

    rows = []
    for size in sizes_for(args.hidden_bytes):
        n = max(1, size // 2)
        buf = torch.ones(n, dtype=torch.bfloat16, device=dev)
        iters = args.iters if size <= (1 << 20) else max(5, args.iters // 20)
        # ping-pong between 0 and each peer
        for peer in range(1, world):
            times = []
            for it in range(iters + 3):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, dst=peer)
                    dist.recv(buf, src=peer)
                elif rank == peer:
                    dist.recv(buf, src=0)
                    dist.send(buf, dst=0)
                sync()
                if it >= 3 and rank == 0:
                    times.append((time.perf_counter() - t0) / 2)
            if rank == 0:
                t = statistics.median(times)
                rows.append(("pingpong", peer, size, t, size / t))
        # all_to_all: every rank sends `size` bytes to every other (and itself, as the op requires)
        inp = torch.ones(n * world, dtype=torch.bfloat16, device=dev)
        out = torch.empty_like(inp)
        times = []
        for it in range(iters + 3):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_to_all_single(out, inp)
            sync()
            if it >= 3:
                times.append(time.perf_counter() - t0)
        if rank == 0:
            t = statistics.median(times)
            rows.append(("all_to_all", world, size, t, size * (world - 1) / t))
        # queued: `iters` all_to_all back to back with one synchronisation at the end, as a step
        # issues its per-layer exchanges in stream order: the GPU-side time of one exchange
        # without the host round trip each timed one above includes.
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for it in range(iters):
            dist.all_to_all_single(out, inp)
        sync()
        t = (time.perf_counter() - t0) / iters
        if rank == 0:
            rows.append(("a2a_queued", world, size, t, size * (world - 1) / t))
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=0, help="processes (GPUs); default: every visible GPU")
    p.add_argument("--iters", type=int, default=200, help="timed repetitions per small message (large ones: 1/20)")
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo: a CPU dry run of the logic")
    p.add_argument("--hidden-bytes", type=int, default=5120 * 2, help="one token's hidden state (bf16)")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--csv", default="", help="also write the rows here")
    args = p.parse_args()
    import torch
    import torch.multiprocessing as mp

    world = args.gpus or (torch.cuda.device_count() if args.backend == "nccl" else 2)
    if world < 2:
        print(f"device_nccl_link: needs 2 or more {'GPUs' if args.backend == 'nccl' else 'processes'} (found {world})", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, args, queue)) for r in range(world)]
    for pr in procs:
        pr.start()
    rows = queue.get(timeout=600)
    for pr in procs:
        pr.join(timeout=60)
    if any(pr.exitcode != 0 for pr in procs):
        print("device_nccl_link: a worker failed", file=sys.stderr)
        return 1
    print(f"{'what':<11} {'peers':>5} {'bytes':>10} {'us':>10} {'GB/s':>8}")
    for what, peers, size, t, rate in rows:
        print(f"{what:<11} {peers:>5} {size:>10} {t * 1e6:>10.2f} {rate / 1e9:>8.2f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("what,peers,bytes,seconds,bytes_per_s\n")
            for r in rows:
                f.write(",".join(str(x) for x in r) + "\n")
    one = [r for r in rows if r[0] == "all_to_all" and r[2] == args.hidden_bytes]
    queued = [r for r in rows if r[0] == "a2a_queued" and r[2] == args.hidden_bytes]
    if queued:
        print(f"one token's exchange queued in stream order: {queued[0][3] * 1e6:.1f} us (the host-timed one: {one[0][3] * 1e6 if one else float('nan'):.1f} us)")
    big = [r for r in rows if r[0] == "pingpong" and r[2] == max(sizes_for(args.hidden_bytes))]
    if one and big:
        print(f"flashbox probe --gpus {world} --link-latency-us {one[0][3] * 1e6:.1f} --link-gbps {max(r[4] for r in big) / 1e9:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
