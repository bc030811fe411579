"""The fedlearn command line.

    python3 -m fedlearn status HOST:PORT            phase, round, clients, last rounds
    python3 -m fedlearn watch HOST:PORT [--every S]  the same, redrawn while the run goes
    python3 -m fedlearn model HOST:HTTP_PORT OUT.safetensors [--tls_ca CA.pem]
                                                     the current global model, over HTTP
                                                     (HTTPS with --tls_ca or an https:// URL)

``status`` and ``watch`` call GetStatus on the gRPC port; ``model`` downloads
/api/model.safetensors from the dashboard's port (all of it, or nothing: a failed download
leaves OUT as it was). Exit status 0, or 1 with the error.
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, List, Optional

from fedlearn import proto
from fedlearn.client import TlsConfig, make_channel
from fedlearn.errors import FedlearnError, from_rpc_error


def get_status(address: str, tls: Optional[TlsConfig] = None,
               client_ids: bool = False) -> Any:
    """The coordinator's ``GetStatusResponse``; raises ``FedlearnError``.

    With ``client_ids``, its records list their selected and accepted clients.
    """
    grpc, pb2, pb2_grpc = proto.modules()
    channel = make_channel(address, tls)
    try:
        request = pb2.GetStatusRequest(client_ids=client_ids)
        return pb2_grpc.CoordinatorStub(channel).GetStatus(request, timeout=10)
    except grpc.RpcError as e:
        raise from_rpc_error(e, f"GetStatus from {address}") from None
    finally:
        channel.close()


def render_status(status: Any, last: int = 8) -> str:
    """A plain-text table of a ``GetStatusResponse``."""
    _, pb2, _ = proto.modules()
    lines: List[str] = []
    phase = pb2.Phase.Name(status.phase).replace("PHASE_", "")
    lines.append(f"run {status.run_id}  model {status.model.name} "
                 f"({status.model.num_parameters:,} parameters)  strategy "
                 f"{status.strategy or 'fedavg'}")
    stop = f"  stopped: {status.stop_reason}" if status.stop_reason else ""
    lines.append(f"phase {phase}  round {status.round}{stop}")
    if status.HasField("privacy"):
        p = status.privacy
        lines.append(f"privacy: epsilon {p.epsilon:.4g} at delta {p.delta:g} after "
                     f"{p.rounds} rounds (z {p.noise_multiplier:g}, C {p.clip_norm:.4g})")
    counts = status.client_counts  # every client; status.clients is one page
    states = [(name, getattr(counts, name))
              for name in ("evaluating", "gone", "ready", "training")]
    lines.append(f"clients {counts.joined}: " +
                 ", ".join(f"{n} {s}" for s, n in states if n))
    if status.HasField("final_evaluation"):
        e = status.final_evaluation
        lines.append(f"final test accuracy {100 * e.test_accuracy:.2f}% (loss "
                     f"{e.test_loss:.4f}, {e.num_examples} examples)")
    lines.append("")
    lines.append(f"{'round':>7} {'kind':<10} {'outcome':<10} {'resp/sel':>9} "
                 f"{'loss':>9} {'accuracy':>9} {'seconds':>8}")
    for r in list(status.history)[-last:]:
        kind = "evaluate" if r.evaluation else "train"
        m = r.metrics
        lines.append(f"{r.round:>5}.{r.attempt:<1} {kind:<10} {r.outcome:<10} "
                     f"{r.responded:>4}/{r.selected:<4} {m.train_loss:>9.4f} "
                     f"{100 * m.train_accuracy:>8.2f}% {r.duration_seconds:>8.2f}")
    return "\n".join(lines)


def download_model(address: str, out: str, tls_ca: Optional[str] = None) -> int:
    """Saves /api/model.safetensors from the dashboard at ``address`` (HOST:PORT, or a
    URL) to ``out``; returns the bytes written.

    A coordinator started with ``--tls_cert`` serves its dashboard over HTTPS with that
    certificate: ``tls_ca`` is the PEM CA to trust for it (the system's CAs without it),
    and makes a bare HOST:PORT an https:// one.

    The bytes go to a temporary file beside ``out``, which replaces ``out`` only once the
    whole body (as many bytes as the reply's Content-Length) has arrived and is on disk:
    a download that fails leaves ``out`` as it was and nothing else behind. Raises
    ``FedlearnError`` naming the URL or the file.
    """
    if "://" not in address:
        address = f"{'https' if tls_ca else 'http'}://{address}"
    url = address.rstrip("/") + "/api/model.safetensors"
    try:
        context = ssl.create_default_context(cafile=tls_ca)
    except (OSError, ssl.SSLError) as e:
        raise FedlearnError(f"{tls_ca}: not a PEM CA ({e})") from None
    directory = os.path.dirname(os.path.abspath(out))
    try:
        f = tempfile.NamedTemporaryFile(dir=directory, prefix=os.path.basename(out) + ".",
                                        suffix=".part", delete=False)
    except OSError as e:
        raise FedlearnError(f"{out}: {e.strerror or e}") from None
    try:
        with f:
            n = _copy_body(url, f, context)  # its errors name the URL or the file already
            f.flush()
            os.fsync(f.fileno())
            # As open() would have made it (a temporary file is 0600).
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)
        os.replace(f.name, out)
        return n
    except OSError as e:  # syncing, closing or renaming
        raise FedlearnError(f"{out}: {e.strerror or e}") from None
    finally:
        if os.path.exists(f.name):
            os.unlink(f.name)


def _copy_body(url: str, f: Any, context: ssl.SSLContext) -> int:
    """Writes the body of a GET of ``url`` to ``f``; returns its length."""
    try:
        with urllib.request.urlopen(url, timeout=30, context=context) as r:
            expected = r.headers.get("Content-Length")
            n = 0
            while True:
                block = r.read(1 << 20)
                if not block:
                    break
                try:
                    f.write(block)
                except OSError as e:
                    raise FedlearnError(f"{f.name}: {e.strerror or e}") from None
                n += len(block)
    except urllib.error.HTTPError as e:
        raise FedlearnError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise FedlearnError(f"{url}: {e.reason}") from None
    except (OSError, http.client.HTTPException) as e:
        # A connection cut off mid-body (IncompleteRead), reset or timed out.
        raise FedlearnError(f"{url}: {type(e).__name__}: {e}") from None
    if expected is not None and n != int(expected):
        raise FedlearnError(f"{url}: got {n:,} of {int(expected):,} bytes")
    return n


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m fedlearn", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("status", "the run's phase, round, clients and rounds"),
                            ("watch", "status, redrawn until the run is DONE")):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("address", help="HOST:PORT of the gRPC port")
        s.add_argument("--rounds", type=int, default=8, help="last rounds shown")
        s.add_argument("--tls_ca", help="PEM CA to trust (TLS)")
        s.add_argument("--tls_cert", help="PEM client certificate (mutual TLS)")
        s.add_argument("--tls_key", help="PEM client key (mutual TLS)")
        if name == "watch":
            s.add_argument("--every", type=float, default=2.0, help="seconds between draws")
    m = sub.add_parser("model", help="download the current global model")
    m.add_argument("address", help="HOST:PORT of the dashboard's HTTP port")
    m.add_argument("out", help="where to write the .safetensors file")
    m.add_argument("--tls_ca", help="PEM CA to trust (a dashboard over HTTPS)")
    args = p.parse_args(argv)
    try:
        if args.command == "model":
            n = download_model(args.address, args.out, args.tls_ca)
            print(f"{args.out}: {n:,} bytes")
            return 0
        tls = None
        if args.tls_ca or args.tls_cert:
            tls = TlsConfig(root_ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
        if args.command == "status":
            print(render_status(get_status(args.address, tls), args.rounds))
            return 0
        _, pb2, _ = proto.modules()
        while True:
            status = get_status(args.address, tls)
            sys.stdout.write("\x1b[H\x1b[2J" + render_status(status, args.rounds) + "\n")
            sys.stdout.flush()
            if status.phase == pb2.PHASE_DONE:
                return 0
            time.sleep(args.every)
    except FedlearnError as e:
        print(f"fedlearn: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
