#!/usr/bin/env python3
"""lab_check.py: checks a lab of docs/labs/ on a real run. It runs the lab's
stage executable (or the student's, --binary) with --log-json into a
temporary folder, reads the run log's summary (docs/SPEC.md section 11) and
checks (a) each --predict KEY=VALUE against the measured value, printing
both, and (b) the lab's own properties: the memory and communication
formulas of SPEC sections 7-8 (scripts/lab_formulas.py, computed from the
preset's shape, never from the code under test) and parity with stage 00's
run at the same flags. Standard library only.

    python3 scripts/lab_check.py LAB [--build DIR] [--binary PATH] [--predict KEY=VALUE ...]
                                 [--ranks N] [--precision fp32|bf16] [--grad-accum K] [--model tiny|small]
                                 [--stage-flags "FLAGS"] [--reference PATH] [--logs DIR] [--tests]
    python3 scripts/lab_check.py --check-refs [LAB_FILE ...]
    python3 scripts/lab_check.py --list

LAB is 0-8 (or lab3, or a name: setup, dp, zero1, zero2, zero3, fsdp,
offload, hybrid, time). A VALUE may be arithmetic (16*136960, 2*(4-1)/4*547840).
A student's executable (--binary) in labs 2-7 is checked at the lab's
rank count and again at --ranks 3 (lab 7: --ranks 6 --shard-group 3),
where tiny's units are padded (unless --ranks names one count).
Exit 0 with "lab N: passed (k checks)"; 1 with one FAIL line per failed
check (expected, measured, what to look at); 2 for a usage error.
"""
import argparse
import ast
import json
import math
import operator
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lab_formulas as F  # noqa: E402
import lab_refs  # noqa: E402
from lab_specs import LABS, Usage, by_name, phases  # noqa: E402

ROOT = os.path.dirname(HERE)
STEPS = 3   # enough for three updates, and quick
BATCH = 2


# ---- predictions -----------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def arithmetic(text):
    """The value of a prediction: a number or +-*/ // ** () over numbers."""
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.operand))
        raise ValueError
    try:
        return ev(ast.parse(text.replace("_", ""), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError):
        raise Usage(f"--predict: '{text}' is not a number or arithmetic on numbers")


def measured_values(summary, steps=()):
    """Every key a lab may accept, from rank 0's entries of the summary, and
    the time lab's from its measured step (modeled times)."""
    mem, comm = summary["memory"][0], summary["comm"][0]
    dev, host = mem["device"], mem["host"]
    by = comm.get("by_collective", {})
    moved = comm.get("transfers_per_step", {})
    return {
        "P": summary["params"],
        "model_states": dev["model_states"],
        "params_bytes": dev["params"]["current"],
        "grads_bytes": dev["grads"]["current"],
        "optimizer_bytes": dev["optimizer"]["current"],
        "activations": dev["activations"]["peak"],
        "comm_peak": dev["comm"]["peak"],
        "gathered_peak": dev["gathered"]["peak"],
        "device_peak": dev["peak_total"],
        "host_model_states": host["model_states"],
        "all_reduce": by.get("all_reduce", 0.0),
        "reduce_scatter": by.get("reduce_scatter", 0.0),
        "all_gather": by.get("all_gather", 0.0),
        "bytes_per_step": comm["bytes_per_step"],
        "to_host_bytes": moved.get("to_host_bytes", 0.0),
        "to_device_bytes": moved.get("to_device_bytes", 0.0),
        **(phases(steps) if steps else {}),
    }


# ---- running ---------------------------------------------------------------

class RunLog:
    def __init__(self, path, cmd):
        self.cmd = cmd
        self.steps, self.summary = [], None
        with open(path, encoding="utf-8") as f:
            for line in f:
                obj = json.loads(line)
                if "summary" in obj:
                    self.summary = obj["summary"]
                elif "step" in obj:  # not an evaluation's {"val": ...}
                    self.steps.append(obj)
        if self.summary is None:
            raise RuntimeError(f"{path}: no summary line")


class RunFailed(Exception):
    pass


def stage_env():
    return dict(os.environ, ZF_OVERSUBSCRIBE="1")  # a lab's ranks may outnumber the cores


# The run logs of the runs made so far in this process, by executable (its
# path, size and time) and flags: a lab checked again in one process (the
# labs test checks each lab many times, with other predictions) reads the
# same run's log again instead of training again. Only runs that succeeded.
_logs = {}


def run_stage(binary, flags, folder, name):
    log = os.path.join(folder, name + ".jsonl")
    cmd = [binary] + flags + ["--quiet", "--log-json", log]
    try:
        st = os.stat(binary)
        key = (os.path.abspath(binary), st.st_size, st.st_mtime_ns, tuple(flags))
    except OSError:
        key = None
    if key in _logs:
        with open(log, "w", encoding="utf-8") as f:
            f.write(_logs[key])
        return RunLog(log, shlex.join(cmd))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stage_env(), timeout=300)
    except OSError as e:
        raise RunFailed(f"cannot run {binary}: {e.strerror}")
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{shlex.join(cmd)} ran past 300 s")
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RunFailed(f"{shlex.join(cmd)} exited with {p.returncode}: {tail}")
    run = RunLog(log, shlex.join(cmd))
    if key is not None:
        with open(log, encoding="utf-8") as f:
            _logs[key] = f.read()
    return run


