#!/usr/bin/env python3
"""stage_table.py: the measured table at the end of each stage's README.

Runs a stage executable on a few configurations and prints one markdown row
per run, read from its --log-json summary: model-state bytes per rank (and
as a multiple of P), peak activations, ring-model bytes sent per step, step
time and final loss. Usage:

    tools/stage_table.py build/00_data_parallel/dp --model small --steps 50 --batch 2 \
        --ranks 1 2 4 --precision fp32 bf16
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    args = ap.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"stage_table.py: error: {args.binary} does not exist (build first: ninja -C build)")

    print(f"`{os.path.basename(args.binary)} --model {args.model} --steps {args.steps} --batch {args.batch}"
          f" --ranks N --precision X`, on {platform.node()} ({os.cpu_count()} cores)\n")
    print("| ranks | precision | model states / rank | = | peak activations | sent / step / rank | ms / step | final loss |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for prec in args.precision:
            for n in args.ranks:
                log = os.path.join(tmp, f"{prec}_{n}.jsonl")
                cmd = [args.binary, "--model", args.model, "--steps", str(args.steps), "--batch", str(args.batch),
                       "--ranks", str(n), "--precision", prec, "--quiet", "--log-json", log]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"stage_table.py: error: {' '.join(cmd)} failed:\n{r.stderr}")
                with open(log) as f:
                    s = [json.loads(l) for l in f if l.strip()][-1]["summary"]
                m = s["memory"][0]["device"]
                p = s["params"]
                sent = s["comm"][0]["bytes_per_step"]
                print(f"| {n} | {prec} | {human(m['model_states'])} | {m['model_states'] / p:.2f}P | "
                      f"{human(m['activations']['peak'])} | {human(sent)} | {s['median_ms']:.1f} | {s['final_loss']:.4f} |")


if __name__ == "__main__":
    main()
