# fault_cases.py: the cases of scripts/fault_suite.py (docs/RELIABILITY.md),
# one per fault or bad input, grouped as the table groups them. A case is a
# command run in a folder of its own that holds good.st (a training
# checkpoint of 2 steps) and tokens.txt (a token file), with the exit status
# and the words its message must have; a case that signals the run says when
# (after how many lines of its run log) and what.

import json
import os
import shutil
import signal
import struct
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

MODEL = "--model tiny --batch 1"


class Context:
    """One case's folder and what the suite checks after it."""

    def __init__(self, env, folder):
        self.env = env
        self.folder = folder
        self.log = os.path.join(folder, "log.jsonl")
        self.data = os.path.join(folder, "tokens.txt")
        self.train_data = None      # the data a left checkpoint was trained on (None: built-in)
        self.may_change = set()     # files the case may rewrite (none: inputs never change)
        self.left_checkpoints = []  # (file, model, ranks) the fault left, each must resume bit for bit
        self.checks = []            # more checks, each called after the run: a list of problems
        self.cleanups = []          # called after the case, whatever happened
        self.fault_at = None        # when the first signal was sent (time.monotonic())

    def path(self, name):
        return os.path.join(self.folder, name)


@dataclass
class Case:
    group: str
    name: str
    how: str
    command: Callable[[Context], str]
    exit_codes: Tuple[int, ...]
    words: List[str] = field(default_factory=list)
    setup: Optional[Callable[[Context], None]] = None
    # (log lines to wait for, signal, target pid or None, then seconds to wait); with signal None,
    # target(context) is done instead of a signal
    signals: List[tuple] = field(default_factory=list)
    max_seconds: float = 60
    skip: Optional[Callable[[object], str]] = None


# --- corrupting a checkpoint ------------------------------------------------

def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header_bytes, data, n=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes) if n is None else n) + header_bytes + data)


def corrupt(transform):
    """A setup that writes bad.st: good.st's (n, header bytes, data) through `transform`."""
    def setup(ctx):
        n, header, data = read_st(ctx.path("good.st"))
        with open(ctx.path("good.st"), "rb") as f:
            raw = f.read()
        header_bytes = raw[8:8 + n]
        out = transform(n, header, header_bytes, bytearray(data))
        write_st(ctx.path("bad.st"), *out)
    return setup


def truncated(n, header, hb, data):
    return hb, bytes(data[:-100])


def header_not_json(n, header, hb, data):
    return b"{not json" + hb[9:], bytes(data)


def length_one_short(n, header, hb, data):
    return hb, bytes(data), n - 1


def wrong_name(n, header, hb, data):
    return hb.replace(b'"wte.weight"', b'"wtf.weight"', 1), bytes(data)


def tensor_at(header, name, index=0):
    """Where element `index` of float32 tensor `name` starts in the data."""
    return header[name]["data_offsets"][0] + 4 * index


