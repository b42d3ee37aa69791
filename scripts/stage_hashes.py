#!/usr/bin/env python3
"""Final parameter hashes of every stage over a fixed set of runs, one line each.

A restructuring that must not change any number is checked by running this
before and after on the same machine and comparing the two outputs (the
kernels, and so the hashes, differ between AVX2 and AVX-512 machines: never
compare across machines).

    python3 scripts/stage_hashes.py --build build > before.txt
    ... change ...
    python3 scripts/stage_hashes.py --build build | diff before.txt -
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

STAGES = [("dp", "00_data_parallel"), ("zero1", "01_zero1"), ("zero2", "02_zero2"), ("zero3", "03_zero3"),
          ("fsdp", "04_fsdp"), ("offload", "05_offload")]
# Knobs of stages 04 and 05 beyond the common grid, each at N = 4, K = 2.
FSDP_MODES = ["--reshard-after-forward false", "--no-sync", "--reduce-dtype fp32", "--shard-group 2",
              "--wrap-blocks 2", "--prefetch 2 --max-gathered 0"]
OFFLOAD_MODES = ["--offload-params", "--delay-update", "--offload-dir {tmp}",
                 "--offload-params --offload-dir {tmp}"]


def runs():
    for (name, folder), precision, n, k in itertools.product(STAGES, ["fp32", "bf16"], [1, 3, 4], [1, 2]):
        yield name, folder, f"--precision {precision} --ranks {n} --grad-accum {k}"
    for precision in ["fp32", "bf16"]:
        for mode in FSDP_MODES:
            for name, folder in STAGES[4:]:
                yield name, folder, f"--precision {precision} --ranks 4 --grad-accum 2 {mode}"
        for mode in OFFLOAD_MODES:
            yield "offload", "05_offload", f"--precision {precision} --ranks 4 --grad-accum 2 {mode}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder, flags in runs():
            flags = flags.format(tmp=tmp)
            cmd = [os.path.join(args.build, folder, name), "--model", "tiny", "--batch", "1", "--steps", "3",
                   "--log-every", "1000"] + flags.split()
            r = subprocess.run(cmd, capture_output=True, text=True)
            m = re.search(r"final parameters hash (0x[0-9a-f]+)", r.stdout)
            if r.returncode != 0 or not m:
                failed += 1
                print(f"{name} {flags.replace(tmp, 'DIR')}: exit {r.returncode}: {r.stderr.strip()[:200]}")
                continue
            print(f"{name} {flags.replace(tmp, 'DIR')} {m.group(1)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
