#!/usr/bin/env python3
# test_two_hosts.py: the stages under mpirun across two hosts, and a link
# between them that breaks. The two hosts are two network namespaces joined
# by a veth pair (10.77.0.1 and 10.77.0.2, two slots each); mpirun runs in
# the first and starts its daemon in the second through an agent script that
# enters that namespace (OpenMPI's plm_rsh_agent, where ssh would be), over
# TCP on the link alone (btl tcp, oob and btl restricted to its subnet), and
# the job goes through scripts/mpirun_hosts.sh, the launcher the README
# gives for several hosts. Checked:
#   - every stage at N = 4 across the two hosts gives the threads run's
#     final hash (--ranks 4, one process);
#   - hybrid sharding with a group per host: the bytes across the groups
#     are the all-reduce of my piece, 2 (G' - 1) / G' of it, G' = 2 groups;
#   - the link dies in the middle of a run: every process on both hosts
#     (mpirun, the daemon, the ranks) is gone within the communicator
#     timeout plus 5 s, mpirun's status is not 0, and the last checkpoint
#     resumes on one host to the uninterrupted run's hash.
# Needs root, `ip netns` and mpirun (the build with MPI); skips, saying
# which is missing. Standard library only.
#
#   meson test -C build two_hosts
#   ZF_BUILD=build python3 tests/python/test_two_hosts.py [--xml FILE]

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402

BUILD = os.path.abspath(os.environ.get("ZF_BUILD") or os.path.join(ROOT, "build"))
STAGES = ["00_data_parallel/dp", "01_zero1/zero1", "02_zero2/zero2", "03_zero3/zero3", "04_fsdp/fsdp",
          "05_offload/offload"]