def fnv1a64(data):
    """FNV-1a 64 of `data` (docs/SPEC.md: the checksum of a tensor's bytes)."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def with_value(name, value, index=0):
    """A transform that writes `value` into a tensor and its checksum again, as a run that saved that
    value would, so that the value check, not the checksum, is what refuses it."""
    def transform(n, header, hb, data):
        at = tensor_at(header, name, index)
        data[at:at + 4] = struct.pack("<f", value)
        begin, end = header[name]["data_offsets"]
        header["__metadata__"]["checksum." + name] = "fnv1a64:%016x" % fnv1a64(data[begin:end])
        return json.dumps(header).encode(), bytes(data)
    return transform


def flipped_bit(n, header, hb, data):
    data[tensor_at(header, "wte.weight") + 1] ^= 0x10
    return hb, bytes(data)


def trailing(n, header, hb, data):
    return hb, bytes(data) + bytes(8)


def duplicate_key(n, header, hb, data):
    return hb.replace(b'"__metadata__":{', b'"__metadata__":{"seed":"1","seed":"2",', 1), bytes(data)


def metadata(key, value):
    def transform(n, header, hb, data):
        header["__metadata__"][key] = value
        return json.dumps(header).encode(), bytes(data)
    return transform


def resume_bad(extra=""):
    return lambda ctx: f"{ctx.env.bins['dp']} {MODEL} --ranks 2 --steps 4 --resume bad.st --save out.st {extra}"


# --- token files --------------------------------------------------------------

def llmc(ctx, name, magic=20240520, version=1, count=1000, body_tokens=1000, token=5):
    header = struct.pack("<3i", magic, version, count) + bytes(1024 - 12)
    with open(ctx.path(name), "wb") as f:
        f.write(header + struct.pack(f"<{body_tokens}H", *([token] * body_tokens)))


def train_on(name, extra=""):
    return lambda ctx: f"{ctx.env.bins['dp']} {MODEL} --steps 2 --data {name} --save out.st {extra}"


def make_fifo(ctx):
    os.mkfifo(ctx.path("fifo"))


# --- stage 05's offload folder --------------------------------------------------

def user_files_in_offload_dir(ctx):
    """od/ with a checkpoint named as an offload file, such names with a dead pid, and a note."""
    os.makedirs(ctx.path("od"))
    shutil.copy(ctx.path("good.st"), ctx.path("od/zf-offload-999999-bb-r0-m.bin"))
    for name in ("zf-offload-999999-bb-r0-v.bin", "zf-offload-notes.txt", "notes.txt"):
        with open(ctx.path("od/" + name), "w") as f:
            f.write("the user's " + name + "\n")


def old_run_log(ctx):
    with open(ctx.path("old.jsonl"), "w") as f:
        f.write('{"step": 0, "loss": 5.5}\n')


# --- signals --------------------------------------------------------------------

def forever(ctx, exe="dp", extra="--ranks 2", model=MODEL):
    return (f"{ctx.env.bins[exe]} {model} --steps 1000000 --log-every 1000 --log-json log.jsonl "
            f"--save ck.st {extra}")


def leaves(case_command, model=MODEL, name="ck.st", ranks=2):
    """A command whose run leaves `name` (a file, or a sharded folder), which must then resume bit for bit
    (on `ranks` ranks, as it was trained)."""
    def command(ctx):
        ctx.left_checkpoints.append((ctx.path(name), model, ranks))
        return case_command(ctx)
    return command


def sharded(ctx, exe, extra=""):
    """forever(), saving a sharded folder ck/ after every step."""
    return forever(ctx, exe=exe, extra=f"--ranks 2 --save-every 1 --save-format sharded {extra}").replace(
        "--save ck.st", "--save ck")


def shard_good(ctx, damage=None):
    """good.st cut into sharded/ (2 files), then `damage` applied to its step folder."""
    ctx.env.run_ok(f"{ctx.env.bins['checkpoint']} shard {ctx.path('good.st')} {ctx.path('sharded')} --ranks 2")
    if damage:
        damage(os.path.join(ctx.path("sharded"), "step-00000002"))


def fifo_for(folder, name):
    os.remove(os.path.join(folder, name))
    os.mkfifo(os.path.join(folder, name))


def folder_for(folder, name):
    os.remove(os.path.join(folder, name))
    os.mkdir(os.path.join(folder, name))


def two_writers(env):
    """Two runs started together on one sharded --save folder: the second to lock it is refused (exit 2), the
    first trains on (exit 0); the case exits 0 when exactly that happened, else 1."""
    run = f"{env.bins['zero3']} {MODEL} --ranks 2 --steps 400 --save-every 1 --save ck --save-format sharded --quiet"
    return (f"{run} > a.out 2>&1 & a=$!; {run} > b.out 2>&1 & b=$!; wait $a; sa=$?; wait $b; sb=$?; "
            f"cat a.out b.out; [ $((sa * sb)) -eq 0 ] && [ $((sa + sb)) -eq 2 ] && exit 0; exit 1")


def flip_rank_file(step_folder):
    p = os.path.join(step_folder, "rank-00001-of-00002.safetensors")
    with open(p, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        b = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x04]))


def uncommitted(step_folder):
    """As a kill before the index leaves a save: no index.json, no latest."""
    os.remove(os.path.join(step_folder, "index.json"))
    os.remove(os.path.join(os.path.dirname(step_folder), "latest"))


def rank_pid(mpirun_pid, rank):
    """The pid of rank `rank` among mpirun's children (OMPI_COMM_WORLD_RANK in its environment)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def across_hosts(ctx, timeout_s):
    """forever() on 4 ranks across two hosts (network namespaces, scripts/two_hosts.py), two on each,
    started through scripts/mpirun_hosts.sh; checks that every process on both hosts is gone within
    timeout_s + 5 s of the link's cut (the cut: cut_link)."""
    import shlex
    import time
    import two_hosts
    hosts = two_hosts.Hosts()
    ctx.cleanups.append(hosts.close)
    ctx.hosts = hosts

    def all_gone():
        limit = timeout_s + 5
        problems = []
        if time.monotonic() - ctx.fault_at > limit:
            problems.append(f"mpirun ended {time.monotonic() - ctx.fault_at:.1f} s after the cut, more than {limit}")
        for _ in range(25):  # the far host's daemon may take a moment more
            left = hosts.pids()
            if not left or time.monotonic() - ctx.fault_at > limit:
                break
            time.sleep(0.2)
        if left:
            problems.append(f"{len(left)} processes still in the two hosts "
                            f"{time.monotonic() - ctx.fault_at:.1f} s after the cut")
        return problems
    ctx.checks.append(all_gone)
    stage = forever(ctx, extra=f"--save-every 20 --comm-timeout {timeout_s}")
    return shlex.join(hosts.mpirun(4, [])) + " " + stage


