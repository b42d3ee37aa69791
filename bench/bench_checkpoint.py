#!/usr/bin/python3
# bench_checkpoint.py: what a checkpoint costs in each format (docs/SPEC.md
# section 6), measured on the real executables (scripts/bench.sh
# --checkpoint runs it; results go in bench/RESULTS.md):
#
# - save and load: stage 03 trains one step at N ranks (B = 1) and saves it,
#   consolidated (gathered, rank 0 writes), sharded (every rank writes its
#   pieces) and sharded with --save-async; then a second run resumes from it.
#   The times are the run log's own ({"save": ms, write_ms}, {"load": ms});
#   the host memory is the peak resident size of the whole process (every
#   rank is a thread of it) above that of the same run without --save, and of
#   the resumed run above the same run started from the seeded model.
# - the steps of a run saving every 10 steps, sync against async: the median
#   step, the time the steps waited for the saves, and the whole run's wall
#   time.
# - the peer, in the same run when .venv-bench has PyTorch: torch.save and
#   safetensors' save_file of the same three float32 arrays (parameters and
#   the two moments) from one process, and torch.load back.
#
#   python3 bench/bench_checkpoint.py --build build --models small,gpt2 --ranks 1,2,4,8 --repeats 2 \
#       --skip gpt2:8:consolidated --markdown /tmp/ck.md
#
# The async format's load is the sharded one's (the same files), so it is
# not run again.

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util as rb  # noqa: E402

STAGE = "03_zero3/zero3"
FORMATS = [("consolidated", []), ("sharded", ["--save-format", "sharded"]),
           ("async", ["--save-format", "sharded", "--save-async"])]


def measured(cmd, timeout):
    """Runs cmd; (exit status, peak resident bytes of the process, seconds, output)."""
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=rb.base_env(), cwd=rb.ROOT)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                p.kill()
                pid, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, time.time() - t0, out.read()


def log_lines(path, key):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r[key] for r in records if key in r]


def run(args, model, n, extra, log, steps=1):
    cmd = [os.path.join(args.build, STAGE), "--model", model, "--ranks", str(n), "--batch", "1", "--steps",
           str(steps), "--quiet", "--log-json", log] + extra
    rc, rss, secs, out = measured(cmd, args.timeout)
    if rc != 0:
        raise RuntimeError("%s: exit %s: %s" % (" ".join(cmd), rc, rb.tail(out, 3)))
    return rss, secs


def mib(n):
    return "%.1f MiB" % (n / 2**20)


def size_of(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(b, f)) for b, _, fs in os.walk(path) for f in fs)


def save_and_load(args, folder, model, n):
    log = os.path.join(folder, "log.jsonl")
    base_rss, _ = run(args, model, n, [], log)
    rows = []
    for name, flags in FORMATS:
        if "%s:%d:%s" % (model, n, name) in args.skip.split(","):
            rows.append({"format": name, "skipped": True})
            continue
        out = os.path.join(folder, "ck.st" if name == "consolidated" else "ck_" + name)
        rss, _ = run(args, model, n, ["--save", out] + flags, log)
        save = log_lines(log, "save")[-1]
        load, load_rss = {"ms": None}, None
        if name != "async":  # the same files as sharded's
            load_rss, _ = run(args, model, n, ["--resume", out], log, steps=2)
            load = log_lines(log, "load")[-1]
        rows.append({"format": name, "bytes": size_of(out), "save_ms": save["ms"], "write_ms": save["write_ms"],
                     "save_rss": rss - base_rss, "load_ms": load["ms"],
                     "load_rss": None if load_rss is None else load_rss - base_rss})
        shutil.rmtree(out, ignore_errors=True) if os.path.isdir(out) else os.remove(out)
    return rows


def sync_against_async(args, folder):
    rows = []
    for name, flags in FORMATS[1:]:
        out = os.path.join(folder, "every_" + name)
        log = os.path.join(folder, "every.jsonl")
        _, secs = run(args, args.every_model, args.every_ranks, ["--save", out, "--save-every", "10"] + flags, log,
                      steps=args.every_steps)
        steps, _ = rb.read_log(log)
        saves = log_lines(log, "save")
        rows.append({"format": name, "median_ms": rb.timed_median(steps, 2), "saves": len(saves),
                     "waited_ms": sum(s["ms"] for s in saves), "written_ms": sum(s["write_ms"] for s in saves),
                     "wall_s": secs})
        shutil.rmtree(out, ignore_errors=True)
    return rows