class Checks:
    """The results, in order: (ok, line)."""

    def __init__(self):
        self.results = []
        self.where = ""  # the configuration, when a lab is checked at more than one ("N=3: ")
        self.student = False  # checking a student's executable (--binary)
        self.optional = ""  # while set: what the checks are, not required of a student's executable

    def add(self, ok, what, expected, measured, look):
        what = self.where + what
        if not ok and self.optional and self.student:
            self.results.append((True, f"  note  {what}: expected {expected}, measured {measured}; "
                                       f"{self.optional}, not required of your change: see {look}"))
            return
        if ok:
            self.results.append((True, f"  ok    {what}: {measured}"))
        else:
            # A student's file is in their checkout; where it points into the stage, that is the
            # stage's own version, to compare with.
            where = f"compare with {look}" if self.student else f"look at {look}"
            self.results.append((False, f"  FAIL  {what}: expected {expected}, measured {measured}; {where}"))

    def prediction(self, key, predicted, measured, look, rel=None):
        """A student's number: exact for bytes (up to the double division of (N-1)/N); a modeled
        time within rel."""
        ok = abs(float(predicted) - float(measured)) <= (rel * abs(measured) if rel else
                                                         max(0.01, 1e-9 * abs(measured)))
        line = f"{self.where}prediction {key}: predicted {fmt(predicted)}, measured {fmt(measured)}"
        self.results.append((ok, f"  ok    {line}" if ok else f"  FAIL  {line}; look at {look}"))

    def estimate(self, key, predicted, measured):
        """A student's estimate: how far off, never a failure."""
        off = 100 * (float(predicted) - float(measured)) / float(measured) if measured else float("inf")
        self.results.append((True, f"  note  {self.where}estimate {key}: predicted {fmt(predicted)}, measured "
                                   f"{fmt(measured)}, off by {off:+.1f} % (an estimate: not checked)"))

    def equal(self, what, expected, measured, look, tol=0.01):
        """Bytes: equal up to the double division of (N-1)/N (tol in bytes)."""
        ok = measured is not None and abs(float(expected) - float(measured)) <= tol
        self.add(ok, what, fmt(expected), fmt(measured), look)

    def close(self, what, expected, measured, rel, look):
        ok = abs(expected - measured) <= rel * max(abs(expected), 1e-30)
        self.add(ok, what + f" (within {rel:g} relative)", f"{expected:.9g}", f"{measured:.9g}", look)

    @property
    def failed(self):
        return [line for ok, line in self.results if not ok]


def fmt(x):
    if x is None:
        return "nothing"
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return f"{x:,}" if isinstance(x, int) else (f"{x:,.4f}" if isinstance(x, float) else str(x))


# ---- the command line ------------------------------------------------------

def parse_stage_flags(lab, text):
    """--stage-flags: the lab's extra flags, those its formulas know."""
    words = []
    for w in shlex.split(text or ""):  # --recompute=full is --recompute full
        words += w.split("=", 1) if w.startswith("--") and "=" in w else [w]
    opts, i = {}, 0
    while i < len(words):
        w = words[i]
        spec = lab.extra_flags.get(w) or F_COMMON.get(w)
        if spec is None:
            known = sorted(set(lab.extra_flags) | set(F_COMMON))
            raise Usage(f"--stage-flags: lab {lab.number} does not know {w} (it knows {', '.join(known)})")
        if spec is bool:
            opts[w] = True
            i += 1
            continue
        if i + 1 >= len(words):
            raise Usage(f"--stage-flags: {w} needs a value")
        v = words[i + 1]
        if isinstance(spec, tuple) and v not in spec:
            raise Usage(f"--stage-flags: {w} takes {'|'.join(spec)}, not {v}")
        if spec is int:
            try:
                v = int(v)
            except ValueError:
                raise Usage(f"--stage-flags: {w} takes a whole number, not {v}")
        opts[w] = v
        i += 2
    return opts