def cut_link(ctx):
    """An action in place of a signal (signal None): takes the link between the two hosts down."""
    ctx.hosts.cut()


def no_two_hosts(env):
    import two_hosts
    return no_mpirun(env) or two_hosts.unavailable(env.bins["dp"]) or ""


def no_mpirun(env):
    return "" if env.mpirun else "mpirun not found"


def no_mount(env):
    return "" if env.can_mount else "cannot mount a small tmpfs here (unshare -m needs CAP_SYS_ADMIN)"


def on_tmpfs(size, script):
    """`script` in a mount namespace where ./disk is a tmpfs of `size` bytes."""
    def command(ctx):
        os.makedirs(ctx.path("disk"), exist_ok=True)
        inner = f"mount -t tmpfs -o size={size} none disk && {script(ctx)}"
        return "unshare -m sh -c '" + inner.replace("'", "'\\''") + "'"
    return command


def cases(env):
    dp = env.bins["dp"]
    mpi = f"{env.mpirun} -np 2" if env.mpirun else "mpirun"
    c = []
    add = c.append

    # Ranks that fail.
    add(Case("rank", "a rank throws", "`--ranks 3 --inject-fault 1:2`",
             lambda x: f"{dp} {MODEL} --ranks 3 --steps 20 --inject-fault 1:2 --save ck.st", (1,),
             ["rank 1 failed"], max_seconds=20))
    add(Case("rank", "a rank throws, mpirun", "`mpirun -np 2 dp --inject-fault 1:2`",
             lambda x: f"{mpi} {dp} {MODEL} --steps 20 --inject-fault 1:2 --save ck.st", (1,),
             ["rank 1 failed"], skip=no_mpirun, max_seconds=30))

    add(Case("rank", "a rank stalls", "`--ranks 3 --inject-fault 1:2:stall --comm-timeout 2`",
             lambda x: f"{dp} {MODEL} --ranks 3 --steps 20 --inject-fault 1:2:stall --comm-timeout 2 --save ck.st", (1,),
             ["timed out after 2 s", "rank 1"], max_seconds=30))
    add(Case("rank", "a rank stalls, mpirun", "`mpirun -np 3 dp --inject-fault 1:2:stall --comm-timeout 3`",
             lambda x: f"{env.mpirun} -np 3 {dp} {MODEL} --steps 20 --inject-fault 1:2:stall --comm-timeout 3",
             (1,), ["timed out after 3 s"], skip=no_mpirun, max_seconds=40))
    add(Case("rank", "a rank stopped, mpirun", "`kill -STOP` rank 1 after 3 steps, `ZF_COMM_TIMEOUT_S=3`",
             lambda x: f"env ZF_COMM_TIMEOUT_S=3 {mpi} " + forever(x, extra=""), (1,), ["timed out after 3 s"],
             signals=[(3, signal.SIGSTOP, lambda pid: rank_pid(pid, 1), 0)], skip=no_mpirun, max_seconds=60))

    # Signals.
    add(Case("signal", "SIGINT", "Ctrl-C after 3 steps, `--ranks 2`", leaves(forever), (130,),
             ["stopped by SIGINT"], signals=[(3, signal.SIGINT, None, 0)]))
    add(Case("signal", "SIGTERM during saves", "`--save-every 1`, SIGTERM after 5 steps",
             leaves(lambda x: forever(x, extra="--ranks 2 --save-every 1")), (143,), ["stopped by SIGTERM"],
             signals=[(5, signal.SIGTERM, None, 0)]))
    add(Case("signal", "SIGHUP, sharded stage", "zero3 `--ranks 2`, SIGHUP after 3 steps",
             leaves(lambda x: forever(x, exe="zero3")), (129,), ["stopped by SIGHUP"],
             signals=[(3, signal.SIGHUP, None, 0)]))
    add(Case("signal", "second signal", "two SIGTERMs 0 steps apart, small, `--save-every 1`",
             leaves(lambda x: forever(x, extra="--ranks 2 --save-every 1", model="--model small --batch 8"),
                    model="--model small --batch 8"),
             (143,), ["second signal: stopping now"],
             signals=[(2, signal.SIGTERM, None, 0), (2, signal.SIGTERM, None, 0.02)]))
    add(Case("signal", "kill -9 during saves", "SIGKILL after 3 steps, small, `--save-every 1`",
             leaves(lambda x: forever(x, extra="--ranks 2 --save-every 1", model="--model small --batch 1"),
                    model="--model small --batch 1"),
             (137,), [], signals=[(3, signal.SIGKILL, None, 0)]))
    add(Case("signal", "kill -9 during sharded saves", "zero3, SIGKILL after 3 steps, `--save-format sharded --save-every 1`",
             leaves(lambda x: sharded(x, "zero3"), name="ck"), (137,), [], signals=[(3, signal.SIGKILL, None, 0)]))
    add(Case("signal", "kill -9 during async saves", "fsdp, SIGKILL after 4 steps, `--save-format sharded --save-async`",
             leaves(lambda x: sharded(x, "fsdp", "--save-async"), name="ck"), (137,), [],
             signals=[(4, signal.SIGKILL, None, 0)]))
    add(Case("signal", "SIGTERM during sharded saves", "fsdp, SIGTERM after 4 steps, `--save-format sharded --save-every 1`",
             leaves(lambda x: sharded(x, "fsdp"), name="ck"), (143,), ["stopped by SIGTERM"],
             signals=[(4, signal.SIGTERM, None, 0)]))
    add(Case("signal", "SIGUSR1 to mpirun", "`mpirun -np 2 dp`, SIGUSR1 to mpirun after 3 steps",
             leaves(lambda x: f"{mpi} " + forever(x, extra="")), (138,), ["stopped by SIGUSR1"],
             signals=[(3, signal.SIGUSR1, None, 0)], skip=no_mpirun))

    # Disks.
    add(Case("disk", "full disk while logging", "run log on a 4 KiB tmpfs, 200 steps",
             leaves(on_tmpfs(4096, lambda x: f"{dp} {MODEL} --ranks 2 --quiet --steps 200 --save ck.st "
                                             "--log-json disk/log.jsonl")), (4,),
             ["No space left on device", "training goes on"], skip=no_mount))

    def full_disk_save(x):
        size = os.path.getsize(x.path("good.st")) * 3 // 2
        x.left_checkpoints.append((x.path("kept.st"), MODEL, 2))
        return on_tmpfs(size, lambda y: f"{dp} {MODEL} --ranks 2 --quiet --steps 6 --save-every 2 --save disk/ck.st; "
                                        "s=$?; cp disk/ck.st kept.st; exit $s")(x)
    add(Case("disk", "full disk while saving", "room for one checkpoint, `--save-every 2`", full_disk_save, (1,),
             ["No space left on device"], skip=no_mount))
    def full_disk_sharded(x):
        size = os.path.getsize(x.path("good.st")) * 3 // 2
        x.left_checkpoints.append((x.path("kept"), MODEL, 2))
        return on_tmpfs(size, lambda y: f"{dp} {MODEL} --ranks 2 --quiet --steps 6 --save-every 2 --save disk/ck "
                                        "--save-format sharded; s=$?; cp -r disk/ck kept; exit $s")(x)
    add(Case("disk", "full disk while saving sharded", "room for one checkpoint, `--save-format sharded --save-every 2`",
             full_disk_sharded, (1,), ["No space left on device"], skip=no_mount))
    add(Case("disk", "output folder missing", "`--save no/such/ck.st`",
             lambda x: f"{dp} {MODEL} --steps 20 --save no/such/ck.st", (2,), ["--save"], max_seconds=5))
    add(Case("disk", "output is a folder", "`--log-json .`",
             lambda x: f"{dp} {MODEL} --steps 20 --log-json .", (2,), ["--log-json"], max_seconds=5))

    # Checkpoints (--resume bad.st, made from good.st).
    for name, how, transform, words in [
            ("truncated", "last 100 bytes cut", truncated, ["bad.st"]),
            ("header not JSON", "header bytes overwritten", header_not_json, ["bad.st"]),
            ("header length one short", "the u64 length field minus 1", length_one_short, ["bad.st"]),
            ("a tensor renamed", "`wte.weight` renamed `wtf.weight`", wrong_name, ["wte.weight"]),
            ("NaN in an unused row", "wte row 255 (no ASCII byte) set to NaN", with_value("wte.weight", float("nan"),
                                                                                       255 * 64), ["holds nan"]),
            ("infinite moment", "an `optim.m` element set to -inf", with_value("optim.m.lm_head.weight",
                                                                               float("-inf")), ["-inf"]),
            ("negative second moment", "an `optim.v` element set to -1", with_value("optim.v.wte.weight", -1.0),
             ["second moment"]),
            ("first moment past its second", "an `optim.m` element set to 1e30", with_value("optim.m.wte.weight",
                                                                                            1e30), ["first moment"]),
            ("a flipped bit", "one bit of wte's data, checksum kept", flipped_bit, ["checksum"]),
            ("trailing bytes", "8 bytes after the last tensor", trailing, ["after the last tensor"]),
            ("duplicate key", "`seed` twice in the metadata", duplicate_key, ["seed"]),
            ("metadata not a number", "`ranks` is \"-7\"", metadata("ranks", "-7"), ["ranks"])]:
        add(Case("checkpoint", name, how, resume_bad(), (2,), words, setup=corrupt(transform), max_seconds=5))
    add(Case("checkpoint", "another model's", "`--model small --resume good.st`",
             lambda x: f"{dp} --model small --batch 1 --steps 4 --resume good.st", (2,), ["shape"], max_seconds=10))
    add(Case("checkpoint", "a model without optimizer state", "a `--save-init` file given to `--resume`",
             lambda x: f"{dp} {MODEL} --steps 4 --resume init.st", (2,), ["--init"], max_seconds=10,
             setup=lambda x: x.env.run_ok(f"{dp} {MODEL} --steps 0 --quiet --save-init {x.path('init.st')}")))
    tmp_name = "good.st.tmp.1.h.0123456789abcdef"
    add(Case("checkpoint", "a save's temporary", "`--resume good.st.tmp.<pid>.<host>.<hex>`",
             lambda x: f"{dp} {MODEL} --steps 4 --resume {tmp_name}", (2,), ["temporary"], max_seconds=5,
             setup=lambda x: shutil.copy(x.path("good.st"), x.path(tmp_name))))
    add(Case("checkpoint", "a flipped bit in a rank's file", "good.st sharded in 2, one bit of rank 1's data",
             lambda x: f"{dp} {MODEL} --ranks 3 --steps 4 --resume sharded", (2,), ["rank-00001-of-00002", "checksum"],
             setup=lambda x: shard_good(x, flip_rank_file), max_seconds=10))
    add(Case("checkpoint", "a sharded save that never committed", "a step folder without index.json or latest",
             lambda x: f"{dp} {MODEL} --ranks 3 --steps 4 --resume sharded", (2,), ["no save to it finished"],
             setup=lambda x: shard_good(x, uncommitted), max_seconds=10))
    # A sharded folder's files that are not what a save writes: refused at once, never waited on.
    for name, what, damage, words in [
            ("index.json", "a FIFO as the index", lambda d: fifo_for(d, "index.json"), ["index.json", "FIFO"]),
            ("rank file", "a FIFO as a rank's file", lambda d: fifo_for(d, "rank-00001-of-00002.safetensors"),
             ["rank-00001-of-00002", "FIFO"]),
            ("latest", "a FIFO as `latest`", lambda d: fifo_for(os.path.dirname(d), "latest"), ["latest", "FIFO"]),
            ("index folder", "a folder as the index", lambda d: folder_for(d, "index.json"),
             ["index.json", "directory"])]:
        add(Case("checkpoint", what, f"good.st sharded in 2, its {name} replaced",
                 lambda x: f"{dp} {MODEL} --ranks 2 --steps 4 --resume sharded", (2,), words,
                 setup=lambda x, damage=damage: shard_good(x, damage), max_seconds=10))
    add(Case("checkpoint", "a FIFO to consolidate", "`checkpoint consolidate` of a folder whose index is a FIFO",
             lambda x: f"{env.bins['checkpoint']} consolidate sharded out.st", (2,), ["index.json", "FIFO"],
             setup=lambda x: shard_good(x, lambda d: fifo_for(d, "index.json")), max_seconds=10))
    add(Case("checkpoint", "a FIFO to shard", "`checkpoint shard fifo out --ranks 2`",
             lambda x: f"{env.bins['checkpoint']} shard fifo out --ranks 2", (2,), ["fifo", "FIFO"],
             setup=make_fifo, max_seconds=10))
    # The second is refused by the lock ("being written by another run") or, started late on a loaded
    # machine, by the first run's saves already in the folder: either message ends with this advice.
    add(Case("checkpoint", "two runs on one folder", "two zero3 runs started together, `--save ck --save-format sharded`",
             leaves(lambda x: two_writers(env), name="ck"), (0,), ["give --save another folder"], max_seconds=60))
    add(Case("checkpoint", "nothing left to train", "`--resume good.st --steps 2`",
             lambda x: f"{dp} {MODEL} --steps 2 --resume good.st", (2,), ["nothing left to train"], max_seconds=5))

    # Token files.
    add(Case("data", "empty file", "`--data` of 0 bytes", train_on("empty"), (2,), ["empty"],
             setup=lambda x: open(x.path("empty"), "w").close(), max_seconds=5))
    add(Case("data", "damaged llm.c magic", "first int32 20240521", train_on("t.bin"), (2,), ["llm.c"],
             setup=lambda x: llmc(x, "t.bin", magic=20240521), max_seconds=5))
    add(Case("data", "truncated llm.c file", "header says 1000 tokens, 100 there", train_on("t.bin"), (2,),
             ["truncated"], setup=lambda x: llmc(x, "t.bin", body_tokens=100), max_seconds=5))
    add(Case("data", "llm.c version 2", "header version 2", train_on("t.bin"), (2,), ["version"],
             setup=lambda x: llmc(x, "t.bin", version=2), max_seconds=5))
    add(Case("data", "another vocabulary", "llm.c tokens of id 300, tiny's V is 256", train_on("t.bin"), (2,),
             ["300"], setup=lambda x: llmc(x, "t.bin", token=300), max_seconds=5))
    add(Case("data", "a folder", "`--data .`", train_on("."), (2,), ["not a regular file"], max_seconds=5))
    add(Case("data", "a FIFO with no writer", "`--data fifo`", train_on("fifo"), (2,), ["FIFO"],
             setup=make_fifo, max_seconds=5))
    add(Case("data", "a device", "`--data /dev/zero`", train_on("/dev/zero"), (2,), ["not a regular file"],
             max_seconds=5))
    add(Case("data", "missing", "`--data no-such-file`", train_on("no-such-file"), (2,), ["does not exist"],
             max_seconds=5))

    # Outputs that are inputs (by any name), or each other.
    add(Case("collision", "log over the checkpoint", "`--resume good.st --log-json good.st`",
             lambda x: f"{dp} {MODEL} --steps 4 --resume good.st --log-json good.st", (2,), ["--log-json", "--resume"],
             max_seconds=5))
    add(Case("collision", "checkpoint over the data", "`--data tokens.txt --save ./tokens.txt`",
             lambda x: f"{dp} {MODEL} --steps 2 --data tokens.txt --save ./tokens.txt", (2,), ["--save", "--data"],
             max_seconds=5))
    add(Case("collision", "through a symlink", "`--save link.st`, link.st -> good.st, `--resume good.st`",
             lambda x: f"{dp} {MODEL} --steps 4 --resume good.st --save link.st", (2,), ["--save", "--resume"],
             setup=lambda x: os.symlink("good.st", x.path("link.st")), max_seconds=5))
    add(Case("collision", "through a hard link", "`--init hard.st --save-init good.st`, hard.st = good.st",
             lambda x: f"{dp} {MODEL} --steps 2 --init hard.st --save-init good.st", (2,), ["--save-init", "--init"],
             setup=lambda x: os.link(x.path("good.st"), x.path("hard.st")), max_seconds=5))
    add(Case("collision", "two outputs", "`--save out --log-json out`",
             lambda x: f"{dp} {MODEL} --steps 2 --save out --log-json out", (2,), ["--save", "--log-json"],
             max_seconds=5))

    # Stage 05's offload folder, holding files of the user's: none may change
    # (the suite compares every file in the case's folder, od/ included).
    off = env.bins["offload"]
    add(Case("offload", "a checkpoint named as an offload file", "`--resume od/zf-offload-999999-bb-r0-m.bin`, "
             "od the `--offload-dir`",
             lambda x: f"{off} {MODEL} --ranks 2 --steps 6 --offload-dir od --resume od/zf-offload-999999-bb-r0-m.bin",
             (2,), ["lies in --offload-dir"], setup=user_files_in_offload_dir, max_seconds=10))
    add(Case("offload", "the user's files in the folder", "a run with `--offload-dir od`, od holding other files",
             lambda x: f"{off} {MODEL} --ranks 2 --steps 3 --quiet --offload-dir od", (0,), [],
             setup=user_files_in_offload_dir, max_seconds=30))
    add(Case("offload", "a signal with the folder", "SIGTERM after 3 steps, `--offload-dir od` holding other files",
             lambda x: forever(x, exe="offload", extra="--ranks 2 --offload-dir od"), (143,), ["stopped by SIGTERM"],
             setup=user_files_in_offload_dir, signals=[(3, signal.SIGTERM, None, 0)]))
    def cut_mid_run(x):
        # Cut again and again until the run ends: the write-back of a chunk read
        # just before one cut would undo it. -c: never create the file.
        return (f"{off} {MODEL} --ranks 2 --steps 2000 --log-every 1000 --offload-dir od "
                "--log-json run.jsonl & p=$!; "
                "while kill -0 $p && [ \"$(cat run.jsonl 2>/dev/null | wc -l)\" -lt 2 ]; do sleep 0.05; done; "
                "while kill -0 $p 2>/dev/null; do truncate -c -s 0 od/zf-offload-$p-*-r0/r0-m.bin 2>/dev/null; "
                "sleep 0.01; done; wait $p; s=$?; "
                "if ls -d od/zf-offload-$p-* >/dev/null 2>&1; then echo 'the run left its folder'; exit 99; fi; "
                "exit $s")
    add(Case("offload", "an offload file cut mid-run", "rank 0's `r0-m.bin` truncated to 0 after 2 steps",
             cut_mid_run, (1,), ["truncated"], setup=user_files_in_offload_dir))
    add(Case("offload", "a refused run and an old run log", "`--offload-dir nosuchdir --log-json old.jsonl`",
             lambda x: f"{off} {MODEL} --ranks 2 --steps 2 --offload-dir nosuchdir --log-json old.jsonl", (2,),
             ["--offload-dir"], setup=old_run_log, max_seconds=10))
    add(Case("offload", "a prefetch past the units", "fsdp `--prefetch 2147483647` (tiny has 4 units)",
             lambda x: f"{env.bins['fsdp']} {MODEL} --ranks 2 --steps 2 --quiet --prefetch 2147483647", (0,), [],
             max_seconds=20))

    # Launchers.
    add(Case("launch", "a link between hosts dies",
             "`scripts/mpirun_hosts.sh -np 4`, two ranks on each of two hosts, host b's link down after 25 "
             "steps, `--comm-timeout 10 --save-every 20`",
             leaves(lambda x: across_hosts(x, 10), ranks=4), (205,), ["lost communication with a remote daemon"],
             signals=[(25, None, cut_link, 0)], skip=no_two_hosts))
    add(Case("launch", "a Slurm task without MPI", "`SLURM_PROCID=1 SLURM_NTASKS=2`, no step id",
             lambda x: f"env SLURM_PROCID=1 SLURM_NTASKS=2 {dp} {MODEL} --steps 2", (2,), ["srun started 2 processes"],
             max_seconds=5))

    # Flags.
    for flags, words in [("--ranks 0", ["--ranks"]), ("--seed -1", ["--seed"]), ("--device-mem 1.5", ["--device-mem"]),
                         ("--inject-fault 9:1", ["--inject-fault"]), ("--data ''", ["--data"]),
                         ("--steps many", ["--steps"]), ("--steps 0x10", ["decimal"]), ("--lr -1", ["--lr"])]:
        add(Case("flags", f"`{flags}`", "on the command line",
                 lambda x, f=flags: f"{dp} {MODEL} --steps 2 {f}", (2,), words, max_seconds=5))
    add(Case("flags", "`--shard-group 0`", "fsdp, on the command line",
             lambda x: f"{env.bins['fsdp']} {MODEL} --steps 2 --shard-group 0", (2,), ["--shard-group"], max_seconds=5))

    # Hardware profiles that would block or never end; killed after 20 s and
    # held to 4 GB, so that a regression fails (137) instead of hanging.
    modeled = f"timeout -s KILL 20 {dp} {MODEL} --steps 2 --clock modeled --dry-run"
    add(Case("hardware", "a FIFO with no writer", "`--clock modeled --dry-run --hardware ./fifo`",
             lambda x: f"{modeled} --hardware ./fifo", (2,), ["--hardware", "FIFO"], setup=make_fifo, max_seconds=5))
    add(Case("hardware", "a device", "`--clock modeled --dry-run --hardware /dev/zero`",
             lambda x: f"(ulimit -v 4000000; {modeled} --hardware /dev/zero)", (2,), ["--hardware", "not a regular file"],
             max_seconds=5))
    add(Case("hardware", "an empty name", "`--clock modeled --hardware ''`",
             lambda x: f"{dp} {MODEL} --steps 2 --clock modeled --hardware ''", (2,), ["--hardware", "empty"],
             max_seconds=5))
    add(Case("checkpoint", "`checkpoint shard` into a file", "`checkpoint shard good.st tokens.txt --ranks 2`",
             lambda x: f"{env.bins['checkpoint']} shard good.st tokens.txt --ranks 2", (2,), ["tokens.txt"],
             max_seconds=10))

    # A signal where no step boundary is near: in the set-up of a large
    # model, in an evaluation or a sample that would never end (before the
    # first step: nothing to save), and in one between two steps (it saves
    # the steps done). A run that waited for a step boundary would be killed
    # by the suite after 120 s.
    add(Case("signal", "SIGTERM during set-up", "gpt2, SIGTERM 0.5 s after the start",
             lambda x: forever(x, model="--model gpt2 --batch 1", extra=""), (143,),
             ["stopped by SIGTERM before the first step"], signals=[(0, signal.SIGTERM, None, 0.5)],
             max_seconds=10))
    add(Case("signal", "SIGTERM in an endless evaluation", "`--val-every 1 --val-batches 1000000000`, SIGTERM after 1 s",
             lambda x: forever(x, extra="--ranks 2 --val-every 1 --val-batches 1000000000"), (143,),
             ["stopped by SIGTERM before the first step"], signals=[(0, signal.SIGTERM, None, 1)], max_seconds=10))
    add(Case("signal", "SIGINT in an endless sample", "zero3 `--sample-every 1 --sample-length 2000000000`, "
             "Ctrl-C after 1 s",
             lambda x: forever(x, exe="zero3", extra="--ranks 2 --sample-every 1 --sample-length 2000000000"), (130,),
             ["stopped by SIGINT before the first step"], signals=[(0, signal.SIGINT, None, 1)], max_seconds=10))
    add(Case("signal", "SIGTERM in an evaluation after a step", "fsdp `--val-every 1 --val-batches 300`, SIGTERM "
             "once step 0 is logged",
             leaves(lambda x: forever(x, exe="fsdp", extra="--ranks 2 --val-every 1 --val-batches 300")), (143,),
             ["stopped by SIGTERM after step 0"], signals=[(2, signal.SIGTERM, None, 0)], max_seconds=10))
    return c