PEER = r"""
import os, sys, time, torch
try:
    from safetensors.torch import save_file
except ImportError:
    save_file = None
P, folder = int(sys.argv[1]), sys.argv[2]
t = {k: torch.randn(P) for k in ("params", "m", "v")}
def timed(f):
    t0 = time.perf_counter(); f(); return (time.perf_counter() - t0) * 1e3
def save_sync(path):
    with open(path, "wb") as f:
        torch.save(t, f); f.flush(); os.fsync(f.fileno())
def save_st(path):
    save_file(t, path)
    fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
a = timed(lambda: save_sync(os.path.join(folder, "peer.pt")))
b = timed(lambda: save_st(os.path.join(folder, "peer.safetensors"))) if save_file else -1
c = timed(lambda: torch.load(os.path.join(folder, "peer.pt")))
print(a, b, c, torch.__version__)
"""


def peer(args, folder, params):
    py = os.path.join(rb.ROOT, ".venv-bench", "bin", "python")
    if not os.path.exists(py):
        return None
    r = subprocess.run([py, "-c", PEER, str(params), folder], capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        return {"error": rb.tail(r.stderr, 2)}
    a, b, c, version = r.stdout.split()
    return {"torch_save_ms": float(a), "safetensors_ms": float(b), "torch_load_ms": float(c), "torch": version}


def main():
    ap = argparse.ArgumentParser(description="What a checkpoint costs in each format: save, load, host memory.")
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default="small,gpt2")
    ap.add_argument("--ranks", default="1,2,4,8")
    ap.add_argument("--every-model", default="small")
    ap.add_argument("--every-ranks", type=int, default=2)
    ap.add_argument("--every-steps", type=int, default=60)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each cell; the one whose save waited least is shown")
    ap.add_argument("--markdown", default=os.path.join(rb.ROOT, "bench", "last_checkpoint.md"))
    ap.add_argument("--skip", default="", help="model:N:format runs not to make, comma-separated "
                    "(e.g. gpt2:8:consolidated, where N gathered copies do not fit in host memory)")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    folder = tempfile.mkdtemp(prefix="zf_bench_ck_", dir=args.dir)
    R = rb.R
    R.title("Checkpoints: consolidated, sharded, async")
    R.note("CPU: %s; %d cores; %.1f GiB; load before: %s; %s" % (rb.cpu_model(), os.cpu_count() or 0,
                                                            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                                                            rb.loadavg(), time.strftime("%Y-%m-%d")))
    try:
        for model in args.models.split(","):
            rows = []
            for n in [int(x) for x in args.ranks.split(",")]:
                tries = [save_and_load(args, folder, model, n) for _ in range(args.repeats)]
                for r in [min(cell, key=lambda x: x.get("save_ms") or 0) for cell in zip(*tries)]:
                    if r.get("skipped"):
                        rows.append([str(n), r["format"], "not run (--skip)"] + ["-"] * 5)
                        continue
                    rows.append([str(n), r["format"], mib(r["bytes"]), "%.0f" % r["save_ms"],
                                 "%.0f" % r["write_ms"], mib(r["save_rss"]),
                                 "-" if r["load_ms"] is None else "%.0f" % r["load_ms"],
                                 "-" if r["load_rss"] is None else mib(r["load_rss"])])
                    print(model, n, r, flush=True)
            R.line("")
            R.line("%s (stage 03, B = 1, fp32): one step, saved, then resumed." % model)
            R.table(["N", "format", "on disk", "steps waited (ms)", "written in (ms)", "save: host peak above no save",
                     "load (ms, rank 0)", "load: host peak above seeded"], rows,
                    [">", "<", ">", ">", ">", ">", ">", ">"])
            p = peer(args, folder, rb.read_log(os.path.join(folder, "log.jsonl"))[1]["params"])  # save_and_load's
            if p and "error" not in p:
                st = ("safetensors save_file %.0f ms, " % p["safetensors_ms"] if p["safetensors_ms"] >= 0
                      else "(no safetensors package), ")
                R.line("Peer, one process, torch %s, the same three float32 arrays of P elements: torch.save %.0f ms "
                       "(with fsync), %storch.load %.0f ms." % (p["torch"], p["torch_save_ms"], st, p["torch_load_ms"]))
            elif p:
                R.line("Peer failed: " + p["error"])
            else:
                R.line("Peer: not run (no .venv-bench; scripts/bench.sh --fsdp makes it).")
        rows = [[r["format"], rb.fmt_ms(r["median_ms"]), str(r["saves"]), "%.0f" % r["waited_ms"],
                 "%.0f" % r["written_ms"], "%.1f" % r["wall_s"]] for r in sync_against_async(args, folder)]
        R.line("")
        R.line("%s, N = %d, %d steps, --save-every 10, sharded:" % (args.every_model, args.every_ranks,
                                                                    args.every_steps))
        R.table(["format", "median step (ms)", "saves", "steps waited (ms, all saves)", "written in (ms, all saves)",
                 "run wall (s)"], rows, ["<", ">", ">", ">", ">", ">"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    R.write(args.markdown)
    print("wrote", args.markdown)


if __name__ == "__main__":
    main()
