#!/usr/bin/env python3
# two_hosts.py: two "hosts" on one machine, for running the stages under
# mpirun across a real network link. Each host is a network namespace; a
# third namespace, the wire, joins them as a router:
#
#   host a 10.77.1.1/24 --veth-- wire --veth-- 10.77.2.1/24 host b
#
# mpirun runs in host a and starts its daemon in host b through an agent
# script that enters b's namespace (OpenMPI's plm_rsh_agent, where ssh would
# be), over TCP on the link alone. The wire can impair the link: every
# packet between the hosts then goes through a TUN device in the wire, where
# this script's forwarder delays it and drops some at random (what netem
# does, for kernels without it). Needs root and `ip netns`; standard library
# only. Used by tests/python/test_two_hosts.py and scripts/fault_cases.py.
#
#   python3 scripts/two_hosts.py forward --dev DEV --delay-ms 20 --loss 0.3   # the forwarder (in the wire)

import argparse
import fcntl
import heapq
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HOST_A, HOST_B = "10.77.1.1", "10.77.2.1"
SUBNET = "10.77.0.0/16"  # both hosts' links: OpenMPI's tcp and oob stay on them
AGENT = """#!/bin/sh
# OpenMPI's rsh agent: the daemon's command, run inside the host's namespace.
host=$1; shift
case "$host" in
  {host_a}) ns={a} ;;
  {host_b}) ns={b} ;;
  *) echo "no host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


def sh(*cmd, check=True):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=check)


def unavailable(stage_exe):
    """Why two hosts cannot be made here, or None. `stage_exe`: a stage, to ask whether it has MPI."""
    if os.geteuid() != 0:
        return "not root: network namespaces need it"
    if shutil.which("ip") is None:
        return "no ip (iproute2)"
    if shutil.which("mpirun") is None:
        return "no mpirun"
    probe = f"zfprobe{os.getpid()}"
    p = sh("ip", "netns", "add", probe, check=False)
    if p.returncode != 0:
        return f"ip netns add refused: {p.stdout.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    p = sh(stage_exe, "--help", check=False)
    if "mpirun" not in p.stdout:
        return "the build has no MPI"
    return None


class Hosts:
    """Two hosts and the wire between them; close() removes them and every process in them."""

    def __init__(self):
        tag = f"zf{os.getpid()}"
        self.a, self.b, self.wire = tag + "a", tag + "b", tag + "w"
        # veth ends: host a's, the wire's toward a, the wire's toward b, host b's; and the wire's TUN
        self.dev_a, self.dev_wa, self.dev_wb, self.dev_b = tag + "a0", tag + "wa", tag + "wb", tag + "b0"
        self.tun = tag + "t"
        self.tmp = tempfile.mkdtemp(prefix="zf-two-hosts-")
        self.forwarder = None
        self.counts = {}
        try:
            for ns in (self.a, self.b, self.wire):
                sh("ip", "netns", "add", ns)
                self.in_ns(ns, "ip", "link", "set", "lo", "up")
            self.in_ns(self.wire, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            for ns, dev, wdev, net in ((self.a, self.dev_a, self.dev_wa, "10.77.1"),
                                       (self.b, self.dev_b, self.dev_wb, "10.77.2")):
                sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", wdev, "netns", self.wire)
                self.in_ns(ns, "ip", "addr", "add", net + ".1/24", "dev", dev)
                self.in_ns(ns, "ip", "link", "set", dev, "up")
                self.in_ns(ns, "ip", "route", "add", "default", "via", net + ".254")
                self.in_ns(self.wire, "ip", "addr", "add", net + ".254/24", "dev", wdev)
                self.in_ns(self.wire, "ip", "link", "set", wdev, "up")
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"could not make the two hosts: {' '.join(e.cmd)}: {e.stdout.strip()}")
        self.agent = os.path.join(self.tmp, "agent.sh")
        with open(self.agent, "w") as f:
            f.write(AGENT.format(host_a=HOST_A, host_b=HOST_B, a=self.a, b=self.b))
        os.chmod(self.agent, 0o755)
        self.hostfile = os.path.join(self.tmp, "hosts")
        with open(self.hostfile, "w") as f:
            f.write(f"{HOST_A} slots=2\n{HOST_B} slots=2\n")

    def in_ns(self, ns, *cmd, check=True):
        return sh("ip", "netns", "exec", ns, *cmd, check=check)

    def mpirun(self, np, stage_args):
        """The command of an np-rank job across the two hosts (two slots each), started in host a,
        through the launcher docs/USAGE.md gives for several hosts."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return ["ip", "netns", "exec", self.a, os.path.join(root, "scripts", "mpirun_hosts.sh"),
                "--allow-run-as-root", "--oversubscribe", "--hostfile", self.hostfile, "-np", str(np),
                "--mca", "plm_rsh_agent", self.agent, "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", SUBNET, "--mca", "oob_tcp_if_include", SUBNET, *stage_args]

    def impair(self, delay_ms, loss, seed=1):
        """From now on every packet from host a to host b waits delay_ms in the wire, and a
        fraction `loss` of them is dropped; impair(0, 0) makes the link whole again."""
        self.stop_forwarder()
        rules = [["iif", dev, "lookup", "100"] for dev in (self.dev_wa, self.dev_wb)]
        if delay_ms == 0 and loss == 0:
            for rule in rules:
                self.in_ns(self.wire, "ip", "rule", "del", *rule, check=False)
            return
        if self.tun not in self.in_ns(self.wire, "ip", "link", "show").stdout:
            self.in_ns(self.wire, "ip", "tuntap", "add", "dev", self.tun, "mode", "tun")
            for name in ("all", "default", self.dev_wa, self.dev_wb, self.tun):
                self.in_ns(self.wire, "sysctl", "-qw", f"net.ipv4.conf.{name}.rp_filter=0")
        self.forwarder = subprocess.Popen(
            ["ip", "netns", "exec", self.wire, sys.executable, os.path.abspath(__file__), "forward",
             "--dev", self.tun, "--delay-ms", str(delay_ms), "--loss", str(loss), "--seed", str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if self.forwarder.stdout.readline().strip() != "ready":
            raise RuntimeError("the forwarder did not start: " + self.forwarder.stdout.read())
        self.in_ns(self.wire, "ip", "link", "set", self.tun, "up")
        # What arrives from a host is routed into the TUN (table 100); what the forwarder writes
        # back comes in on the TUN and takes the main table, to the other host.
        self.in_ns(self.wire, "ip", "route", "replace", "default", "dev", self.tun, "table", "100")
        for rule in rules:
            if f"iif {rule[1]} " not in self.in_ns(self.wire, "ip", "rule", "show").stdout:
                self.in_ns(self.wire, "ip", "rule", "add", *rule)

    def stop_forwarder(self):
        """Stops the forwarder; self.counts is then how many packets to host b it delayed and
        dropped, and how many it passed straight back."""
        if self.forwarder is None:
            return
        self.forwarder.terminate()
        out, _ = self.forwarder.communicate()
        self.forwarder = None
        words = out.split()
        self.counts = {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2) if words[i + 1].isdigit()}

    def link_bytes(self):
        """Bytes host a's end of the link has sent and received, IP headers and all."""
        import json
        stats = json.loads(self.in_ns(self.a, "ip", "-s", "-j", "link", "show", "dev", self.dev_a).stdout)[0]["stats64"]
        return stats["tx"]["bytes"] + stats["rx"]["bytes"]

    def cut(self, down=True):
        """Takes host b's end of the link down (or up again)."""
        self.in_ns(self.b, "ip", "link", "set", self.dev_b, "down" if down else "up")

    def pids(self):
        """Every process in the two hosts."""
        return [p for ns in (self.a, self.b) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]

    def kill_all(self):
        for pid in self.pids():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass

    def close(self):
        if self.tmp is None:
            return  # done already
        self.kill_all()
        self.stop_forwarder()
        for ns in (self.a, self.b, self.wire):  # a namespace's veth ends and TUN go with it
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None


# --- the forwarder ----------------------------------------------------------

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def forward(dev, delay_ms, loss, seed):
    """Reads each IP packet from the TUN device `dev` and writes it back; a packet to host b is
    dropped with probability `loss`, or written back delay_ms later, in the order it came: what
    netem does on host a's end of the link."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
    rng = random.Random(seed)
    delay = delay_ms / 1000
    queue = []  # (when to send, arrival order, packet)
    order = 0
    counts = {"delayed": 0, "dropped": 0, "passed": 0}

    def report(*_):
        print(" ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, report)
    to_b = bytes(int(x) for x in HOST_B.split("."))  # an IPv4 header's destination, bytes 16 to 19
    print("ready", flush=True)
    while True:
        wait = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        readable, _, _ = select.select([fd], [], [], wait)
        if readable:
            packet = os.read(fd, 65536)
            if packet[16:20] != to_b:
                os.write(fd, packet)
                counts["passed"] += 1
            elif rng.random() >= loss:
                heapq.heappush(queue, (time.monotonic() + delay, order, packet))
                order += 1
                counts["delayed"] += 1
            else:
                counts["dropped"] += 1
        while queue and queue[0][0] <= time.monotonic():
            os.write(fd, heapq.heappop(queue)[2])


def main():
    ap = argparse.ArgumentParser(description="the wire's forwarder between two hosts (see the top of this file)")
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("forward", help="delay and drop the packets of a TUN device")
    f.add_argument("--dev", required=True)
    f.add_argument("--delay-ms", type=float, default=0)
    f.add_argument("--loss", type=float, default=0)
    f.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not 0 <= args.loss < 1 or args.delay_ms < 0:
        sys.exit("two_hosts.py: --loss must be in [0, 1) and --delay-ms at least 0")
    forward(args.dev, args.delay_ms, args.loss, args.seed)


if __name__ == "__main__":
    main()