TINY = ["--model", "tiny", "--batch", "2"]
P_TINY = 136960  # docs/SPEC.md section 1
TIMEOUT_S = 10   # --comm-timeout of the broken link's run
AGENT = """#!/bin/sh
# OpenMPI's rsh agent: the daemon's command, run inside the host's namespace.
host=$1; shift
case "$host" in
  10.77.0.1) ns={a} ;;
  10.77.0.2) ns={b} ;;
  *) echo "no host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


def sh(*cmd, check=True):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=check)


def unavailable():
    """Why the test cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root: network namespaces need it"
    if shutil.which("ip") is None:
        return "no ip (iproute2)"
    if shutil.which("mpirun") is None:
        return "no mpirun"
    probe = f"zfprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return f"ip netns add refused: {p.stdout.strip()}"
    subprocess.run(["ip", "netns", "del", probe])
    p = subprocess.run([os.path.join(BUILD, STAGES[0]), "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if "mpirun" not in p.stdout:
        return "the build has no MPI"
    return None


def summary(log):
    with open(log, encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            if "summary" in obj:
                return obj["summary"]
    raise AssertionError(f"{log}: no summary")


class TwoHosts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = unavailable()
        if why:
            raise unittest.SkipTest(why)
        cls.a, cls.b = f"zf{os.getpid()}a", f"zf{os.getpid()}b"
        cls.dev_a, cls.dev_b = f"zfv{os.getpid()}a", f"zfv{os.getpid()}b"
        cls.tmp = tempfile.mkdtemp(prefix="zf-two-hosts-")
        # Whatever ends the test (a failure, meson's timeout's SIGTERM), the
        # namespaces, the link and every process in them go.
        atexit.register(cls.tearDownClass)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
        try:
            sh("ip", "netns", "add", cls.a)
            sh("ip", "netns", "add", cls.b)
            sh("ip", "link", "add", cls.dev_a, "type", "veth", "peer", "name", cls.dev_b)
            for ns, dev, addr in ((cls.a, cls.dev_a, "10.77.0.1/24"), (cls.b, cls.dev_b, "10.77.0.2/24")):
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "netns", "exec", ns, "ip", "addr", "add", addr, "dev", dev)
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        except subprocess.CalledProcessError as e:
            cls.tearDownClass()
            raise unittest.SkipTest(f"could not make the two hosts: {e.cmd}: {e.stdout.strip()}")
        cls.agent = os.path.join(cls.tmp, "agent.sh")
        with open(cls.agent, "w") as f:
            f.write(AGENT.format(a=cls.a, b=cls.b))
        os.chmod(cls.agent, 0o755)
        cls.hosts = os.path.join(cls.tmp, "hosts")
        with open(cls.hosts, "w") as f:
            f.write("10.77.0.1 slots=2\n10.77.0.2 slots=2\n")

    @classmethod
    def kill_all(cls):
        """Every process in the two hosts' namespaces."""
        for ns in (cls.a, cls.b):
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ValueError, ProcessLookupError):
                    pass

    @classmethod
    def tearDownClass(cls):
        if not getattr(cls, "tmp", None):
            return  # done already
        cls.kill_all()
        for ns in (cls.a, cls.b):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # a link that never made it into a namespace
        subprocess.run(["ip", "link", "del", cls.dev_a], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        cls.tmp = None

    def mpirun(self, stage_args):
        """The command of a 4-rank job across the two hosts, started in the first."""
        return ["ip", "netns", "exec", self.a, os.path.join(ROOT, "scripts", "mpirun_hosts.sh"),
                "--allow-run-as-root", "--oversubscribe", "--hostfile", self.hosts, "-np", "4",
                "--mca", "plm_rsh_agent", self.agent, "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "oob_tcp_if_include", "10.77.0.0/24",
                *stage_args]

    def run_ok(self, cmd, timeout=120):
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()  # mpirun was killed; its daemon and ranks are not
            raise
        self.assertEqual(p.returncode, 0, " ".join(cmd) + "\n" + p.stdout[-3000:])
        return p.stdout

    def log(self, name):
        return os.path.join(self.tmp, name + ".jsonl")

    def test_every_stage_across_two_hosts_is_the_threads_run(self):
        for stage in STAGES:
            with self.subTest(stage=stage):
                exe = os.path.join(BUILD, stage)
                name = os.path.basename(stage)
                flags = TINY + ["--steps", "3"]
                out = self.run_ok(self.mpirun([exe, *flags, "--log-json", self.log(name + "_mpi")]))
                self.run_ok([exe, *flags, "--ranks", "4", "--quiet", "--log-json", self.log(name + "_threads")])
                across, threads = summary(self.log(name + "_mpi")), summary(self.log(name + "_threads"))
                self.assertIn("4 ranks (processes, mpirun)", out)
                self.assertEqual(across["param_hash"], threads["param_hash"])

    def test_hybrid_sharding_keeps_a_group_on_a_host(self):
        # ranks 0, 1 on the first host, 2, 3 on the second: --shard-group 2 puts a group on each,
        # and only the all-reduce of my piece across the two groups crosses the link:
        # 2 (2 - 1) / 2 of the piece, P/2 float32 elements (tiny's units divide by 2).
        exe = os.path.join(BUILD, "04_fsdp/fsdp")
        self.run_ok(self.mpirun([exe, *TINY, "--steps", "2", "--shard-group", "2", "--quiet",
                                 "--log-json", self.log("hsdp")]))
        for c in summary(self.log("hsdp"))["comm"]:
            self.assertEqual(c["cross_group_bytes_per_step"], 2 * (2 - 1) / 2 * 4 * (P_TINY // 2), c)

    def test_a_broken_link_ends_every_process_and_the_checkpoint_resumes(self):
        exe = os.path.join(BUILD, STAGES[0])
        ck = os.path.join(self.tmp, "ck.st")
        cmd = self.mpirun([exe, *TINY, "--steps", "1000000", "--comm-timeout", str(TIMEOUT_S), "--save", ck,
                           "--save-every", "20"])
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(ck) and time.monotonic() < deadline and job.poll() is None:
                time.sleep(0.2)
            self.assertTrue(os.path.exists(ck), "no checkpoint within 60 s")
            time.sleep(1)
            sh("ip", "netns", "exec", self.b, "ip", "link", "set", self.dev_b, "down")
            broken = time.monotonic()
            out, _ = job.communicate(timeout=TIMEOUT_S + 60)
            ended = time.monotonic() - broken
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
            sh("ip", "netns", "exec", self.b, "ip", "link", "set", self.dev_b, "up")
        self.assertLessEqual(ended, TIMEOUT_S + 5, f"mpirun ended {ended:.1f} s after the break")
        self.assertNotEqual(job.returncode, 0, out[-3000:])
        # Nothing left on either host, the other's daemon and ranks included.
        left = []
        for _ in range(25):
            left = [p for ns in (self.a, self.b) for p in sh("ip", "netns", "pids", ns).stdout.split()]
            if not left:
                break
            time.sleep(0.2)
        self.assertEqual(left, [], "processes still running in the two hosts' namespaces")
        # The last checkpoint (the last save the log reports), resumed on one host, is the uninterrupted run.
        saved = re.findall(r"^save +after (\d+) steps", out, re.M)
        self.assertTrue(saved, out[-3000:])
        steps = int(saved[-1]) + 3
        resumed, whole = self.log("resumed"), self.log("whole")
        self.run_ok([exe, *TINY, "--ranks", "4", "--resume", ck, "--steps", str(steps), "--quiet",
                     "--log-json", resumed])
        self.run_ok([exe, *TINY, "--ranks", "4", "--steps", str(steps), "--quiet", "--log-json", whole])
        self.assertEqual(summary(resumed)["first_step"], int(saved[-1]))
        self.assertEqual(summary(resumed)["param_hash"], summary(whole)["param_hash"])

if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "two_hosts", "test_two_hosts.py [--xml FILE]"))