F_COMMON = {"--recompute": ("none", "full", "attn"), "--attention": ("simple", "flash")}


def flags_of(cfg, opts, stage_specific=True):
    out = ["--model", cfg["model"], "--ranks", str(cfg["ranks"]), "--precision", cfg["precision"],
           "--grad-accum", str(cfg["grad_accum"]), "--batch", str(BATCH), "--steps", str(STEPS)]
    for k, v in opts.items():
        if k in F_COMMON or stage_specific:
            out += [k] if v is True else [k, str(v)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="lab_check.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lab", nargs="?", help="0-8, labN, or a name (--list shows them)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the Meson build folder (default build/)")
    ap.add_argument("--binary", help="the executable to check instead of the lab's stage (yours)")
    ap.add_argument("--reference", help="the stage-00 executable the parity checks compare with "
                    "(default BUILD/00_data_parallel/dp; it must not be --binary)")
    ap.add_argument("--predict", nargs="+", default=[], metavar="KEY=VALUE", help="your predictions")
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--precision", choices=("fp32", "bf16"))
    ap.add_argument("--grad-accum", type=int)
    ap.add_argument("--model", choices=sorted(F.PRESETS))
    ap.add_argument("--stage-flags", default="", help='more flags, those the lab lists, e.g. "--prefetch 0"')
    ap.add_argument("--logs", help="keep the run logs in this folder (default: a temporary one)")
    ap.add_argument("--tests", action="store_true", help="also run the stage's meson test")
    ap.add_argument("--check-refs", nargs="*", metavar="LAB_FILE", help="check the labs' reading references")
    ap.add_argument("--list", action="store_true", help="the labs and the keys each accepts")
    a = ap.parse_args(argv)
    try:
        if a.check_refs is not None:
            return check_refs(a.check_refs)
        if a.list:
            for lab in LABS:
                print(f"lab {lab.number} ({lab.name}): {lab.title}; keys: {', '.join(lab.keys)}")
            return 0
        if a.lab is None:
            raise Usage("name a lab (0-8), or give --check-refs or --list")
        return check_lab(a)
    except Usage as e:
        print(f"lab_check.py: error: {e}", file=sys.stderr)
        return 2


def check_refs(files):
    """Every lab's references, or those of the given lab files (their
    repository: the folder above their docs/labs/)."""
    count, problems = 0, []
    for doc in [os.path.abspath(f) for f in files] or lab_refs.lab_docs():
        count += len(lab_refs.references(doc))
        problems += lab_refs.check_doc(doc, os.path.dirname(os.path.dirname(os.path.dirname(doc))))
    for p in problems:
        print(p)
    if problems:
        print(f"references: {len(problems)} of {count} stale")
        return 1
    print(f"references: all {count} found")
    return 0


def fits(checks, binary, flags, budget, look):
    """What fits: the run trains within --device-mem of the device peak's formula, and stops out of
    memory (exit 3, SPEC section 10) with one byte less."""
    for size, want, what in ((budget, 0, "trains"), (budget - 1, 3, "stops out of memory (exit 3)")):
        cmd = [binary] + flags + ["--quiet", "--device-mem", str(int(size))]
        try:
            p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=stage_env(),
                               timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RunFailed(f"{shlex.join(cmd)}: {e}")
        tail = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        checks.add(p.returncode == want, f"--device-mem {int(size)} {what}", f"exit {want}",
                   f"exit {p.returncode}" + (f" ({tail[:120]})" if p.returncode else ""), look)


def check_config(lab, cfg, opts, binary, dp, folder, checks, predictions, tag, build):
    """The lab's runs at one configuration, and their checks (a line each, into checks)."""
    try:
        runs = {}
        for name, who, extra in lab.runs(cfg, opts):
            b = binary if who == "student" else dp if who == "dp" else os.path.join(build, who)
            flags = extra if extra is not None else flags_of(cfg, opts, who == "student")
            runs[name] = run_stage(b, flags, folder, tag + name)
            print(f"  run   {name}: {os.path.relpath(b)} {shlex.join(flags)}")
        values = {}
        for name, r in runs.items():
            for k, v in measured_values(r.summary, r.steps).items():
                values[f"{name}.{k}"] = v
                if name == "main":
                    values[k] = v
        for key, predicted in predictions:
            if key in lab.estimate_keys:
                checks.estimate(key, predicted, values[key])
            else:
                checks.prediction(key, predicted, values[key], lab.keys[key],
                                  lab.time_rel if key.endswith("_ms") else None)
        lab.properties(checks, runs, cfg, opts)
        budget = lab.device_budget(cfg, opts, runs)
        if budget is not None:
            fits(checks, binary, flags_of(cfg, opts), budget, lab.budget_look)
    except RunFailed as e:
        checks.add(False, "the run", "a run that trains", str(e), lab.on_failure)


