"""circuitlab serve: the local web explorer (FastAPI on uvicorn)."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("local web explorer: attention of every head, logit lens, attribution, input attribution, tuned lens, "
        "steering, attribution graphs (/graphs), and the hand-built adder")
EXAMPLE = "circuitlab serve --checkpoint runs/demo/2l --port 8000   (then open http://127.0.0.1:8000)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", "--model", dest="checkpoint", default=None,
                   help="a run or checkpoint directory for the explorer page (without one, only the adder "
                        "page works)")
    p.add_argument("--dictionary", action="append", default=[], metavar="DIR",
                   help="a sparse dictionary for the checkpoint's model (ours, SAELens, Gemma Scope 1/2, Llama Scope, "
                        "a circuit-tracer layer_N.safetensors), for the feature browser at "
                        "/features (repeat for several; its dashboards/ subfolder is used when present)")
    p.add_argument("--lens", default=None, metavar="DIR",
                   help="a tuned lens trained on the checkpoint's model (`circuitlab lens train`) for the /inputs page "
                        "(default: <checkpoint>/tuned_lens when there is one)")
    p.add_argument("--circuit", action="append", default=[], metavar="DIR",
                   help="a folder written by `circuitlab circuit` to show at /circuits (repeat for several); with "
                        "--checkpoint the page also runs discovery on the model")
    p.add_argument("--graphs", default=None, metavar="DIR",
                   help="runs folder whose `circuitlab graph` outputs /graphs lists (default: runs/ when it exists)")
    p.add_argument("--transcoders", default=None, metavar="DIR",
                   help="the model's transcoders: interventions, feature cards and new graphs on /graphs")
    p.add_argument("--transcoder-set", default=None, metavar="NAME",
                   help="when --transcoders is a run holding several sets (clt-demo), the one to use (as circuitlab "
                        "graph --transcoder-set: clt-batchtopk or transcoders)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; anything else exposes the "
                        "explorer to your network)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-tokens", type=int, default=128,
                   help="longest prompt in tokens (default 128; also capped by the model's context)")
    p.add_argument("--max-prompt-chars", type=int, default=2000, help="longest prompt in characters (default 2000)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")


def check_port_free(host: str, port: int) -> None:
    """A CircuitlabError when host:port cannot be bound (in use, or not an address of this machine)."""
    import socket

    from circuitlab.errors import CircuitlabError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise CircuitlabError(f"cannot resolve --host {host!r}: {e}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            raise CircuitlabError(f"cannot listen on {host}:{port} ({e.strerror or e}); "
                                  "choose another --port") from None


def run(args: argparse.Namespace) -> int:
    import sys

    from circuitlab.errors import CircuitlabError
    from circuitlab.serve import create_app
    from circuitlab.serve.app import LOOPBACK_HOSTS
    from circuitlab.serve.pages import banner

    if not 0 < args.port < 65536:
        raise CircuitlabError(f"--port must be from 1 to 65535, got {args.port}")
    loopback = args.host in LOOPBACK_HOSTS
    given = {"dictionaries": args.dictionary, "lens": args.lens, "circuits": args.circuit,
             "graphs": args.graphs if args.graphs is not None else ("runs" if Path("runs").is_dir() else None),
             "transcoders": args.transcoders, "transcoder_set": args.transcoder_set}
    # The model is loaded (and checked) before the server starts: a bad checkpoint is a one-line error.
    app = create_app(args.checkpoint, max_prompt_chars=args.max_prompt_chars, max_tokens=args.max_tokens,
                     allowed_hosts=list(LOOPBACK_HOSTS) if loopback else None, device=args.device, **given)
    check_port_free(args.host, args.port)
    import uvicorn

    shown = f"[{args.host}]" if ":" in args.host else args.host
    pages = banner({**given, "run_dir": args.checkpoint})
    print(f"circuitlab explorer: http://{shown}:{args.port}/   ({pages}; Ctrl-C stops)")
    if not args.checkpoint:
        print("no --checkpoint: the explorer page has no model; the adder page works", file=sys.stderr)
    if not loopback:
        print(f"warning: bound to {args.host}: anyone who can reach this machine can use the explorer",
              file=sys.stderr)
    class Server(uvicorn.Server):
        """uvicorn's server, remembering the signal that stopped it (it shuts down, then passes the signal on)."""

        stopped_by: int | None = None

        def handle_exit(self, sig, frame) -> None:
            self.stopped_by = sig
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", server_header=False))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if server.stopped_by is None:
        return 0
    from circuitlab.errors import command_line
    from circuitlab.training.interrupts import note_stop

    note_stop(server.stopped_by)   # the exit status and the word (interrupted / terminated) follow the signal
    again = command_line()
    raise KeyboardInterrupt(f"the explorer stopped{f'; start it again with: {again}' if again else ''}")
