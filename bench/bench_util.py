#!/usr/bin/python3
# bench_util.py: what the sections of bench/run_bench.py share (bench_fsdp.py's
# section D included): the report that prints and keeps markdown (R, one for
# the whole run), running a command with a timeout, reading a JSON-lines run
# log and its timing rule, number formats, the environments of the two sides
# (dp's own BLAS kernels; PyTorch's OPENBLAS_CORETYPE), the best of repeated
# runs, and the generated text corpus the loss cross-checks train on.
# Standard library only.

import json
import os
import re
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTEXT = {"tiny": 64, "small": 128, "gpt2": 1024}  # T of each preset (docs/SPEC.md): tokens per sequence
CROSSCHECK_TOL = 1e-4           # fp32 loss agreement expected per step (|ours - torch|)

# ---------------------------------------------------------------------------
# Output: everything printed also goes to the markdown report

class Report:
    def __init__(self):
        self.md = []

    def title(self, text):
        print("\n" + "=" * 78 + "\n" + text + "\n" + "=" * 78)
        self.md.append("\n## %s\n" % text)

    def line(self, text=""):
        print(text)
        self.md.append(text + "  " if text else "")

    def note(self, text):
        print(text)
        self.md.append("\n" + text + "\n")

    def pre(self, text):
        print(text.rstrip("\n"))
        self.md.append("\n```\n" + text.rstrip("\n") + "\n```\n")

    def table(self, headers, rows, aligns=None):
        """A table printed with padded columns, and as a markdown table."""
        cells = [[str(c) for c in r] for r in rows]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
        aligns = aligns or ["<"] + [">"] * (len(headers) - 1)

        def fmt(r):
            return "  ".join(("%-*s" if a == "<" else "%*s") % (w, c) for c, w, a in zip(r, widths, aligns))
        print(fmt(headers))
        print("  ".join("-" * w for w in widths))
        for r in cells:
            print(fmt(r))
        self.md.append("")
        self.md.append("| " + " | ".join(headers) + " |")
        self.md.append("|" + "|".join(":---" if a == "<" else "---:" for a in aligns) + "|")
        for r in cells:
            self.md.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
        self.md.append("")

    def write(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.md).lstrip("\n") + "\n")


R = Report()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def loadavg():
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "?"


def run(cmd, env=None, timeout=300, cwd=ROOT):
    """Runs cmd; returns (rc, stdout, stderr, seconds). rc None on timeout."""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err + "\n(timed out after %d s)" % timeout, time.time() - t0


def tail(text, n=6):
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return "\n".join(lines[-n:])


def read_log(path):
    """(per-step records, summary) of a JSON-lines run log."""
    steps, summary = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            if "summary" in obj:
                summary = obj["summary"]
            elif "step" in obj:  # not an evaluation's {"val": ...}
                steps.append(obj)
    return steps, summary


def timed_median(steps, warmup):
    ms = [s["ms"] for s in steps if s["step"] >= warmup]
    return statistics.median(ms) if ms else None


def plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def fmt_ms(x):
    return "-" if x is None else ("%.1f" % x if x >= 10 else "%.2f" % x)


def fmt_tps(x):
    return "-" if x is None else "%.0f" % x


def fmt_ratio(x):
    return "-" if x is None else "%.2fx" % x


def verdict(ok):
    return "n/a" if ok is None else ("MET" if ok else "MISSED")


# ---------------------------------------------------------------------------
# Environments: dp selects its own OpenBLAS kernels; PyTorch gets the same set
# through OPENBLAS_CORETYPE, or none ("as Debian ships it").

def base_env():
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "ZF_BLAS_REEXECED", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        env.pop(k, None)
    return env


def torch_env(coretype):
    env = base_env()
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch_ref's default too; explicit for the record
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def core_from_blas(blas):
    m = re.search(r"\((\w+) kernels", blas or "")
    return m.group(1) if m else None


# ---------------------------------------------------------------------------
# Repeats and the cross-checks' data

def best(results):
    ok = [r for r in results if r.get("median_ms")]
    if not ok:
        return results[-1] if results else {"error": "not run"}
    return min(ok, key=lambda r: r["median_ms"])


WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly mix bright potions "
         "under an old stone bridge near the river where children sing songs about distant mountains "
         "and ships carry spices silver and stories across the cold green sea").split()


def write_corpus(path, size=300 * 1024):
    """A deterministic text file of generated sentences (an LCG picks the words)."""
    state, parts, n = 12345, [], 0
    while n < size:
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        length = 5 + state % 9
        words = []
        for _ in range(length):
            state = (state * 1103515245 + 12345) & 0x7FFFFFFF
            words.append(WORDS[(state >> 8) % len(WORDS)])
        s = " ".join(words).capitalize() + (". " if state % 5 else ".\n")
        parts.append(s)
        n += len(s)
    data = "".join(parts).encode("ascii")[:size]
    with open(path, "wb") as f:
        f.write(data)
    return len(data)