def check_lab(a):
    lab = by_name(a.lab)
    if lab is None:
        raise Usage(f"no lab '{a.lab}': give 0-8, labN, or one of {', '.join(x.name for x in LABS)}")
    cfg = dict(lab.defaults)
    for k in ("ranks", "precision", "grad_accum", "model"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    if cfg["ranks"] < 1 or cfg["grad_accum"] < 1:
        raise Usage("--ranks and --grad-accum must be 1 or more")
    opts = parse_stage_flags(lab, a.stage_flags)
    lab.validate(cfg, opts)
    predictions = []
    for p in a.predict:
        key, eq, value = p.partition("=")
        if not eq:
            raise Usage(f"--predict {p}: write KEY=VALUE")
        if key not in lab.keys:
            raise Usage(f"--predict {key}: lab {lab.number} accepts {', '.join(lab.keys)}")
        predictions.append((key, arithmetic(value)))
    build = os.path.abspath(a.build)
    if a.binary and not lab.takes_binary:
        raise Usage(f"lab {lab.number} runs the stages of the build, no executable of yours: leave --binary out")
    binary = a.binary or (os.path.join(build, lab.stage) if lab.stage else None)
    if binary is None:
        raise Usage(f"lab {lab.number} checks your executable: give --binary PATH")
    if not os.access(binary, os.X_OK):
        raise Usage(f"{binary} is not an executable (build it: ninja -C {a.build} ...)")
    dp = os.path.abspath(a.reference or os.path.join(build, "00_data_parallel", "dp"))
    if lab.number >= 2 and os.path.realpath(binary) == os.path.realpath(dp):
        raise Usage(f"--binary {binary} is stage 00's executable, which the check also runs as the "
                    "reference for parity: build your version in a second checkout (git worktree add "
                    "../mine) and pass its executable, or name an unmodified dp with --reference")

    folder = a.logs or tempfile.mkdtemp(prefix=f"zf-lab{lab.number}-")
    os.makedirs(folder, exist_ok=True)
    checks = Checks()
    checks.student = bool(a.binary)
    print(f"lab {lab.number} ({lab.title})")
    # A student's executable is also checked where the preset's units are
    # padded (a wrong cut of the shards passes where nothing is padded),
    # unless --ranks names the one count to check.
    configs = [(cfg, opts)]
    if a.binary and a.ranks is None and lab.padded_ranks:
        other = {k: v for k, v in lab.padded_cfg.items() if getattr(a, k) is None}  # unless given
        configs.append((dict(cfg, ranks=lab.padded_ranks, **other), dict(opts, **lab.padded_flags)))
    try:
        for i, (c, o) in enumerate(configs):
            if i:
                flags = "".join(f" {k} {v}" for k, v in lab.padded_flags.items())
                flags += "".join(f" --{k.replace('_', '-')} {v}" for k, v in other.items())
                print(f"  at --ranks {c['ranks']}{flags}, where the units are padded")
                checks.where = f"N={c['ranks']}: "
            check_config(lab, c, o, binary, dp, folder, checks, predictions if i == 0 else [],
                         "padded_" if i else "", build)
    finally:
        if not a.logs:
            for f in os.listdir(folder):
                os.remove(os.path.join(folder, f))
            os.rmdir(folder)
    if a.tests and lab.test:
        p = subprocess.run(["meson", "test", "-C", build, lab.test], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        checks.add(p.returncode == 0, f"meson test {lab.test}", "exit 0", f"exit {p.returncode}",
                   f"meson test -C {a.build} {lab.test} --print-errorlogs")
    for _, line in checks.results:
        print(line)
    n, bad = len(checks.results), checks.failed
    if bad:
        print(f"lab {lab.number}: failed ({len(bad)} of {n} checks)")
        return 1
    print(f"lab {lab.number}: passed ({n} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
