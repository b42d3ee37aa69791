#!/usr/bin/env python3
# fault_suite.py: every fault and bad input the project promises to survive,
# tried on the real executables, each with the nothing-lost checks of
# docs/RELIABILITY.md: the exit status and the words of the message; how long
# the run took to stop (from the signal, where there is one); every file that
# was there before is there after with the same bytes (inputs are never
# written); and the last good checkpoint
# still loads and resumes bit for bit (its resume equals an uninterrupted
# run's final parameters). A checkpoint the fault itself left (a signal's
# save) must resume bit for bit too.
#
#   python3 scripts/fault_suite.py --build build              # run all, print the table
#   python3 scripts/fault_suite.py --build build --write docs/RELIABILITY.md
#   python3 scripts/fault_suite.py --build build --only signal
#   python3 scripts/fault_suite.py --build build --xml results.xml   # the fault_suite test
#
# Exits non-zero if any case does not hold. Standard library only; the
# cases are in fault_cases.py. Cases that need mpirun or a mount namespace
# (for a small full disk) are skipped, saying why, where those are missing.

import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fault_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK_BEGIN = "<!-- fault table: scripts/fault_suite.py --write; do not edit by hand -->"
MARK_END = "<!-- end of fault table -->"
MODEL = "--model tiny --batch 1"


