#!/usr/bin/env python3
"""reading_list.py: what a reader of each stage reads, in order. Standard
library only.

    python3 scripts/reading_list.py           # print the tables (markdown)
    python3 scripts/reading_list.py --write   # refresh them in docs/ARCHITECTURE.md
    python3 scripts/reading_list.py --check   # write nothing; exit 1 if that copy is stale

READING below is the list: for stage 00 the stage's files and the few
interfaces its loop calls, in the order the loop meets them, and as its
further reading the rest of what the loop touches, the transport under the
Communicator and the Device; for each later stage only what is new; then
HARNESS, the entry points of the rest. Each table states its files and
their lines, and the course its size, so that a reader knows what a stage
asks before starting it; --check compares every count as it compares the
rest, so a count the document states is never stale (an edit that changes
a listed file's length needs --write, as it needs the stage's CHANGES.diff).
A listed file that does not exist is an error naming it: fix READING.

In docs/ARCHITECTURE.md the tables stand between the two marker lines
BEGIN and END below; --write replaces what is between them and nothing else.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join("docs", "ARCHITECTURE.md")
BEGIN = "<!-- reading list: begin (written by python3 scripts/docs.py write) -->"
END = "<!-- reading list: end -->"

# (title, the stage's CHANGES.diff or None, [(file, what to look for)],
#  further reading: [file] for the details, or [(file, what to look for)])
READING = [
    ("Stage 00: data parallel", None, [
        ("00_data_parallel/train.cpp", "main(): the executable, flags to run (launch/'s stage_main)"),
        ("00_data_parallel/data_parallel.h", "the stage's one function"),
        ("00_data_parallel/data_parallel.cpp", "the step loop: every later stage changes a part of it"),
        ("common/train/rank.h", "what a rank has: rank, world, communicator, memory tracker, Device"),
        ("common/core/model.h", "the GPT as units with flat buffers; Gpt computes one unit"),
        ("common/train/training_run.h", "ModelStates (load, full) and TrainingRun: what every run does around its loop"),
        ("common/core/shard.h", "the cut: each unit padded to a multiple of N, rank r owning piece r (here: a sharded save)"),
        ("common/train/rank_compute.h", "RankCompute: this rank's micro-batches, a unit's forward and backward"),
        ("common/comm/comm.h", "the Communicator: collectives, async handles, byte counters"),
    ], [
        ("common/core/memory.h", "every byte counted by place and category"),
        ("common/core/tensor.h", "an owning buffer that pays its tracker"),
        ("common/train/initial_state.h", "where the first values come from: the seed, --init, --resume"),
        ("common/train/training.h", "the global loss, the parameter hash, a timer"),
        ("common/core/precision.h", "the fp32 and bf16 recipes seen from one unit"),
        ("common/core/gradnorm.h", "the exact global gradient norm (the same bits however it is sharded)"),
        ("common/core/adamw.h", "AdamW's formula"),
        ("common/core/adamw.cpp", "AdamW on a range"),
        ("common/comm/comm_threads.h", "the transport under the Communicator: the threads backend"),
        ("common/comm/comm_threads.cpp", "its collectives: the algorithm at the top, then the phases"),
        ("common/comm/internal/comm_thread_group.h", "what the ranks of a group share: the posts, the barrier, abort"),
        ("common/comm/comm_reduce.cpp", "the rank-ordered sum every host backend uses"),
        ("common/core/device.h", "the Device interface: every op on the device place (the interface only)"),
        ("common/cpu/kernels.h", "what every op computes, on the CPU"),
        ("common/core/model.cpp", "the layout, the seeded initialisation, a unit's forward and backward"),
        ("common/train/training_run.cpp", "loading, saving, recording and hashing for every stage"),
        ("common/train/rank_compute.cpp", "one rank's compute over the model, unit by unit"),
        ("common/core/precision.cpp", "widening bf16 parameters and folding float32 gradients back"),
        ("common/core/gradnorm.cpp", "the exact, order-independent sum of squares"),
        ("tests/stages/test_dp.cpp", "the stage's tests: parity, bytes, schedule, gradient, checkpoints"),
    ]),
    ("Stage 01: ZeRO-1, the optimizer state sharded (what is new)", "01_zero1/CHANGES.diff", [
        ("01_zero1/zero1.h", "what changes against stage 00, and the memory per rank"),
        ("common/core/shard.cpp", "the cut's arithmetic (shard.h, read with stage 00)"),
        ("01_zero1/sharded_adamw.h", "AdamW's state for this rank's pieces, and its update piece by piece"),
        ("01_zero1/sharded_adamw.cpp", "the update per piece, one call per parameter it overlaps"),
        ("common/train/shard_pieces.h", "the norm over every rank's pieces; the full model gathered back"),
        ("common/comm/host_collectives.h", "the norm's sum over ranks (all_reduce of a SumOfSquares)"),
        ("01_zero1/zero1.cpp", "the loop: reduce_scatter, update my pieces, all_gather"),
        ("01_zero1/train.cpp", "main()"),
    ], ["tests/stages/test_zero1.cpp"]),
    ("Stage 02: ZeRO-2, the gradients sharded too (what is new)", "02_zero2/CHANGES.diff", [
        ("02_zero2/zero2.h", "what changes against stage 01, and the memory per rank"),
        ("02_zero2/sharded_grads.h", "gradients that never stay whole: a buffer per unit, reduce-scattered"),
        ("02_zero2/sharded_grads.cpp", "at most two units' buffers alive"),
        ("02_zero2/zero2.cpp", "the loop: a reduce-scatter per unit on every micro-step"),
        ("02_zero2/train.cpp", "main()"),
    ], ["tests/stages/test_zero2.cpp"]),
    ("Stage 03: ZeRO-3, the parameters sharded too (what is new)", "03_zero3/CHANGES.diff", [
        ("03_zero3/zero3.h", "what changes against stage 02, the memory and the communication"),
        ("03_zero3/gathered_params.h", "parameters whole only while a unit computes"),
        ("03_zero3/gathered_params.cpp", "unshard, wait_for_unshard, reshard"),
        ("03_zero3/zero3.cpp", "the loop: unshard the next unit while this one computes"),
        ("03_zero3/train.cpp", "main()"),
    ], ["tests/stages/test_zero3.cpp"]),
    ("Stage 04: FSDP, ZeRO-3 with FSDP's units and knobs (what is new)", "04_fsdp/CHANGES.diff", [
        ("04_fsdp/fsdp.h", "what changes against stage 03, the memory per rank; the forward and backward over the units"),
        ("common/train/config.h", "FsdpOptions: the flags of FSDP and their defaults"),
        ("04_fsdp/flat_units.h", "the wrap policy: --wrap-blocks blocks per flat parameter"),
        ("04_fsdp/flat_units.cpp", "the FSDP units as a layout of their own"),
        ("04_fsdp/flat_params.h", "float32 shards, cast and gathered; prefetch, the limit, the kept head"),
        ("04_fsdp/flat_params.cpp", "the all-gathers and their limit; the cast that is their input"),
        ("04_fsdp/flat_grads.h", "reduce-scatter in the reduce dtype into float32 shards; --no-sync"),
        ("04_fsdp/flat_grads.cpp", "one reduce-scatter in flight, float32 accumulation"),
        ("04_fsdp/fsdp.cpp", "the step: the states, the micro-steps, clip and AdamW on the float32 shards"),
        ("04_fsdp/train.cpp", "main()"),
    ], ["tests/stages/test_fsdp.cpp", "tests/stages/test_fsdp_schedule.cpp"]),
    ("Stage 05: offload, the model states on the host and AdamW on the CPU (what is new)",
     "05_offload/CHANGES.diff", [
        ("05_offload/offload.h", "what changes against stage 04, and the memory on each place"),
        ("05_offload/offload.cpp", "the loop: stage 04's step, the update on the host, the uploads"),
        ("common/core/device.h", "asynchronous host/device copies (Transfer) and pinned host memory"),
        ("common/core/adamw.h", "CpuAdamW: AdamW on the host's cores"),
        ("05_offload/host_adamw.h", "AdamW on the host's float32 shard, rounding the bf16 copy in the same pass"),
        ("05_offload/host_adamw.cpp", "one parameter span at a time (shard.h's for_each_span)"),
        ("05_offload/offload_params.h", "float32 shards on the host, the device's copy the all-gathers send"),
        ("05_offload/offload_params.cpp", "the host copy and its upload"),
        ("05_offload/host_grads.h", "reduced pieces copied device->host into float32 shards"),
        ("05_offload/host_grads.cpp", "two landing buffers, the float32 accumulation"),
        ("05_offload/train.cpp", "main()"),
    ], [
        ("common/train/offload_options.h", "the stage's own flags, which its function receives beside TrainConfig"),
        ("common/launch/entry/offload_main.h", "how they reach it: its stage_main"),
        ("05_offload/wall_phases.h", "where the step's wall time went, timed by decorators"),
        ("common/train/compute_decorators.h", "timed: the forward and backward's wall time"),
        ("common/train/host_clock.h", "how the host's work is charged under --clock modeled"),
        "tests/stages/test_offload.cpp",
    ]),
    ("Stage 05's extensions: the parameter and disk tiers, the delayed update (what is new)",
     "05_offload/extensions/CHANGES.diff", [
        ("05_offload/extensions/offload.h", "the three flags over the lesson, and the memory each moves"),
        ("05_offload/extensions/offload.cpp", "the lesson's step with the three, and the delayed update's indexing"),
        ("05_offload/extensions/offload_params.h", "--offload-params: each all-gather's input staged from the host"),
        ("05_offload/extensions/offload_params.cpp", "the host copy, its upload, the all-gather's input"),
        ("05_offload/extensions/host_grads.h", "two gradient buffers, one read by the update in flight"),
        ("05_offload/extensions/delayed_update.h", "--delay-update: the CPU update on a worker thread, one step late"),
        ("05_offload/extensions/delayed_update.cpp", "the worker, its join and its errors"),
        ("05_offload/extensions/disk_tier.h", "--offload-dir: state in files, streamed through two chunks"),
        ("05_offload/extensions/disk_tier.cpp", "the I/O thread and the double-buffered stream"),
        ("common/launch/entry/offload_files.h", "the files of --offload-dir: made, reserved, always removed"),
        ("05_offload/extensions/disk_adamw.h", "AdamW with its moments on disk"),
        ("05_offload/extensions/disk_adamw.cpp", "the optimizer step as a stream over chunks"),
    ], ["tests/stages/test_offload_delay.cpp", "tests/io/test_disk_tier.cpp"]),
]

# The harness: what runs the course and checks it, for whoever changes it
# (a stage sees only launch/entry/ of it).
HARNESS = [
    ("common/launch/entry/stage_main.h", "what a stage sees of the harness: StageFn, stage_main"),
    ("common/cpu/copy_queue.h", "the CPU device's copy thread and mlock'ed buffers"),
    ("common/launch/runner.h", "run_training: the data, the ranks, the results"),
    ("common/report/run_config.h", "RunConfig: the training's flags, the harness's own and stage 05's"),
    ("common/train/run_hooks.h", "what the harness adds around a rank's run: an injected fault, the modeled clock"),
    ("common/launch/launch.h", "starting the ranks: threads, mpirun, the environment"),
    ("common/launch/cli.h", "every flag, checked before any work"),
    ("common/report/report.h", "the step line, the run log, the closing tables"),
    ("common/estimate/memory_model.h", "each stage's model-state bytes, per place and category"),
    ("common/estimate/estimate.h", "the same bytes without running: tools/memory_estimate"),
    ("common/report/trace.h", "--trace: the timeline of ops and collectives"),
    ("common/modeled/modeled_clock.h", "--clock modeled: a step's time on a modeled GPU cluster, from the stage's own schedule"),
    ("common/io/checkpoint.h", "the training checkpoint, read back with every check"),
    ("common/io/sharded_checkpoint.h", "--save-format sharded: each rank writes its pieces, any N reads them back"),
    ("common/io/output_file.h", "outputs checked before step 0, written atomically"),
    ("common/cpu/kernels.h", "what every op computes, on the CPU"),
    ("common/cpu/blas.h", "which OpenBLAS kernels run, and why it matters"),
    ("common/comm/mpi/comm_mpi.h", "the mpi backend: a rank per process"),
    ("docs/GPU.md", "the CUDA device and the nccl backend"),
]


def line_count(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def size(files):
    """'N files, N lines' of a list of files, each file counted once."""
    files = list(dict.fromkeys(files))
    return f"{len(files)} files, {sum(line_count(f) for f in files):,} lines"


def course_size():
    """The files of every list's table and their lines: what a student reading
    the course holds (the further reading aside)."""
    return f"The course, followed through every table: {size([f for _, _, fs, _ in READING for f, _ in fs])}."


def further_path(entry):
    return entry if isinstance(entry, str) else entry[0]


def link(rel):
    return f"[{rel}](../{rel})"  # relative to docs/


def tables():
    out = []
    missing = [rel for _, diff, files, further in READING
               for rel in ([diff] if diff else []) + [f for f, _ in files] + [further_path(e) for e in further]
               if not os.path.isfile(os.path.join(ROOT, rel))]
    missing += [f for f, _ in HARNESS if not os.path.isfile(os.path.join(ROOT, f))]
    if missing:
        sys.exit("reading_list: listed but missing: " + ", ".join(missing) +
                 " (update READING in scripts/reading_list.py)")
    for title, diff, files, further in READING:
        out.append(f"**{title}**: {size([f for f, _ in files])}")
        out.append("")
        if diff:
            out.append(f"In one view: {link(diff)}, this stage's files against "
                       "the stage before's, the loop against the loop; or file by file:")
            out.append("")
        out.append("| # | file | what to look for |")
        out.append("|---:|---|---|")
        for i, (f, what) in enumerate(files, 1):
            out.append(f"| {i} | {link(f)} | {what} |")
        if further and all(isinstance(e, str) for e in further):
            out.append("")
            out.append("Further, for the details: " + ", ".join(link(f) for f in further) + ".")
        elif further:
            out.append("")
            out.append("Further reading, once the loop is clear:")
            out.append("")
            out.append("| # | file | what to look for |")
            out.append("|---:|---|---|")
            for i, e in enumerate(further, 1):
                f, what = (e, "") if isinstance(e, str) else e
                out.append(f"| {i} | {link(f)} | {what} |")
        out.append("")
    out.append(course_size())
    out.append("")
    out.append("**The harness (a stage includes only launch/entry/ of it)**: "
               f"{len(HARNESS)} entry points, for whoever changes it")
    out.append("")
    out.append("| # | file | what to look for |")
    out.append("|---:|---|---|")
    for i, (f, what) in enumerate(HARNESS, 1):
        out.append(f"| {i} | {link(f)} | {what} |")
    out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def with_tables(doc_text, body):
    try:
        head, rest = doc_text.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        sys.exit(f"reading_list: {DOC} lacks the marker lines\n  {BEGIN}\n  {END}")
    return head + BEGIN + "\n" + body + END + tail


def main():
    ap = argparse.ArgumentParser(description="Print (or --write, --check) each stage's reading list.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"refresh the tables in {DOC}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if the tables in {DOC} are stale")
    args = ap.parse_args()
    body = tables()
    if not (args.write or args.check):
        sys.stdout.write(body)
        return 0
    if args.write:
        main_write()
        return 0
    if args.check and not is_current():
        print(f"{DOC}: the reading list is stale; run python3 scripts/docs.py write")
        return 1
    return 0


def is_current():
    """Whether DOC holds the tables tables() gives, every count included."""
    with open(os.path.join(ROOT, DOC), encoding="utf-8") as f:
        text = f.read()
    return with_tables(text, tables()) == text


def main_write():
    """Refreshes the tables in DOC."""
    path = os.path.join(ROOT, DOC)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = with_tables(text, tables())
    if new != text:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(new)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    sys.exit(main())
