#!/usr/bin/python3
# torch_allreduce.py: gloo's all-reduce bandwidth on this machine, the peer of
# bench_comm's `threads` all-reduce.
#
#   /usr/bin/python3 bench/torch_allreduce.py                 # 16 MiB, 4 ranks
#   /usr/bin/python3 bench/torch_allreduce.py --size-mib 4 --ranks 2 --json out.json
#
# N local processes (torch.multiprocessing), torch.distributed over gloo on the
# loopback interface only (MASTER_ADDR=127.0.0.1, GLOO_SOCKET_IFNAME=lo). Each
# rank all-reduces (sum) a float32 tensor of the given size. The time of one
# all-reduce is rank 0's wall clock between two barriers divided by the
# iterations, the best of --repeats such timings (as bench_comm does: on a
# shared machine the best is the least disturbed). Reported as nccl-tests does:
#
#   algbw = size / time,   busbw = algbw * 2(N-1)/N
#
# Requirements: Debian's python3-torch, run with /usr/bin/python3.
import argparse
import json
import os
import socket
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    sys.exit("torch_allreduce.py: PyTorch is not installed for %s; on Debian: apt-get install python3-torch, "
             "then run this script with /usr/bin/python3" % sys.executable)


def worker(rank, args, port, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=args.ranks)
    n = args.size_mib * (1 << 20) // 4
    buf = torch.full((n,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(buf)  # warm-up: connections, first touch
    expect = args.ranks * (args.ranks + 1) / 2
    ok = bool(buf[0].item() == expect and buf[-1].item() == expect)
    best = float("inf")
    for _ in range(args.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        dist.barrier()
        best = min(best, (time.perf_counter() - t0) / args.iters)
    if rank == 0:
        queue.put({"seconds": best, "correct": ok})
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description="gloo all-reduce bandwidth over N local processes (loopback).")
    ap.add_argument("--size-mib", type=int, default=16, help="buffer size in MiB (float32)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5, help="all-reduces per timing")
    ap.add_argument("--repeats", type=int, default=3, help="timings; the best is kept")
    ap.add_argument("--json", help="also write the result as one JSON object to this file")
    args = ap.parse_args()
    if args.ranks < 2 or args.size_mib < 1 or args.iters < 1 or args.repeats < 1:
        ap.error("--ranks >= 2, --size-mib, --iters and --repeats >= 1")
    if not dist.is_available() or not dist.is_gloo_available():
        sys.exit("torch_allreduce.py: this torch build has no torch.distributed with gloo")

    port = free_port()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(args, port, queue), nprocs=args.ranks, join=True)
    r = queue.get()

    size = args.size_mib * (1 << 20)
    algbw = size / r["seconds"] / 1e9
    busbw = algbw * 2 * (args.ranks - 1) / args.ranks
    result = {"backend": "gloo", "torch_version": torch.__version__, "ranks": args.ranks, "bytes": size,
              "seconds": r["seconds"], "algbw_GBps": algbw, "busbw_GBps": busbw, "correct": r["correct"],
              "iters": args.iters, "repeats": args.repeats}
    print("gloo all_reduce (torch %s), %d processes, %d MiB float32: %.1f us, algbw %.3f GB/s, busbw %.3f GB/s%s"
          % (torch.__version__, args.ranks, args.size_mib, r["seconds"] * 1e6, algbw, busbw,
             "" if r["correct"] else "  (WRONG SUM)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if not r["correct"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