class Env:
    """The executables, the shared inputs, and the reference hashes."""

    def __init__(self, build, work):
        def binary(var, rel):
            return os.path.abspath(os.environ.get(var) or os.path.join(build, rel))
        self.bins = {"dp": binary("ZF_DP_BIN", "00_data_parallel/dp"),
                     "zero3": binary("ZF_ZERO3_BIN", "03_zero3/zero3"),
                     "fsdp": binary("ZF_FSDP_BIN", "04_fsdp/fsdp"),
                     "offload": binary("ZF_OFFLOAD_BIN", "05_offload/offload"),
                     "checkpoint": binary("ZF_CHECKPOINT_BIN", "tools/checkpoint")}
        self.mpirun = os.environ.get("ZF_MPIRUN") or shutil.which("mpirun")
        self.work = work
        self.env = dict(os.environ)
        # OpenMPI as root, on a machine with fewer cores than ranks, without
        # CMA (containers often forbid it), and without notes about unused
        # network components.
        self.env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                         "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                         "OMPI_MCA_btl_base_warn_component_unused": "0"})
        self.good = os.path.join(work, "good.st")
        self.data = os.path.join(work, "tokens.txt")
        with open(self.data, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 400)
        self.run_ok(f"{self.bins['dp']} {MODEL} --ranks 2 --quiet --steps 2 --data {self.data} --save {self.good}")
        self._straight = {}
        self.can_mount = subprocess.run(
            ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=4k none {work}"],
            capture_output=True).returncode == 0 if shutil.which("unshare") else False

    def run_ok(self, command):
        r = subprocess.run(command, shell=True, capture_output=True, text=True, env=self.env, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{command}: exit {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    def final_hash(self, flags, model=MODEL):
        """The final parameters' hash of `dp MODEL flags` (its run log's summary)."""
        log = os.path.join(self.work, f"hash-{time.monotonic_ns()}.jsonl")
        self.run_ok(f"{self.bins['dp']} {model} --quiet {flags} --log-json {log}")
        return read_log(log)["hash"]

    def straight_hash(self, steps, data, model=MODEL, ranks=2):
        key = (steps, data, model, ranks)
        if key not in self._straight:
            self._straight[key] = self.final_hash(
                f"--ranks {ranks} --steps {steps}" + (f" --data {data}" if data else ""), model)
        return self._straight[key]

    def resumes_bit_for_bit(self, checkpoint, data=None, model=MODEL, ranks=2, more=2):
        """Whether `checkpoint` loads and its resume for `more` steps on `ranks` ranks equals a run that
        never stopped."""
        step = checkpoint_step(checkpoint)
        if step is None:
            return False
        flags = f"--ranks {ranks} --steps {step + more}" + (f" --data {data}" if data else "")
        try:
            resumed = self.final_hash(flags + f" --resume {checkpoint}", model)
            return resumed == self.straight_hash(step + more, data, model, ranks)
        except RuntimeError:
            return False


def read_log(path):
    """Step count and the summary's hash of a run log (whole lines only)."""
    import json
    steps, digest = 0, None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "summary" in j:
                digest = j["summary"]["param_hash"]
            elif "step" in j:  # not an evaluation's {"val": ...}
                steps += 1
    return {"steps": steps, "hash": digest}


def checkpoint_step(path):
    """The step a training checkpoint says (its optim.step tensor; a sharded folder's index, through its
    `latest`), or None if it does not parse."""
    import json
    import struct
    try:
        if os.path.isdir(path):
            with open(os.path.join(path, "latest")) as f:
                with open(os.path.join(path, f.read().strip(), "index.json")) as g:
                    return int(json.load(g)["step"])
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            t = header["optim.step"]
            f.seek(8 + n + t["data_offsets"][0])
            return struct.unpack("<q", f.read(8))[0]
    except (OSError, ValueError, KeyError, struct.error):
        return None


def snapshot(folder):
    """Every file under `folder` and the SHA-256 of its bytes."""
    out = {}
    for base, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(base, name)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def run_case(env, case):
    """Runs one case in a folder of its own; returns its table row and the problems found."""
    folder = tempfile.mkdtemp(prefix=re.sub(r"[^a-z0-9]+", "-", case.name.lower()).strip("-") + "-", dir=env.work)
    shutil.copy(env.good, os.path.join(folder, "good.st"))
    shutil.copy(env.data, os.path.join(folder, "tokens.txt"))
    ctx = fault_cases.Context(env, folder)
    try:
        return run_in(env, case, folder, ctx)
    finally:
        for cleanup in ctx.cleanups:
            cleanup()


def run_in(env, case, folder, ctx):
    if case.setup:
        case.setup(ctx)
    before = snapshot(folder)
    command = case.command(ctx)
    t0 = time.monotonic()
    if case.signals:
        status, output = run_signalled(env, command, case.signals, ctx)
    else:
        r = subprocess.run(command, shell=True, capture_output=True, text=True, env=env.env, timeout=300,
                           cwd=folder)
        status, output = r.returncode, r.stdout + r.stderr
    seconds = time.monotonic() - (ctx.fault_at or t0)  # from the signal, where there is one
    problems = [p for check in ctx.checks for p in check()]
    if status not in case.exit_codes:
        problems.append(f"exit status {status}, expected {' or '.join(map(str, case.exit_codes))}")
    for w in case.words:
        if w.format(dir=folder) not in output:
            problems.append(f"the message lacks '{w}'")
    if seconds > case.max_seconds:
        problems.append(f"took {seconds:.1f} s to stop, more than {case.max_seconds} s")
    after = snapshot(folder)
    for p, digest in before.items():
        if p not in after:
            problems.append(f"{os.path.relpath(p, folder)} was removed")
        elif after[p] != digest and p not in ctx.may_change:
            problems.append(f"{os.path.relpath(p, folder)} was changed")
    if not env.resumes_bit_for_bit(os.path.join(folder, "good.st"), env.data):
        problems.append("the last good checkpoint no longer resumes bit for bit")
    for left, model, ranks in ctx.left_checkpoints:
        if not env.resumes_bit_for_bit(left, ctx.train_data, model, ranks):
            problems.append(f"the checkpoint it left, {os.path.basename(left)}, does not resume bit for bit")
    if 2 in case.exit_codes and len(case.exit_codes) == 1:  # refused: before anything was written
        for p in sorted(set(after) - set(before)):
            problems.append(f"refused, yet {os.path.relpath(p, folder)} was written")
    outcome = first_message(output, status)
    row = {"group": case.group, "name": case.name, "how": case.how, "outcome": outcome,
           "exit": status, "seconds": seconds, "lost": "nothing" if not problems else "; ".join(problems)}
    return row, problems, output


def run_signalled(env, command, signals, ctx):
    """Starts `command`, waits for the run log to reach a number of lines, then sends the signals."""
    out_path = os.path.join(ctx.folder, "..", os.path.basename(ctx.folder) + ".out")
    with open(out_path, "w") as out:
        # exec: the signals go to the program, not to a shell around it.
        proc = subprocess.Popen("exec " + command, shell=True, stdout=out, stderr=subprocess.STDOUT, env=env.env,
                                cwd=ctx.folder, start_new_session=True)
        for lines, sig, target, delay in signals:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and logged_lines(ctx.log) < lines:
                time.sleep(0.005)
            time.sleep(delay)
            if ctx.fault_at is None:
                ctx.fault_at = time.monotonic()
            if sig is None:
                target(ctx)
                continue
            pid = target(proc.pid) if callable(target) else proc.pid
            if not pid:
                continue
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # it has already ended: the case's checks say how
                pass
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open(out_path) as f:
        output = f.read()
    status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return status, output


def logged_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def first_message(output, status):
    """The line that says what happened: the first error, stop or refusal, else mpirun's message."""
    for pattern in (r"stopped by|second signal: stopping now", r"error:"):
        for line in output.splitlines():
            if re.search(pattern, line):
                line = re.sub(r"/tmp/[^ ]*/", "", line)
                line = re.sub(r"zf-offload-[0-9]+-[0-9a-f]+-", "zf-offload-<pid>-<hex>-", line)
                line = re.sub(r"\(pid [0-9]+ on [^)]*\)", "(pid <pid> on <host>)", line)
                return line.strip()[:160]
    lines = output.splitlines()
    for i, line in enumerate(lines[:-1]):  # mpirun's own message, in its box of dashes
        if re.fullmatch(r"-{20,}", line.strip()):
            return next((x.strip()[:160] for x in lines[i + 1:] if x.strip()), "")
    if status > 128:
        return f"(killed by signal {status - 128}: nothing printed)"
    return "(trained to the end)" if output else "(no output)"


def table(rows):
    lines = ["| group | fault | how it is tried | outcome (first message) | exit | stop | nothing lost |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        outcome = r["outcome"].replace("|", "\\|")
        lines.append(f"| {r['group']} | {r['name']} | {r['how']} | {outcome} | {r['exit']} | "
                     f"{r['seconds']:.1f} s | {r['lost']} |")
    return "\n".join(lines)


def write_into(doc, text):
    with open(doc) as f:
        content = f.read()
    start, end = content.find(MARK_BEGIN), content.find(MARK_END)
    if start < 0 or end < 0:
        sys.exit(f"{doc} has no fault-table markers ({MARK_BEGIN} ... {MARK_END})")
    content = content[:start + len(MARK_BEGIN)] + "\n" + text + "\n" + content[end:]
    with open(doc, "w") as f:
        f.write(content)


def write_xml(path, results):
    """GoogleTest's XML shape: one testcase per case, as scripts/test_summary.py reads it."""
    import xml.etree.ElementTree as ET
    failures = sum(1 for _, state, _ in results if state == "failed")
    suites = ET.Element("testsuites", name="AllTests", tests=str(len(results)), failures=str(failures))
    suite = ET.SubElement(suites, "testsuite", name="FaultSuite", tests=str(len(results)), failures=str(failures))
    for case, state, why in results:
        tc = ET.SubElement(suite, "testcase", name=f"{case.group}: {case.name}", classname="FaultSuite",
                           result="skipped" if state == "skipped" else "completed")
        if state == "failed":
            ET.SubElement(tc, "failure", message=why).text = why
        elif state == "skipped":
            ET.SubElement(tc, "skipped", message=why)
    ET.ElementTree(suites).write(path, encoding="UTF-8", xml_declaration=True)


def main():
    ap = argparse.ArgumentParser(description="every fault and bad input, with the nothing-lost checks")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", default="", help="run the cases whose name or group contains this")
    ap.add_argument("--write", default="", help="put the table into this Markdown file, between its markers")
    ap.add_argument("--verbose", action="store_true", help="print each case's output")
    ap.add_argument("--xml", default="", help="write the results in GoogleTest's XML shape (scripts/test_summary.py)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zf-faults-")
    try:
        env = Env(args.build, work)
        rows, failed, skipped, results = [], [], [], []
        for case in fault_cases.cases(env):
            if args.only and args.only not in case.name and args.only not in case.group:
                continue
            why = case.skip(env) if case.skip else ""
            if why:
                skipped.append((case.name, why))
                results.append((case, "skipped", why))
                print(f"skip  {case.name}: {why}", flush=True)
                continue
            row, problems, output = run_case(env, case)
            rows.append(row)
            print(f"{'ok  ' if not problems else 'FAIL'}  {case.name} ({row['seconds']:.1f} s, exit {row['exit']})"
                  + ("" if not problems else ": " + "; ".join(problems)), flush=True)
            results.append((case, "failed" if problems else "ok", "; ".join(problems)))
            if problems:
                failed.append(case.name)
            if args.verbose or problems:
                print("      " + output.strip().replace("\n", "\n      ")[:3000], flush=True)
        text = table(rows)
        if skipped:
            text += "\n\nSkipped where this table was made: " + "; ".join(f"{n} ({w})" for n, w in skipped) + "."
        print(text)
        if args.write:
            write_into(args.write, text)
        if args.xml:
            write_xml(args.xml, results)
        print(f"\n{len(rows) - len(failed)} held, {len(failed)} failed, {len(skipped)} skipped")
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
