"""A real fedlearn-coordinator process for the SDK tests ($FEDLEARN_COORDINATOR)."""

import os
import re
import subprocess
import tempfile
import time


class Coordinator:
    """Starts ``fedlearn-coordinator`` with ``flags`` on free ports; ``address`` and
    ``http`` are its gRPC and HTTP ``HOST:PORT``. Use as a context manager."""

    def __init__(self, *flags: str, port: int = 0):
        self.flags = list(flags)
        self.port = port
        self.log_path = tempfile.mktemp(prefix="fedlearn-coordinator-", suffix=".log")

    def __enter__(self) -> "Coordinator":
        binary = os.environ["FEDLEARN_COORDINATOR"]
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [binary, f"--port={self.port}", "--bind=127.0.0.1", "--http_port=0",
             "--exit_on_done=false", *self.flags], stderr=self._log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = self.log()
            grpc_port = re.search(r"listening on .* \(port (\d+)\)", text)
            http_port = re.search(r"dashboard on https?://[^:]+:(\d+)/", text)
            if grpc_port and http_port:
                self.address = f"127.0.0.1:{grpc_port.group(1)}"
                self.http = f"127.0.0.1:{http_port.group(1)}"
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"the coordinator exited:\n{text}")
            time.sleep(0.05)
        raise RuntimeError(f"the coordinator did not start:\n{self.log()}")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)
        self._log.close()
        os.unlink(self.log_path)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()
