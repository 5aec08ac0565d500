"""A real ZooKeeper for the cluster's tests: Debian's (``apt-get install zookeeper``, which
scripts/setup.sh does), started standalone on a free port with a data directory of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.ports import free_port

# the server and what it needs at run time (Debian's jars; the NIO server, so no Netty)
JARS = ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar",
        "commons-io.jar", "metrics-core.jar"]  # fmt: skip
# and for TLS, its Netty server
NETTY = ["netty-buffer.jar", "netty-codec.jar", "netty-common.jar", "netty-handler.jar",
         "netty-resolver.jar", "netty-transport.jar", "netty-transport-native-unix-common.jar",
         "netty-transport-native-epoll.jar"]  # fmt: skip
JAVA_DIR = Path("/usr/share/java")
# ZooKeeper's tick (3 s by default): sessions last 2 to 20 ticks, so short sessions need a
# short tick (a dead member is then noticed within seconds)
TICK_MS = 500


class ZooKeeper:
    """``start()``, ``stop()`` (SIGTERM), ``pause()``/``resume()`` (SIGSTOP/SIGCONT): the same
    port and data directory each time, so sessions live through a restart."""

    def __init__(self, directory: Path, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: its key and certificate in one PEM file, and the CA its clients'
        certificates must chain to; then it listens with TLS only (its secureClientPort), and
        asks every client for a certificate."""
        self.tls = tls
        missing = [j for j in JARS + (NETTY if tls else []) if not (JAVA_DIR / j).exists()]
        if missing:
            raise RuntimeError(
                f"ZooKeeper's jars are missing ({', '.join(missing)}): "
                "sudo apt-get install -y zookeeper (scripts/setup.sh does)"
            )
        self.directory = directory
        self.port = free_port()
        self.hosts = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        classpath = ":".join(str(JAVA_DIR / j) for j in JARS + (NETTY if self.tls else []))
        args = [str(self.port), str(self.directory / "data"), str(TICK_MS)]
        if self.tls is not None:
            keystore, ca = self.tls
            config = self.directory / "zoo.cfg"
            config.write_text(
                f"tickTime={TICK_MS}\ndataDir={self.directory / 'data'}\n"
                f"secureClientPort={self.port}\nadmin.enableServer=false\n"
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                f"ssl.keyStore.location={keystore}\nssl.keyStore.type=PEM\n"
                f"ssl.trustStore.location={ca}\nssl.trustStore.type=PEM\n"
                "ssl.clientAuth=need\n"
            )
            args = [str(config)]
        with open(self.directory / "server.log", "ab") as out:
            self.process = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", classpath,
                 "org.apache.zookeeper.server.ZooKeeperServerMain", *args],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited: see {self.directory / 'server.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"ZooKeeper did not listen on {self.port} in {timeout_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)
