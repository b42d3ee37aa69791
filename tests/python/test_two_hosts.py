#!/usr/bin/env python3
# test_two_hosts.py: the stages under mpirun across two hosts, two network
# namespaces joined through a third (scripts/two_hosts.py), two slots each,
# the job started through scripts/mpirun_hosts.sh, the launcher docs/USAGE.md
# gives for several hosts. Checked:
#   - every stage at N = 4 across the two hosts gives the threads run's
#     final hash (--ranks 4, one process);
#   - hybrid sharding with a group per host: the bytes across the groups
#     are the all-reduce of my piece, 2 (R - 1) / R of it, R = 2 groups,
#     in the run's counters and in the link's (under 5 % more: headers),
#     and under half of what plain sharding sends across;
#   - a slow, lossy link (20 ms more and 20 % of the packets lost toward
#     one host; 5 % for ZeRO-3's many all-gathers) still trains to the same
#     hash, with no false timeout and no keepalive taking it for dead.
# A link that dies mid-run is a case of scripts/fault_suite.py (the
# fault_suite test, docs/RELIABILITY.md's table). Needs root, `ip netns`
# and mpirun (the build with MPI); skips, saying which is missing.
# Standard library only.
#
#   meson test -C build two_hosts
#   ZF_BUILD=build python3 tests/python/test_two_hosts.py [--xml FILE]

import atexit
import json
import os
import signal
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gtest_xml  # noqa: E402
import two_hosts  # noqa: E402

BUILD = os.path.abspath(os.environ.get("ZF_BUILD") or os.path.join(ROOT, "build"))
STAGES = ["00_data_parallel/dp", "01_zero1/zero1", "02_zero2/zero2", "03_zero3/zero3", "04_fsdp/fsdp",
          "05_offload/offload"]
TINY = ["--model", "tiny", "--batch", "2"]
P_TINY = 136960  # docs/SPEC.md section 1


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
        why = two_hosts.unavailable(os.path.join(BUILD, STAGES[0]))
        if why:
            raise unittest.SkipTest(why)
        try:
            cls.hosts = two_hosts.Hosts()
        except RuntimeError as e:
            raise unittest.SkipTest(str(e))
        cls.tmp = cls.hosts.tmp
        # Whatever ends the test (a failure, meson's timeout's SIGTERM), the
        # namespaces, the links and every process in them go.
        atexit.register(cls.hosts.close)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    @classmethod
    def tearDownClass(cls):
        cls.hosts.close()

    def mpirun(self, stage_args):
        """The command of a 4-rank job across the two hosts."""
        return self.hosts.mpirun(4, stage_args)

    def run_ok(self, cmd, timeout=120):
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.hosts.kill_all()  # mpirun was killed; its daemon and ranks are not
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
        # 2 (2 - 1) / 2 of the piece, P/2 float32 elements (tiny's units divide by 2), from each rank.
        exe = os.path.join(BUILD, "04_fsdp/fsdp")
        piece_bytes = 4 * (P_TINY // 2)
        per_rank = 2 * (2 - 1) / 2 * piece_bytes
        self.run_ok(self.mpirun([exe, *TINY, "--steps", "2", "--shard-group", "2", "--quiet",
                                 "--log-json", self.log("hsdp")]))
        for c in summary(self.log("hsdp"))["comm"]:
            self.assertEqual(c["cross_group_bytes_per_step"], per_rank, c)
        # The link's own counters: what two more steps add, over two (start-up and the last
        # step's gathers cancel), is 4 ranks' share plus the headers of TCP, IP and Ethernet.
        def link_bytes_per_step(flags):
            sent = []
            for steps in (2, 4):
                before = self.hosts.link_bytes()
                self.run_ok(self.mpirun([exe, *TINY, "--steps", str(steps), "--quiet", *flags]))
                sent.append(self.hosts.link_bytes() - before)
            return (sent[1] - sent[0]) / 2
        hsdp = link_bytes_per_step(["--shard-group", "2"])
        self.assertGreaterEqual(hsdp, 4 * per_rank)
        self.assertLess(hsdp, 4 * per_rank * 1.05)
        # Without the groups, every all-gather and reduce-scatter ring crosses the link.
        self.assertGreater(link_bytes_per_step([]), 2 * hsdp)

    def test_a_slow_lossy_link_trains_the_same(self):
        # 20 %: TCP resends a lost segment after 0.2, 0.4, 0.8 ... s, so one
        # lost 9 times in a row holds its connection past the 120 s timeout:
        # at 20 % one segment in 2 million, at 30 % one in 50,000 (often
        # enough among the thousands a run loses).
        cases = [("00_data_parallel/dp", 0.2), ("03_zero3/zero3", 0.05)]
        try:
            for stage, loss in cases:
                with self.subTest(stage=stage, loss=loss):
                    self.hosts.impair(20, loss)
                    exe = os.path.join(BUILD, stage)
                    name = os.path.basename(stage)
                    flags = TINY + ["--steps", "2", "--quiet"]
                    # TCP's retransmission backoff on a lossy link can hold one connection for
                    # tens of seconds, longer still when the forwarder shares a busy core: the
                    # timeout is for a rank that is gone, and a slow link must stay under it.
                    self.run_ok(self.mpirun([exe, *flags, "--comm-timeout", "120",
                                             "--log-json", self.log(name + "_lossy")]), timeout=240)
                    self.hosts.stop_forwarder()
                    sent = self.hosts.counts["delayed"] + self.hosts.counts["dropped"]
                    self.assertGreater(sent, 100, self.hosts.counts)  # the job's packets went through the wire
                    self.assertAlmostEqual(self.hosts.counts["dropped"] / sent, loss, delta=0.05 + 3 / sent ** 0.5)
                    self.run_ok([exe, *flags, "--ranks", "4", "--log-json", self.log(name + "_whole")])
                    self.assertEqual(summary(self.log(name + "_lossy"))["param_hash"],
                                     summary(self.log(name + "_whole"))["param_hash"])
        finally:
            self.hosts.impair(0, 0)


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "two_hosts", "test_two_hosts.py [--xml FILE]"))
