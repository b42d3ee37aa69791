#!/usr/bin/env python3
"""mutate.py: how many small plausible bugs the test suites catch.

Each mutation below is one edit (an operand, a bound, a dropped term) to one
file, and the suites that own the code it changes. The script copies the
tracked files into a scratch folder, builds them once there (the CPU layer,
release, as scripts/build.sh builds; for the GPU code, whose suites are
named gpu_*, the emulated GPU's build, as scripts/emulated.sh builds), then
for each mutation edits the copy, builds again, runs the owning suites, and
puts the file back. A mutation is
caught when a suite fails (or the build does), and survives when every
suite passes. By hand, not in CI (each mutation is a rebuild and a run of
its suites: minutes):

  python3 scripts/mutate.py                  # every mutation
  python3 scripts/mutate.py --only val_sum   # those named
  python3 scripts/mutate.py --list           # the list, nothing run

The scratch folder (--dir, default /tmp/zf-mutants) keeps its build between
runs; it is refreshed from the working tree's files each time. Ends with
"caught N of M" and exits 1 if any survived.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, file, text, mutated text, owning suites, what it breaks). `text`
# occurs exactly once in `file`.
MUTATIONS = [
    # train/: what every run does around its loop
    ("val_sum", "common/train/training_run.cpp",
     "loss = global_mean_loss(ctx_.comm, ctx_.dev, sum, cfg_.val_batches);",
     "loss = global_mean_loss(ctx_.comm, ctx_.dev, sum, 1);",
     ["dp", "val_loss_torch_py"], "the held-out sum not divided by the number of batches"),
    ("val_batch", "common/train/training_run.cpp",
     "rc.load_val(b);", "rc.load_val(0);",
     ["dp", "val_loss_torch_py"], "held-out batch 0 evaluated every time"),
    ("dry_fill", "common/train/training_run.cpp",
     "  if (ctx.hooks && ctx.hooks->dry()) {  // its states hold no values: nothing to fill them with\n"
     "    ctx.hooks->start(0);\n    return;\n  }\n", "",
     ["faults"], "a dry run's states filled from the initial state (a 70-billion-value draw)"),
    ("sample_seed", "common/train/training_run.cpp",
     "sample_uniform(sc.seed, uint64_t(i))", "sample_uniform(cfg_.seed, uint64_t(i))",
     ["sample"], "samples drawn with --seed instead of --sample-seed"),
    ("async_vote", "common/train/training_run.cpp",
     "const int64_t written = sharded_ ? int64_t(sharded_->written()) : 1;",
     "const int64_t written = 1;",
     ["checkpoint", "signals"], "an async sharded save committed before every rank's file is on disk"),
    # the stages' own code
    ("zero1_decay", "01_zero1/sharded_adamw.cpp",
     "step, scale, p.decay);", "step, scale, true);",
     ["zero1"], "ZeRO-1's AdamW decaying the LayerNorm weights and biases too"),
    ("zero2_overlap", "02_zero2/sharded_grads.cpp",
     "while (inflight_.size() > 1) complete_oldest();", "while (inflight_.size() > 2) complete_oldest();",
     ["zero2"], "two reduce-scatters kept in flight: a third full gradient alive at the peak"),
    ("hsdp_groups", "04_fsdp/fsdp.cpp",
     "group_owned = world.split(world.rank() / F, world.rank());",
     "group_owned = world.split(world.rank() % F, world.rank());",
     ["fsdp"], "the shard groups cut across the replicas instead of along them"),
    ("hsdp_wait", "04_fsdp/flat_grads.cpp",
     "if (crossing_.size() <= in_flight) return std::nullopt;", "if (crossing_.empty()) return std::nullopt;",
     ["fsdp"], "hybrid sharding's all-reduce across the groups waited for at once, on the compute thread"),
    ("offload_copy", "05_offload/host_adamw.cpp",
     "copy ? copy + i : nullptr", "nullptr",
     ["offload"], "the CPU's AdamW never rounding into the bf16 copy the device receives"),
    # estimate/: the estimator
    ("estimate_cross", "common/estimate/estimate.cpp",
     "est.comm_cross_group = reductions * 2 * ring(int(R)) * r * S;",
     "est.comm_cross_group = reductions * ring(int(R)) * r * S;",
     ["estimate"], "the cross-group all-reduce counted as one pass of the ring"),
    # io/: files
    ("index_overlap", "common/io/sharded_checkpoint.cpp",
     "USAGE_REQUIRE(offset == covered,", "USAGE_REQUIRE(offset <= covered,",
     ["checkpoint"], "a sharded index whose pieces overlap accepted"),
    # launch/: flags
    ("min_lr_at_lr", "common/launch/cli.cpp",
     "cfg.min_lr >= 0 && cfg.min_lr <= cfg.lr", "cfg.min_lr >= 0 && cfg.min_lr < cfg.lr",
     ["cli"], "--min-lr equal to --lr refused"),
    # modeled/: the modeled clock
    ("nic_cap", "common/modeled/collective_cost.cpp",
     "std::min(node_bw, nics * per_node * hw.inter_node_busbw_gb_per_s)",
     "nics * per_node * hw.inter_node_busbw_gb_per_s",
     ["clock"], "the inter-node bus bandwidth not capped by NVLink's"),
    ("kind_busbw", "common/modeled/collective_cost.cpp",
     ": kind == CollectiveKind::reduce_scatter ? hw.intra_node_reduce_scatter_busbw_gb_per_s",
     ": kind == CollectiveKind::reduce_scatter ? hw.intra_node_all_gather_busbw_gb_per_s",
     ["clock"], "a reduce-scatter at the all-gather's bus bandwidth"),
    ("nccl_ll_cap", "common/modeled/collective_cost.cpp",
     "p == LL ? std::min(ll_most, 0.5 * bw)", "p == LL ? 0.5 * bw",
     ["clock"], "NCCL's LL protocol not capped at its most bandwidth"),
    ("nccl_tree_log", "common/modeled/collective_cost.cpp",
     "std::max(0, log2_down(nodes)) * kTree[p].net", "(nodes - 1) * kTree[p].net",
     ["clock"], "NCCL's tree all-reduce charged a step a node, as a ring"),
    ("sms_overlap", "common/modeled/modeled_clock.cpp",
     "if (b > a) late += op.extra * uncovered(a, b, op.charged) / (op.end - op.start);", "if (b > a) late += op.extra;",
     ["clock"], "an op beside a collective charged the SMs it lent for all its time, not the overlap"),
    ("sms_waves", "common/modeled/modeled_clock.cpp",
     "std::ceil(tiles / (sms > 0 ? sms : hw.sm_count))", "std::ceil(tiles / hw.sm_count)",
     ["clock"], "a product beside a collective run in waves of all the SMs"),
    ("gemm_waves", "common/modeled/modeled_clock.cpp",
     "const double waves = std::ceil(tiles / (sms > 0 ? sms : hw.sm_count));",
     "const double waves = tiles / (sms > 0 ? sms : hw.sm_count);",
     ["clock"], "a matrix product's last wave of tiles charged only for the SMs it uses"),
    ("flash_rate", "common/modeled/modeled_clock.cpp",
     "(backward ? hw.flash_backward_tflops : hw.flash_forward_tflops)", "hw.flash_forward_tflops",
     ["clock"], "flash attention's backward at the forward's rate"),
    ("link_free", "common/modeled/modeled_comm.cpp",
     "e.end = std::max({queue_end_, e.ready, e.after_end, start}) + e.seconds;",
     "e.end = std::max(queue_end_, e.ready) + e.seconds;",
     ["clock"], "two queues' collectives each at a shared link's full rate"),
    ("cpu_twice", "common/modeled/modeled_clock.cpp",
     "worker_.t = std::max(worker_.t, end);", "(void)end;",
     ["clock"], "the delayed update's worker and the host each on the whole CPU at once"),
    ("pinned_side", "common/modeled/modeled_device.cpp",
     "copy_seconds(clock_.hardware(), bytes, is_pinned(src)), false);",
     "copy_seconds(clock_.hardware(), bytes, is_pinned(dst)), false);",
     ["clock"], "a copy's pinned rate read from the device side"),
    ("one_queue", "common/modeled/modeled_clock.cpp",
     "if (queues_ > 0)", "if (queues_ > 1)",
     ["clock"], "each queue's busy time only with more than one second queue"),
    ("mfu_peak", "common/launch/runner.cpp",
     "peak * 1e12 * world.size,", "peak * 1e12,",
     ["clock"], "MFU's peak not multiplied by the number of ranks"),
    ("ring_lat", "common/modeled/modeled_clock.cpp",
     "double(n - nodes) * intra_lat + double(nodes - 1) * inter_lat;",
     "double(n - 1) * intra_lat;",
     ["clock"], "the ring's node crossings charged NVLink's latency"),
    # 05's extensions: the disk tier
    ("checksum_tail", "05_offload/extensions/disk_tier.cpp",
     "for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;", "",
     ["offload"], "a chunk's checksum skipping the bytes after its last whole word"),
    ("disk_free_one_rank", "05_offload/extensions/offload.cpp",
     "size_t(ctx.world) * DiskTier::disk_bytes(", "DiskTier::disk_bytes(",
     ["offload", "signals"], "the free-space check counting one rank's files, not every rank's"),
    # core/ and cpu/: the arithmetic
    ("adamw_eps", "common/core/adamw_kernel.h",
     "std::sqrt(vi) / s.bias2_sqrt + s.eps;", "std::sqrt(vi) / s.bias2_sqrt;",
     ["adamw", "optim"], "AdamW without its epsilon"),
    ("layernorm_eps", "common/cpu/kernels_cpu.cpp",
     "1.0f / std::sqrt(v + 1e-5f);", "1.0f / std::sqrt(v + 1e-3f);",
     ["kernels", "reference"], "layernorm's epsilon 100 times too large"),
    ("shard_begin", "common/core/shard.cpp",
     "us.begin = std::min(u.numel, size_t(rank) * us.shard);",
     "us.begin = std::min(u.numel, size_t(rank) * us.shard + (rank > 0 ? 1 : 0));",
     ["memory", "zero3"], "each shard after the first starting one element late"),
    # comm/: the bytes a collective is counted for
    ("ring_bytes", "common/comm/comm.cpp",
     "case CollectiveKind::all_reduce: return 2.0 * (n - 1.0) / n * b;",
     "case CollectiveKind::all_reduce: return (n - 1.0) / n * b;",
     ["comm"], "an all-reduce counted as one pass of the ring"),
    # cuda/: the GPU code, on the emulated GPU (tests/emu)
    ("gpu_map_bound", "common/cuda/kernels_cuda_elementwise.cu",
     "  if (i >= n) return;\n  const float y = Op::kUsesB", "  if (i > n) return;\n  const float y = Op::kUsesB",
     ["gpu_kernels"], "an elementwise kernel's thread n writing one element past the end"),
    ("gpu_tree_barrier", "common/cuda/internal/kernels_cuda_util.cuh",
     "  shared[ty][tx] = x;\n  __syncthreads();\n", "  shared[ty][tx] = x;\n",
     ["gpu_kernels"], "a column sum reading shared memory before every row has written it"),
    ("gpu_gemm_transpose", "common/cuda/kernels_cuda_matmul.cu",
     "gemm<F, F>(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC,", "gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, IC,",
     ["gpu_kernels"], "the matmul forward multiplying by the weight untransposed"),
    ("gpu_copy_wait", "common/cuda/device_cuda.cu",
     "    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, issued, 0));\n", "",
     ["gpu_kernels"], "a copy on the copy stream not waiting for the kernels issued before it"),
    ("nccl_count", "common/cuda/nccl/comm_nccl_collectives.cpp",
     "return ncclAllReduce(buf, buf, count, t, o, c, s);", "return ncclAllReduce(buf, buf, count - 1, t, o, c, s);",
     ["gpu_comm"], "NCCL's all-reduce given one element too few"),
    ("nccl_ready_wait", "common/cuda/nccl/comm_nccl_collectives.cpp",
     "    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));\n", "",
     ["gpu_comm"], "a collective not waiting for the compute stream's work on its input"),
    ("nccl_settle", "common/cuda/nccl/comm_nccl_collectives.cpp",
     "  if (result == ncclSuccess) return;\n", "  if (result == ncclSuccess || result == ncclInProgress) return;\n",
     ["gpu_comm"], "a call on a non-blocking communicator before NCCL has enqueued the one before"),
    ("nccl_host_wait", "common/cuda/nccl/comm_nccl_collectives.cpp",
     "      CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, op.done, 0));\n      return true;\n",
     "      return false;\n",
     ["gpu_comm"], "CommHandle::wait() waiting on the host instead of ordering the compute stream"),
    ("nccl_split_stream", "common/cuda/nccl/comm_nccl.cpp",
     "  made->set_compute_stream(compute_stream_);\n", "",
     ["gpu_comm"], "a split's child ordered after the default stream, not the rank's"),
    ("gpu_peer_access", "common/cuda/comm_threads_cuda.cu",
     "const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);", "const cudaError_t e = cudaSuccess;",
     ["gpu_comm_threads"], "virtual ranks on several GPUs without peer access to each other's cudaMalloc'd memory"),
    ("gpu_pool_access", "common/cuda/comm_threads_cuda.cu",
     "      CUDA_CHECK(cudaMemPoolSetAccess(pool_b, &from_a, 1));\n", "",
     ["gpu_comm_threads"], "virtual ranks on several GPUs without access to each other's memory pools"),
    ("gpu_nccl_last_update", "03_zero3/zero3.cpp",
     "    for (int u = 0; u < U; ++u)\n      states.opt.update(",
     "    for (int u = 0; u < U && step + 1 < cfg.steps; ++u)\n      states.opt.update(",
     ["gpu_stages_nccl_fp32"], "ZeRO-3 skipping its last update, which over NCCL only the held-out loss after it sees"),
]


def run(cmd, cwd=None, quiet=True):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not quiet:
        sys.stdout.write(p.stdout)
    return p


def refresh_copy(src):
    """The working tree's files (tracked and new, not ignored) into src, each only when it differs."""
    listed = run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    if listed.returncode:
        sys.exit("mutate.py: git ls-files failed: " + listed.stdout)
    for f in filter(None, listed.stdout.split("\0")):
        a, b = os.path.join(ROOT, f), os.path.join(src, f)
        if not os.path.isfile(a):
            continue
        if os.path.isfile(b) and os.path.getsize(a) == os.path.getsize(b):
            with open(a, "rb") as x, open(b, "rb") as y:
                if x.read() == y.read():
                    continue
        os.makedirs(os.path.dirname(b), exist_ok=True)
        # Copied now (not with the tree's time, as copy2 would): newer than
        # the copy's last build, which may postdate the tree's edit.
        shutil.copy(a, b)


def on_gpu(suites):
    return bool(suites) and all(x.startswith("gpu_") for x in suites)


# The CPU build, and the emulated GPU's as scripts/emulated.sh sets it up
# (only the GPU suites' tests are built: its stages and tools would take
# most of its build).
SETUP = {False: ["--buildtype=release", "-Dcuda=disabled", "-Dnccl=disabled"],
         True: ["--native-file", os.path.join(ROOT, "scripts", "emulated.ini")]}


def build(build_dir, gpu, suites=()):
    # Every gpu_stages* test runs gpu_stages' binary.
    targets = ["tests/test_" + ("gpu_stages" if x.startswith("gpu_stages") else x) for x in suites] if gpu else []
    p = run(["ninja", "-C", build_dir] + targets)
    return p.returncode == 0, p.stdout[-3000:]


GPU_SUITES = ["gpu_kernels", "gpu_comm", "gpu_stages"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/zf-mutants", help="the scratch folder (a copy and its build)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    ap.add_argument("--list", action="store_true", help="print the mutations and stop")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m[0] in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        known = {m[0] for m in MUTATIONS}
        sys.exit("mutate.py: no mutation named " + ", ".join(sorted(set(args.only) - known)) + " (--list)")
    if args.list:
        for name, file, _, _, suites, what in chosen:
            print(f"{name:20} {file:45} {' '.join(suites):20} {what}")
        return 0

    src = os.path.join(args.dir, "src")
    dirs = {False: os.path.join(args.dir, "build"), True: os.path.join(args.dir, "build-emu")}
    os.makedirs(src, exist_ok=True)
    refresh_copy(src)
    # A mutation's suites are all of one build.
    for name, _, _, _, suites, _ in chosen:
        if any(x.startswith("gpu_") for x in suites) and not on_gpu(suites):
            sys.exit(f"mutate.py: {name}: its suites mix GPU (gpu_*) and CPU suites: split it")
    # Each mutation's text must be where the list says, once, before anything is built.
    for name, file, text, _, _, _ in chosen:
        with open(os.path.join(src, file)) as f:
            n = f.read().count(text)
        if n != 1:
            sys.exit(f"mutate.py: {name}: its text occurs {n} times in {file} (once expected): update the list")
    kinds = sorted({on_gpu(m[4]) for m in chosen})
    for gpu in kinds:
        if not os.path.isfile(os.path.join(dirs[gpu], "build.ninja")):
            p = run(["meson", "setup", dirs[gpu]] + SETUP[gpu], cwd=src)
            if p.returncode:
                sys.exit("mutate.py: meson setup failed:\n" + p.stdout[-3000:])
        print(f"building the unmutated copy in {dirs[gpu]} ...", flush=True)
        ok, out = build(dirs[gpu], gpu, GPU_SUITES)
        if not ok:
            sys.exit("mutate.py: the unmutated copy does not build:\n" + out)

    survived = []
    for name, file, text, mutated, suites, what in chosen:
        path = os.path.join(src, file)
        with open(path) as f:
            original = f.read()
        start = time.time()
        gpu = on_gpu(suites)
        build_dir = dirs[gpu]
        try:
            with open(path, "w") as f:
                f.write(original.replace(text, mutated, 1))
            ok, _ = build(build_dir, gpu, suites)
            if not ok:
                verdict = "caught (the build)"
            else:
                p = run(["meson", "test", "-C", build_dir, "--no-rebuild", "--num-processes", "2"] + suites)
                verdict = "caught" if p.returncode else "SURVIVED"
        finally:
            with open(path, "w") as f:
                f.write(original)
            os.utime(path)  # newer than its mutated build: the next build compiles it again
        if verdict == "SURVIVED":
            survived.append(name)
        print(f"{verdict:20} {name:20} {' '.join(suites):18} {what} ({time.time() - start:.0f} s)", flush=True)
    for gpu in kinds:
        build(dirs[gpu], gpu, GPU_SUITES)  # the copy's builds as the tree's again
    print(f"caught {len(chosen) - len(survived)} of {len(chosen)}" +
          (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
